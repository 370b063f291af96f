"""--check: a command of the user's that must accept the answer before a finish is accepted.

The answer goes to its stdin and to AGENT_ANSWER, the task to AGENT_TASK. A plain command
is split into words as a shell would split them and run directly; one that uses the shell's
own syntax (a pipe, a redirection, a $VARIABLE, a wildcard, `&&`) runs under /bin/sh -c,
the rule make uses for its recipes. The answer never becomes part of the command line.
"""
import os
import shlex
import shutil
import signal
import subprocess
import time
from typing import List, Optional

from agent_demo_kit.endings import ConfigError
from prompts import clip

SHELL_SYNTAX = set("|&;<>()$`*?[]{}~\n")
SHELL_WORDS = {"!", "if", "for", "while", "until", "case", "cd", "export", "set", "exec", "eval", ".", "source",
               "exit"}  # keywords and builtins that are no program of their own
MAX_OUTPUT = 100_000  # characters of the check's output kept in the trace
MAX_VARIABLE = 100_000  # characters of AGENT_ANSWER and AGENT_TASK; stdin always has the whole answer


def check_command(command: str) -> List[str]:
    """How the check is started: its words, or /bin/sh -c and the command; ConfigError if it cannot start."""
    if not command.strip():
        raise ConfigError("--check is empty: give the command that accepts or rejects the answer")
    try:
        words = shlex.split(command)
    except ValueError as error:  # "No closing quotation"
        words = []
        if not SHELL_SYNTAX & set(command):
            raise ConfigError(f"--check cannot be read: {error}") from None
    if SHELL_SYNTAX & set(command) or words[0] in SHELL_WORDS or "=" in words[0]:
        shell = ["/bin/sh", "-c", command]
        syntax = subprocess.run(["/bin/sh", "-n", "-c", command], capture_output=True, text=True, errors="replace")
        if syntax.returncode:
            said = (syntax.stderr.strip().splitlines() or ["a syntax error"])[-1]
            raise ConfigError(f"--check cannot be read by /bin/sh: {clip(said, 200)}")
        return shell
    if shutil.which(words[0]) is None:
        raise ConfigError(f"--check cannot start {words[0]!r}: no such program, or it is not executable")
    return words


def run_check(argv: List[str], command: str, answer: str, task: str, timeout: float) -> dict:
    """Run the check on one answer: {"command", "exit_code", "output", "ms"}; exit_code is None when it
    did not finish within `timeout` seconds (it is then stopped, with whatever it started)."""
    environment = {**os.environ, "AGENT_ANSWER": _variable(answer), "AGENT_TASK": _variable(task)}
    started = time.monotonic()
    try:  # its own process group, so a timeout or Ctrl-C stops what it started too
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=environment, start_new_session=True)
    except OSError as error:
        raise ConfigError(f"--check cannot start: {error.strerror or error}") from None
    code: Optional[int]
    try:
        output, _ = process.communicate(answer.encode("utf-8", "replace"), timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        _stop(process)
        output, _ = process.communicate()
        code = None
    except BaseException:  # Ctrl-C, SIGTERM: leave nothing running
        _stop(process)
        process.wait()
        raise
    text = clip(output.decode("utf-8", "replace"), MAX_OUTPUT)
    return {"command": command, "exit_code": code, "output": text, "ms": round((time.monotonic() - started) * 1000)}


def _variable(text: str) -> str:
    """text as an environment variable takes it: no NUL, valid UTF-8, not beyond what execve takes."""
    return clip(text.encode("utf-8", "replace").decode("utf-8").replace("\0", ""), MAX_VARIABLE)


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass
