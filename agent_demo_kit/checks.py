"""--check, and a task line's own check with --task-checks: a command the answer must pass before a
finish is accepted. The answer goes to its stdin and to AGENT_ANSWER, the task to AGENT_TASK (and
a batch task's "expected" to AGENT_EXPECTED). A plain command is split into words as a shell would
split them and run directly; one that uses the shell's own syntax (a pipe, a redirection, a
$VARIABLE, a wildcard, `&&`) runs under /bin/sh -c, the rule make uses for its recipes. The answer
never becomes part of the command line. It runs in a session of its own, without any key, and is
stopped with everything it started when it is done, out of time, or the run is.

It imports prompts, records, endings and environment.
"""
import codecs
import contextlib
import os
import select
import selectors
import shlex
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Iterable, List, NamedTuple, Optional, Set, Tuple

from agent_demo_kit import prompts
from agent_demo_kit.endings import CheckFailed, ConfigError, Finished, Interrupted
from agent_demo_kit.environment import child_environment
from agent_demo_kit.limits import CHECK_OUTPUT_CHARS, CHECK_VARIABLE_CHARS, SNIPPET_CHARS, VALUE_SHOWN_CHARS
from agent_demo_kit.prompts import clip, clipped
from agent_demo_kit.records import Call, Round, answer_text, failure, success


SHELL_SYNTAX = set("|&;<>()$`*?[]{}~\n")


SHELL_WORDS = {"!", "if", "for", "while", "until", "case", "cd", "export", "set", "exec", "eval", ".", "source",
               "exit"}  # keywords and builtins that are no program of their own


class Check(NamedTuple):
    """A check an answer must pass: the command as given, how it is started, and how to name it."""

    command: str
    argv: List[str]
    named: str


def checks_for(command: Optional[str], named: str, task_check: Optional[Tuple[str, str]] = None) -> List[Check]:
    """The checks a finish must pass, each known to start: --check, then a task line's own check
    (its command, and how to name it), when the user said to run task files' checks. ConfigError if
    one cannot start."""
    given = [(command, named)] if command is not None else []
    given += [task_check] if task_check is not None else []
    return [Check(text, check_command(text, name), name) for text, name in given]


def check_command(command: str, named: str = "--check") -> List[str]:
    """How the check is started: its words, or /bin/sh -c and the command; ConfigError if it cannot start."""
    if not command.strip():
        raise ConfigError(f"{named} is empty: give the command that accepts or rejects the answer")
    try:
        words = shlex.split(command)
    except ValueError as error:  # "No closing quotation"
        words = []
        if not SHELL_SYNTAX & set(command):
            raise ConfigError(f"{named} cannot be read: {error}") from None
    if SHELL_SYNTAX & set(command) or words[0] in SHELL_WORDS or "=" in words[0]:
        shell = ["/bin/sh", "-c", command]
        syntax = subprocess.run(["/bin/sh", "-n", "-c", command], capture_output=True, text=True, errors="replace",
                                env=child_environment(os.environ))
        if syntax.returncode:
            said = (syntax.stderr.strip().splitlines() or ["a syntax error"])[-1]
            raise ConfigError(f"{named} cannot be read by /bin/sh: {clip(said, SNIPPET_CHARS)}")
        return shell
    if shutil.which(words[0]) is None:
        raise ConfigError(f"{named} cannot start {words[0]!r}: no such program, or it is not executable")
    return words


CHECK_DRAIN_SECONDS = 0.2  # after the check exits: for what it wrote last, not for what it left running


EXIT_POLL_SECONDS = 0.05


_running_checks: Set[subprocess.Popen] = set()  # what stop_checks ends when a batch stops at once


class Judge:
    """Whether a finish's answer is taken: it must fit the output type, then pass each check in turn
    (--check, then a task line's own). A rejected answer goes back to the model with why, until the
    run has had its --check-attempts."""

    def __init__(self, settings: Any, checks: List[Check], output: Any = None, expected: Optional[str] = None):
        """output: an output_types.OutputType, or None; expected: a batch task's answer (AGENT_EXPECTED)."""
        self.settings, self.checks, self.output, self.expected = settings, checks, output, expected

    def __call__(self, action: Any, answer: Any, task: str, rounds: List[Round], hooks: Any, stop: Any) -> Call:
        """The finish's call when the model must try again; Finished when it is taken, CheckFailed when
        the last attempt was rejected."""
        settings = self.settings
        answer, ran = self.output.checked(answer) if self.output else (answer, [])  # a misfit is not worth a check
        if not ran and not self.checks:  # it fits, and nothing else checks it
            raise Finished(result=answer).by(Call(action.tool, action.args, success(answer)))
        for each in [] if ran else self.checks:
            with hooks.working(f"check running ({clip(each.command, VALUE_SHOWN_CHARS)})"):
                ran.append(run_check(each.argv, each.command, answer_text(answer), task, settings.tool_timeout,
                                     each.named, expected=self.expected, stop=stop,
                                     secrets=[key for key in (settings.api_key, settings.escalate_key) if key]))
            if ran[-1]["exit_code"] != 0:
                break
        check = {**ran[-1], "command": " && ".join(result["command"] for result in ran)}
        check = hooks.redact_values(check)  # it may print the environment: the key goes no further
        call = Call(action.tool, action.args, success(answer), check=check)
        if check["exit_code"] == 0:
            raise Finished(result=answer).by(call)
        rejected = [done.check for record in rounds for done in record.calls  # resumed runs' rounds too
                    if done.check and done.check.get("exit_code") != 0]
        left = settings.check_attempts - len(rejected) - 1
        call.result = failure(prompts.render_check_rejection(check, left, settings.tool_timeout))
        if left <= 0:
            raise CheckFailed(prompts.render_rejected([each["command"] for each in [*rejected, check]]),
                              result=check["output"]).by(call)
        return call


_checks_lock = threading.Lock()


def stop_checks() -> None:
    """End every check still running, with what it started: a batch that stops at once leaves none behind."""
    with _checks_lock:
        for process in list(_running_checks):
            _stop(process)


def run_check(argv: List[str], command: str, answer: str, task: str, timeout: float, named: str = "--check",
              expected: Optional[str] = None, stop: Optional[threading.Event] = None,
              secrets: Iterable[str] = ()) -> dict:
    """Run the check on one answer: {"command", "exit_code", "output", "ms"}; exit_code is None when it
    did not finish within `timeout` seconds. The check is over when its own process exits, whoever
    still holds its output pipe; then it is stopped, with whatever it started. It gets no key
    (secrets: the run's keys, wherever they came from)."""
    environment = {**child_environment(os.environ, secrets), "AGENT_ANSWER": _variable(answer),
                   "AGENT_TASK": _variable(task)}
    if expected is not None:  # a batch task's "expected"
        environment["AGENT_EXPECTED"] = _variable(expected)
    started = time.monotonic()
    try:  # its own process group, so a timeout or Ctrl-C stops what it started too
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=environment, start_new_session=True)
    except OSError as error:
        raise ConfigError(f"{named} cannot start: {error.strerror or error}") from None
    output = _KeptEnds(CHECK_OUTPUT_CHARS)
    with _checks_lock:
        _running_checks.add(process)
    try:
        code = _talk(process, answer.encode("utf-8", "replace"), output, started + timeout, stop)
    finally:  # done, out of time, Ctrl-C or a batch told to stop: leave nothing running
        with _checks_lock:
            _running_checks.discard(process)
        _stop(process)
        process.wait()
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
    return {"command": command, "exit_code": code, "output": output.text(),
            "ms": round((time.monotonic() - started) * 1000)}


def _talk(process: subprocess.Popen, answer: bytes, output: "_KeptEnds", deadline: float,
          stop: Optional[threading.Event] = None) -> Optional[int]:
    """Give the check its stdin and keep the ends of its output until it exits (its exit code) or the
    deadline passes (None); Interrupted once `stop` is set (a batch told to stop). Like
    Popen.communicate, but ended by the process, not by the pipe's end."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if answer:
            selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
        written, drain_until = 0, None
        while True:
            if stop is not None and stop.is_set():
                raise Interrupted()
            now = time.monotonic()
            if drain_until is None and process.poll() is not None:
                drain_until = now + CHECK_DRAIN_SECONDS
            if drain_until is not None and (now >= drain_until or not selector.get_map()):
                return process.returncode
            if now >= deadline:
                return None
            if not selector.get_map():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(min(deadline - now, 0.5))
                continue
            # a pipe says nothing of the process's exit: look again every EXIT_POLL_SECONDS
            for key, _ in selector.select(min(deadline, drain_until or now + EXIT_POLL_SECONDS) - now):
                if key.fileobj is process.stdout:
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        output.add(chunk)
                        continue
                else:
                    try:
                        written += os.write(key.fd, answer[written:written + select.PIPE_BUF])
                        if written < len(answer):
                            continue
                    except BrokenPipeError:  # the check does not read its stdin: that is its right
                        pass
                selector.unregister(key.fileobj)
                key.fileobj.close()


class _KeptEnds:
    """Text read in chunks, kept as clip would keep it, in memory bounded by `limit` whatever comes."""

    def __init__(self, limit: int):
        self.limit, self.head, self.tail, self.length = limit, "", "", 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, chunk: bytes) -> None:
        self._keep(self.decoder.decode(chunk))

    def _keep(self, text: str) -> None:
        self.length += len(text)
        room = self.limit - len(self.head)
        self.head, rest = self.head + text[:room], text[room:]
        if rest:
            self.tail = (self.tail + rest)[-self.limit:]

    def text(self) -> str:
        self._keep(self.decoder.decode(b"", final=True))  # a last character cut off: a replacement character
        self.decoder.reset()
        if self.length == len(self.head) + len(self.tail):
            return clip(self.head + self.tail, self.limit)
        head, tail = self.limit * 2 // 3, self.limit // 3
        return clipped(self.head[:head], self.tail[len(self.tail) - tail:], self.length - head - tail)


def _variable(text: str) -> str:
    """text as an environment variable takes it: no NUL, valid UTF-8, not beyond what execve takes."""
    return clip(text.encode("utf-8", "replace").decode("utf-8").replace("\0", ""), CHECK_VARIABLE_CHARS)


def _stop(process: subprocess.Popen) -> None:
    """End a check and everything it started (its process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass
