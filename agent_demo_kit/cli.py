"""The command line around the loop: flags and help, preparing a run (or a resume),
running it, and printing the outcome."""
import argparse
import contextlib
import os
import signal
import stat
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import prompts
from agent_demo_kit import __version__
from agent_demo_kit.endings import ConfigError, Interrupted, OutputClosed, RunResult, SigTerm, Terminated
from agent_demo_kit.settings import DEFAULT_MODEL, DEFAULT_URL, MODES, Settings, flag_parser, read_environment, secrets_of
from agent_demo_kit.job import Job, continue_command, prepare
from agent_demo_kit.approval import terminal_approver
from agent_demo_kit.terminal import Redactor, SafeStream, on_terminal, protected, stray_prints_to_stderr
from agent_demo_kit import log_folder
from tools import REGISTRY

HELP_START = """Run a task with a tool-calling LLM agent loop over any OpenAI-compatible endpoint.

examples:
  agent-demo "compute (12 + 500) * 3 and look up order A1002"
  cat report.txt | agent-demo "summarize this"        # piped text is the material
  agent-demo -m qwen2.5:7b --url http://localhost:11434/v1 --approve "look up order A1002"

stdout holds only the answer; the round-by-round trace goes to stderr."""

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
  AGENT_CHECK             default for --check (none)
  AGENT_CHECK_ATTEMPTS    default for --check-attempts (3)
  AGENT_MAX_RETRY_WAIT    the longest wait before a retry, in seconds (30)
  AGENT_DEMO_LOG_DIR      the run log folder (else $XDG_STATE_HOME/agent-demo/runs,
                          else ~/.local/state/agent-demo/runs)
  NO_COLOR                set (not empty): no colour in the trace, even on a terminal
  AGENT_DEBUG=1           same as --debug

exit codes: 0 finished; 1 not completed (gave up, --check rejected the answers,
round limit, token budget, stuck, or an internal error); 2 usage or configuration
error; 3 endpoint failed; 130 interrupted (Ctrl-C); 143 terminated (SIGTERM)"""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error under --json still prints the one JSON object on stdout."""

    json_output = False

    def error(self, message: str):
        if self.json_output:
            with contextlib.suppress(OutputClosed):  # the usage error and its exit code stand
                sys.stdout.write_json(json_object(RunResult(ConfigError(f"usage: {message}"))))
        self.exit(2, f"agent-demo: error: {message} (see agent-demo --help)\n")  # one line, not the usage block


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
        prog="agent-demo", usage="agent-demo [options] TASK...   (or -: the task from stdin)",
        description=HELP_START, epilog=ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
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
                        help=f"expose only these tools (available: {', '.join(REGISTRY)});"
                             " finish, fail, recall and note always")
    parser.add_argument("--tools-file", action="append", metavar="PATH",
                        help="make each public function in the Python file PATH a tool (repeatable)")
    parser.add_argument("--mcp", action="append", metavar="SERVER",
                        help="add the tools of an MCP server: a command run over stdio, or an http(s):// URL"
                             " (repeatable; needs pip install 'agent-demo[mcp]')")
    parser.add_argument("--mcp-config", metavar="FILE",
                        help='add the tools of each server in an {"mcpServers": {...}} JSON file')
    parser.add_argument("--tool-timeout", type=flag_type("tool_timeout"), metavar="SECONDS",
                        help="answer a tool call still running after SECONDS as an error (default 60)")
    parser.add_argument("--check", metavar="COMMAND",
                        help="accept a finish only when COMMAND exits 0, with the answer on its stdin and in"
                             " AGENT_ANSWER, the task in AGENT_TASK; otherwise its output goes back to the model")
    parser.add_argument("--check-attempts", type=flag_type("check_attempts"), metavar="N",
                        help="end the run as failed after N answers --check rejected (default 3)")
    parser.add_argument("--approve", action="store_true",
                        help="ask y/N/a on the terminal before each tool call (a: yes to that tool from then on)")
    parser.add_argument("--yes", action="store_true",
                        help="run every call without asking, even tools marked as having side effects")
    parser.add_argument("--timeout", type=flag_type("timeout"), metavar="SECONDS",
                        help="the longest silence from the endpoint: no first byte, or no next piece of a"
                             " reply (default 30)")
    parser.add_argument("--retries", type=flag_type("retries"), metavar="N",
                        help="retries on 429, 5xx, dropped connections and timeouts (default 3)")
    parser.add_argument("--trace", metavar="FILE",
                        help="append the JSON Lines record of the run to FILE instead of the run log folder")
    parser.add_argument("--no-log", action="store_true", help="keep no record of the run")
    parser.add_argument("--resume", metavar="RUN", nargs="?", const="",
                        help="continue an unfinished run where it stopped, appending to its trace; RUN is its id"
                             " as --runs shows it (or the start of it), its file name, or a path; without RUN,"
                             " the most recent unfinished run")
    parser.add_argument("-c", dest="continue_run", action="store_const", const="",
                        help="follow up on the most recent run: the task words (or stdin) are the follow-up,"
                             " asked with the run's rounds in context (--continue without RUN)")
    parser.add_argument("--continue", dest="continue_run", metavar="RUN", nargs="?", const="",
                        help='--continue RUN "follow-up": follow up on the run RUN (named as for --resume),'
                             ' finished or not, appending to its trace; it gets --max-rounds new rounds.'
                             ' --continue "follow-up" alone: the most recent run')
    parser.add_argument("--runs", action="store_true",
                        help="list the recent runs in the run log folder (id, when, status, rounds, tokens, task)"
                             " and exit")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with status, result, rounds, usage, calls (and error), and the"
                             " run's run_id and trace file; the trace goes to stderr")
    parser.add_argument("-q", "--quiet", action="store_true", help="no round-by-round trace; only the result")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                        help="ask for the reply as server-sent events (default: on; an endpoint that refuses"
                             " it is asked without it)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("-V", "--version", action="version", version=f"agent-demo {__version__}")
    return parser


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    """The flags, with the task (and what stdin brings) joined into one string; a usage error exits 2."""
    parser = build_parser()
    parser.json_output = "--json" in (sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    words, args.material = " ".join(args.task).strip(), ""
    if args.continue_run and not words and not log_folder.looks_like_a_run(args.continue_run):
        words, args.continue_run = args.continue_run.strip(), ""  # --continue "follow-up" alone
    if args.continue_run is not None and args.resume is not None:
        parser.error("--continue and --resume cannot go together: a follow-up starts from where the run stands")
    if args.resume is None and not args.runs:
        if words == "-":
            if on_terminal(sys.stdin):
                print("agent-demo: reading the task from the terminal; end it with Ctrl-D", file=sys.stderr)
            words = read_stdin().strip()
        elif not words:
            words = read_stdin().strip() if stdin_is_piped(any_kind=True) else ""
        elif stdin_is_piped():
            args.material = read_stdin()
        if not words and args.continue_run is not None:
            parser.error('the follow-up is empty: say what comes next (agent-demo -c "...", or pipe it in)')
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


def show_traceback(outcome: RunResult) -> None:
    """For --debug: the traceback of the error that ended the run, through the redacting stderr."""
    error = outcome.ending
    if outcome.status == "error" and str(error):
        print("".join(traceback.format_exception(type(error), error, error.__traceback__)), file=sys.stderr, end="")


def report(outcome: RunResult, args: argparse.Namespace, answer: SafeStream, trace_path: Optional[str] = None,
           settings: Optional[Settings] = None) -> int:
    """Print the outcome the way the flags ask for (the answer, or the --json object, on `answer`;
    the rest on stderr, with how to continue a run cut short); returns the exit code."""
    if args.json:
        answer.write_json(json_object(outcome, trace_path))
    elif outcome.status == "finished" and isinstance(outcome.result, str):
        print(outcome.result, file=answer)
    elif outcome.status == "finished":
        answer.write_json(outcome.result, indent=2)
    refused = sum(call["result"].get("error") == prompts.NO_TERMINAL for call in outcome.calls)
    if refused:  # even under --quiet: the run may have "finished" without doing what was asked
        print(f"agent-demo: {refused} tool call(s) refused: they need approval and there was no terminal"
              " to ask; --yes runs them", file=sys.stderr)
    if outcome.status == "error":
        print(f"agent-demo: error: {outcome.error}", file=sys.stderr)
    elif outcome.status != "finished" and args.quiet:  # otherwise the trace ended with it
        lines = [f"agent-demo: {outcome.summary()}", *(f"  {line}" for line in outcome.progress)]
        print("\n".join(lines), file=sys.stderr)
    if trace_path and log_folder.can_resume(outcome) and not outcome.key_refused:  # a refused key: fix it first
        print(f"agent-demo: to continue: {continue_command(trace_path, outcome, settings, args)}", file=sys.stderr)
    return outcome.exit_code


def json_object(outcome: RunResult, trace_path: Optional[str] = None) -> dict:
    """The --json object: the outcome, and the run's id and trace file (null when nothing was recorded)."""
    return {**outcome.to_json(), "run_id": log_folder.run_id(Path(trace_path)) if trace_path else None,
            "trace": os.path.abspath(trace_path) if trace_path else None}


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
        except OutputClosed:  # --help or --version into a reader that went away (| head): it took what it wanted
            return 0
        redactor.add(*secrets_of(environment, args.url))
        if unreadable or args.runs:
            try:
                return report(RunResult(unreadable), args, answer) if unreadable else log_folder.list_runs(environment)
            except OutputClosed:  # agent-demo --runs | head -1
                return unreadable.exit_code if unreadable else 0
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
    with ending_on_sigterm():
        try:
            job = prepare(args, environment, redactor)
        except ConfigError as error:
            return RunResult(error), None
        except KeyboardInterrupt:
            return RunResult(Interrupted()), None
        except SigTerm:
            return RunResult(Terminated("terminated by SIGTERM")), None
        with job.closing:  # the trace file, the tools worker, the MCP servers: closed whatever happens
            return run_job(job, redactor), job


def run_job(job: Job, redactor: Redactor) -> RunResult:
    """Run the prepared job: its trace is open, its tools are ready."""
    log = job.log
    log.start_fields, log.start_notes, log.follow_up = job.start_fields, job.notes, job.follow_up
    from agent_demo import Agent
    from agent_demo_kit.client import ModelClient  # requests: imported only when a run starts
    client = ModelClient(job.settings, log, job.form)
    try:
        with stray_prints_to_stderr():
            agent = Agent(job.settings, client, job.registry, log, terminal_approver(redactor))
            return agent.run(job.task, job.history, job.unfinished)
    finally:
        client.close()
