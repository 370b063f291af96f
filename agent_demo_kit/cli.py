"""The command line around the loop: flags and help, preparing a run (or a resume),
running it, and printing the outcome."""
import argparse
import contextlib
import json
import os
import shlex
import signal
import stat
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, TextIO

import prompts
from agent_demo_kit import __version__
from agent_demo_kit.endings import ConfigError, Interrupted, OutputClosed, RunResult, SigTerm, Terminated
from agent_demo_kit.settings import (DEFAULT_MODEL, DEFAULT_URL, MODES, Settings, chat_completions_url, display_url,
                                     flag_parser, given, load_settings, read_environment, secrets_of)
from agent_demo_kit.terminal import Redactor, protected, stray_prints_to_stderr, terminal_approver
from agent_demo_kit import log_folder
from agent_demo_kit.trace import Call, Round, RunLog, load_trace
from agent_demo_kit.tools_file import build_registry
from tools import REGISTRY, Tool

ENVIRONMENT_HELP = f"""environment (also read from ./.env; the real environment wins):
  LLM_API_KEY             bearer key; optional for local servers (no Authorization header then)
  LLM_API_URL             chat-completions URL or base URL ending in /v1 (default {DEFAULT_URL})
  LLM_MODEL               model name (default {DEFAULT_MODEL})
  OPENAI_API_KEY          read when LLM_API_KEY is unset
  OPENAI_BASE_URL         read when LLM_API_URL is unset
  AGENT_MAX_ROUNDS        default for --max-rounds (6)
  AGENT_MAX_TOKENS        default for --max-tokens, the run's token budget (no cap)
  AGENT_MAX_REPLY_TOKENS  default for --max-reply-tokens (4096; 0 sends none)
  AGENT_MAX_CONTEXT       default for --max-context (24000)
  AGENT_MAX_RESULT_CHARS  a longer tool result is cut to head and tail (4000)
  AGENT_KEEP_RECENT       rounds kept verbatim when older ones are folded (4)
  AGENT_MODE              default for --mode (json)
  AGENT_MAX_CALLS         default for --max-calls (8)
  AGENT_RETRIES           default for --retries (3)
  AGENT_TIMEOUT           default for --timeout (30)
  AGENT_TOOL_TIMEOUT      default for --tool-timeout (60)
  AGENT_MAX_RETRY_WAIT    the longest wait before a retry, in seconds (30)
  AGENT_DEMO_LOG_DIR      the run log folder (else $XDG_STATE_HOME/agent-demo/runs,
                          else ~/.local/state/agent-demo/runs)
  NO_COLOR                set (not empty): no colour in the trace, even on a terminal
  AGENT_DEBUG=1           same as --debug

exit codes: 0 finished; 1 not completed (gave up, round limit, token budget,
stuck, or an internal error); 2 usage or configuration error; 3 endpoint failed;
130 interrupted (Ctrl-C); 143 terminated (SIGTERM)"""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error under --json still prints the one JSON object on stdout."""

    json_output = False

    def error(self, message: str):
        if self.json_output:
            print(json.dumps(RunResult(ConfigError(f"usage: {message}")).to_json()))
        super().error(message)  # usage and the message on stderr, exit 2


def flag_type(name: str) -> Callable[[str], Any]:
    """The argparse type of a number flag: the same check as its environment variable."""
    parse = flag_parser(name)

    def checked(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return checked


def build_parser() -> Parser:
    parser = Parser(
        prog="agent-demo", description="Run a task with a tool-calling LLM agent loop.",
        epilog=ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", nargs="*", help='what to do, e.g. "compute (12 + 500) * 3"; "-" reads it from'
                        " stdin, and text piped to stdin beside a task is the material the task is about")
    parser.add_argument("-m", "--model", metavar="NAME", help=f"model name (LLM_MODEL; default {DEFAULT_MODEL})")
    parser.add_argument("--url", metavar="URL",
                        help="chat-completions URL or base URL ending in /v1 (LLM_API_URL, else OPENAI_BASE_URL)")
    parser.add_argument("--max-rounds", type=flag_type("max_rounds"), metavar="N",
                        help="model requests at most, across resumes (default 6)")
    parser.add_argument("--max-tokens", type=flag_type("max_tokens"), metavar="N",
                        help="token budget of the whole run: stop before the next request once the run has used"
                             " N tokens (default: no cap)")
    parser.add_argument("--max-reply-tokens", type=flag_type("max_reply_tokens"), metavar="N",
                        help="cap on each reply, sent to the endpoint as max_tokens (default 4096; 0 sends none)")
    parser.add_argument("--max-context", type=flag_type("max_context"), metavar="CHARS",
                        help="fold the oldest rounds into a digest to keep each request under CHARS (default 24000)")
    parser.add_argument("--mode", choices=MODES,
                        help="how actions are asked for: json in the text, json constrained by a schema,"
                             " or native tool calls (default json)")
    parser.add_argument("--max-calls", type=flag_type("max_calls"), metavar="N", help="actions run per reply at most (default 8)")
    parser.add_argument("--tools", metavar="NAME,NAME",
                        help=f"expose only these tools (available: {', '.join(REGISTRY)}); finish, fail and recall always")
    parser.add_argument("--tools-file", action="append", metavar="PATH",
                        help="make each public function in the Python file PATH a tool (repeatable)")
    parser.add_argument("--tool-timeout", type=flag_type("tool_timeout"), metavar="SECONDS",
                        help="answer a tool call still running after SECONDS as an error (default 60)")
    parser.add_argument("--approve", action="store_true", help="ask y/N on the terminal before each tool call")
    parser.add_argument("--yes", action="store_true",
                        help="run every call without asking, even tools marked as having side effects")
    parser.add_argument("--timeout", type=flag_type("timeout"), metavar="SECONDS",
                        help="each attempt of a model request, from sending it to the last byte of the reply"
                             " (default 30)")
    parser.add_argument("--retries", type=flag_type("retries"), metavar="N",
                        help="retries on 429, 5xx, dropped connections and timeouts (default 3)")
    parser.add_argument("--trace", metavar="FILE",
                        help="append the JSON Lines record of the run to FILE instead of the run log folder")
    parser.add_argument("--no-log", action="store_true", help="keep no record of the run")
    parser.add_argument("--resume", metavar="TRACE", nargs="?", const="",
                        help="continue the unfinished run recorded in TRACE, appending to it;"
                             " without TRACE, the most recent unfinished run in the run log folder")
    parser.add_argument("--runs", action="store_true", help="list the recent runs in the run log folder and exit")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with status, result, rounds, usage, calls (and error);"
                             " the trace goes to stderr")
    parser.add_argument("--quiet", action="store_true", help="no round-by-round trace; only the result")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                        help="ask for the reply as server-sent events and show it as it arrives"
                             " (default: on when the trace goes to a terminal)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"agent-demo {__version__}")
    return parser


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    """The flags, with the task (and what stdin brings) joined into one string; a usage error exits 2."""
    parser = build_parser()
    parser.json_output = "--json" in (sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    words = " ".join(args.task).strip()
    if args.resume is None and not args.runs:
        if words == "-":
            words = read_stdin().strip()
        elif not words:
            words = read_stdin().strip() if stdin_is_piped(any_kind=True) else ""
        elif stdin_is_piped():
            words = prompts.render_task_with_material(words, read_stdin())
        if not words:
            parser.error("the task is empty: say what the agent should do (or pipe it in: echo TASK | agent-demo)")
    args.task = words
    return args


def stdin_is_piped(any_kind: bool = False) -> bool:
    """Is stdin a pipe or a file (not a terminal)? any_kind: also /dev/null and other devices."""
    try:
        if sys.stdin is None or sys.stdin.isatty():
            return False
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # closed, or a test's stand-in
        return False
    return any_kind or stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def read_stdin() -> str:
    """All of stdin as text; bytes that are not UTF-8 become U+FFFD rather than an error."""
    try:
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    except (OSError, ValueError, AttributeError):
        return ""


@contextlib.contextmanager
def ending_on_sigterm() -> Iterator[None]:
    """While the run lasts, SIGTERM ends it like Ctrl-C does: the end record is written, exit 143."""
    def terminate(signum: int, frame: Any) -> None:
        raise SigTerm()
    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class Job:
    """A run ready to start: its settings, tools and task, the rounds already done if it resumes
    (and the calls with side effects started after them), and what it holds open."""

    settings: Settings
    registry: Dict[str, Tool]
    task: str
    history: List[Round]
    trace_path: Optional[str]
    log: RunLog
    form: Any = None  # what the endpoint took when the run was cut short (a resume starts there)
    unfinished: List[Call] = field(default_factory=list)
    opened: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # the trace file, the tools worker


def prepare(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor) -> Job:
    """Settings, the tools, the task, the rounds already done and the open trace, or ConfigError
    (with nothing left open)."""
    with contextlib.ExitStack() as opened:
        job = (prepare_resume if args.resume is not None else prepare_new)(args, environment, redactor, opened)
        job.opened = opened.pop_all()
        return job


def prepare_new(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor,
                opened: contextlib.ExitStack) -> Job:
    """A new run: its trace file is made (in the run log folder, unless --trace or --no-log) once its
    tools are known."""
    settings = load_settings(args, environment)
    settings.stream = wants_stream(args)
    trace = args.trace or (None if args.no_log else log_folder.new_log_file(environment))
    registry = build_registry(settings, args.tools, redactor.secrets, opened)
    log = open_log(args, trace, redactor, environment, opened)
    return Job(settings, registry, args.task, [], trace, log)


def prepare_resume(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor,
                   opened: contextlib.ExitStack) -> Job:
    """A run cut short, from its trace. The trace is locked before it is read, and shown before its
    tools files are imported: one resumer at a time, and the user sees where the run goes on."""
    if args.task:
        raise ConfigError("--resume continues the task recorded in the trace; give no task with it")
    path = args.resume or log_folder.latest_run(environment)
    if args.trace and os.path.abspath(args.trace) != os.path.abspath(path):
        raise ConfigError("--resume appends to its own trace file; --trace cannot name another one")
    if not os.path.lexists(path):
        raise ConfigError(f"cannot read the trace file {path}: no such file")
    log = open_log(args, path, redactor, environment, opened)
    try:
        start, rounds, unfinished = load_trace(log.recorded(), path)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if "***" in str(start.get("url")) and not given("url", args, environment):
        raise ConfigError("the run's URL held a password, which is not recorded: give it again with --url"
                          " or LLM_API_URL")
    settings = load_settings(args, environment, recorded=start)  # the run's own settings, unless given again
    settings.stream = wants_stream(args)
    log.say(f"resuming {path}\n  requests go to {display_url(chat_completions_url(settings.url))}\n  tools files:"
            f" {', '.join(settings.tools_files) or 'none'}")
    registry = build_registry(settings, args.tools, redactor.secrets, opened)
    if args.tools is None and isinstance(start.get("tools"), list):
        registry = {name: tool for name, tool in registry.items() if name in start["tools"]}
    return Job(settings, registry, start["task"], rounds, path, log, resumed_form(settings, start, rounds), unfinished)


def resumed_form(settings: Settings, start: dict, rounds: List[Round]) -> Any:
    """The request form a resumed run starts from: what the endpoint took before, for the mode in force."""
    from agent_demo_kit.client import RequestForm
    form = RequestForm(mode=settings.mode, stream=settings.stream and start.get("stream") is not False)
    if settings.mode == start.get("mode") and start.get("schema_variant") in prompts.SCHEMA_VARIANTS:
        form.schema_variant = start["schema_variant"]
    if start.get("reply_cap_field") in ("max_tokens", "max_completion_tokens"):
        form.reply_cap_field = start["reply_cap_field"]
    form.mode_worked = any(record.mode == form.mode for record in rounds)
    return form


def continue_command(trace_path: str, outcome: RunResult, settings: Optional[Settings],
                     args: argparse.Namespace) -> str:
    """The exact command that continues a run cut short: the model and URL given as flags are
    given again (the environment would win over the record), and a limit it reached is doubled,
    or the command would stop again at once."""
    program = sys.argv[0] or ""
    command = "agent-demo"
    if program.endswith(".py"):  # started as python agent_demo.py
        command = f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(program))}"
    command += f" --resume {shlex.quote(os.path.abspath(trace_path))}"
    if settings and args.model:
        command += f" -m {shlex.quote(settings.model)}"
    if settings and args.url and "***" not in display_url(settings.url):
        command += f" --url {shlex.quote(settings.url)}"
    if args.yes:  # never assumed on resume: said again, in the open
        command += " --yes"
    if settings and outcome.status == "max_rounds":
        command += f" --max-rounds {settings.max_rounds * 2}"
    if settings and outcome.status == "budget" and settings.max_tokens:
        command += f" --max-tokens {settings.max_tokens * 2}"
    return command


def on_terminal(stream: Any) -> bool:
    try:
        return bool(stream and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def open_log(args: argparse.Namespace, trace_path: Optional[str], redactor: Redactor,
             environment: Dict[str, str], opened: contextlib.ExitStack) -> RunLog:
    """The run log: the human trace on stderr (none under --quiet), so stdout holds only the answer;
    on a terminal it is live and in colour (never with NO_COLOR set). The trace file is locked and
    checked (private_files.py), and closed when `opened` closes."""
    human = None if args.quiet else sys.stderr
    terminal = on_terminal(human)
    try:
        log = RunLog(human, trace_path, redactor, colour=terminal and not environment.get("NO_COLOR"),
                     live=terminal)
    except OSError as error:
        raise ConfigError(f"cannot open the trace file: {error}") from None
    opened.callback(log.close)
    if trace_path and not args.trace and args.resume is None:  # a new run in the run log folder
        log_folder.prune(Path(trace_path).parent)
    return log


def show_traceback(outcome: RunResult) -> None:
    """For --debug: the traceback of the error that ended the run, through the redacting stderr."""
    error = outcome.ending
    if outcome.status == "error" and str(error):
        print("".join(traceback.format_exception(type(error), error, error.__traceback__)), file=sys.stderr, end="")


def wants_stream(args: argparse.Namespace) -> bool:
    """--stream, --no-stream, or on when the trace goes to a terminal."""
    return args.stream if args.stream is not None else not args.quiet and on_terminal(sys.stderr)


def report(outcome: RunResult, args: argparse.Namespace, answer: TextIO, trace_path: Optional[str] = None,
           settings: Optional[Settings] = None) -> int:
    """Print the outcome the way the flags ask for (the answer, or the --json object, on `answer`;
    the rest on stderr, with how to continue a run cut short); returns the exit code."""
    if args.json:
        print(json.dumps(outcome.to_json(), ensure_ascii=False), file=answer)
    elif outcome.status == "finished":
        print(display(outcome.result), file=answer)
    if outcome.status == "error":
        print(f"agent-demo: error: {outcome.error}", file=sys.stderr)
    elif outcome.status != "finished" and args.quiet:  # otherwise the trace ended with it
        lines = [f"agent-demo: {outcome.summary()}", *(f"  {line}" for line in outcome.progress)]
        print("\n".join(lines), file=sys.stderr)
    if trace_path and outcome.status in log_folder.RESUMABLE and outcome.exit_code != 2:  # 2: change flags first
        print(f"agent-demo: to continue: {continue_command(trace_path, outcome, settings, args)}", file=sys.stderr)
    return outcome.exit_code


def display(value: Any) -> str:
    """A result as people read it: text as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: read flags and settings, run, print the outcome; returns the exit code."""
    try:
        environment, unreadable = read_environment(), None
    except ConfigError as error:  # reported once the flags say how (--json or not)
        environment, unreadable = dict(os.environ), error
    redactor = Redactor(*secrets_of(environment))
    with protected(redactor) as answer:
        try:
            args = parse_args(argv)
        except KeyboardInterrupt:  # Ctrl-C while a piped task was being read
            return Interrupted.exit_code
        redactor.add(*secrets_of(environment, args.url))
        if unreadable or args.runs:
            try:
                return report(RunResult(unreadable), args, answer) if unreadable else log_folder.list_runs(environment)
            except ConfigError as error:  # the run log folder failed its checks
                return report(RunResult(error), args, answer)
        outcome, job = start(args, environment, redactor)
        try:
            if args.debug or environment.get("AGENT_DEBUG", "") not in ("", "0"):
                show_traceback(outcome)
            return report(outcome, args, answer, job and job.trace_path, job and job.settings)
        except OutputClosed:  # the reader took what it wanted (| head): the run's own ending stands
            return outcome.exit_code


def start(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor) -> tuple:
    """Prepare the run (or the resume) and run it; the outcome, and the job once the run started."""
    try:
        job = prepare(args, environment, redactor)
    except ConfigError as error:
        return RunResult(error), None
    except KeyboardInterrupt:
        return RunResult(Interrupted()), None
    except SigTerm:
        return RunResult(Terminated("terminated by SIGTERM")), None
    from agent_demo import Agent
    from agent_demo_kit.client import ModelClient  # requests: imported only when a run starts
    with job.opened:
        client = ModelClient(job.settings, job.log, job.form)
        try:
            with ending_on_sigterm(), stray_prints_to_stderr():
                agent = Agent(job.settings, client, job.registry, job.log, terminal_approver(redactor))
                outcome = agent.run(job.task, job.history, job.unfinished)
        finally:
            client.close()
    return outcome, job
