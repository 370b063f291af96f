"""The command line around the loop: flags and help, preparing a run (or a resume),
the approval question, and printing the outcome."""
import argparse
import contextlib
import json
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import prompts
from endings import ConfigError, RunResult
from output import Redactor, SafeStream
from records import Round
from runlog import RunLog, load_trace
from settings import DEFAULT_MODEL, DEFAULT_URL, MODES, Settings, load_settings
from tools import CONTROL_ACTIONS, REGISTRY, Tool

ENVIRONMENT_HELP = f"""environment (also read from ./.env; the real environment wins):
  LLM_API_KEY             bearer key; optional for local servers (no Authorization header then)
  LLM_API_URL             chat-completions URL or base URL ending in /v1 (default {DEFAULT_URL})
  LLM_MODEL               model name (default {DEFAULT_MODEL})
  AGENT_MAX_ROUNDS        default for --max-rounds (6)
  AGENT_MAX_TOKENS        default for --max-tokens, the run's token budget (no cap)
  AGENT_MAX_REPLY_TOKENS  default for --max-reply-tokens (4096; 0 sends none)
  AGENT_MAX_CONTEXT       default for --max-context (24000)
  AGENT_MAX_RESULT_CHARS  a longer tool result is cut to head and tail (4000)
  AGENT_KEEP_RECENT       rounds kept verbatim when older ones are folded (4)
  AGENT_MODE              default for --mode (json)
  AGENT_MAX_CALLS         default for --max-calls (8)
  AGENT_RETRIES           default for --retries (3)
  AGENT_DEBUG=1           same as --debug

exit codes: 0 finished; 1 not completed (gave up, round limit, token budget,
stuck); 2 usage or configuration error; 3 endpoint failed; 130 interrupted"""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error under --json still prints the one JSON object on stdout."""

    json_output = False

    def error(self, message: str):
        if self.json_output:
            print(json.dumps(RunResult(ConfigError(f"usage: {message}")).to_json()))
        super().error(message)  # usage and the message on stderr, exit 2


def build_parser() -> Parser:
    parser = Parser(
        prog="agent-demo", description="Run a task with a tool-calling LLM agent loop.",
        epilog=ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", nargs="*", help='what to do, e.g. "compute (12 + 500) * 3"')
    parser.add_argument("--max-rounds", type=int, metavar="N",
                        help="model requests at most, across resumes (default 6)")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help="token budget of the whole run: stop before the next request once the run has used"
                             " N tokens (default: no cap)")
    parser.add_argument("--max-reply-tokens", type=int, metavar="N",
                        help="cap on each reply, sent to the endpoint as max_tokens (default 4096; 0 sends none)")
    parser.add_argument("--max-context", type=int, metavar="CHARS",
                        help="fold the oldest rounds into a digest to keep each request under CHARS (default 24000)")
    parser.add_argument("--mode", choices=MODES,
                        help="how actions are asked for: json in the text, json constrained by a schema,"
                             " or native tool calls (default json)")
    parser.add_argument("--max-calls", type=int, metavar="N", help="actions run per reply at most (default 8)")
    parser.add_argument("--tools", metavar="NAME,NAME",
                        help=f"expose only these tools (available: {', '.join(REGISTRY)}); finish and fail always")
    parser.add_argument("--approve", action="store_true", help="ask y/N on the terminal before each tool call")
    parser.add_argument("--yes", action="store_true",
                        help="run every call without asking, even tools marked as having side effects")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="per model request (default 30)")
    parser.add_argument("--retries", type=int, metavar="N",
                        help="retries on 429, 5xx, dropped connections and timeouts (default 3)")
    parser.add_argument("--trace", metavar="FILE", help="append a JSON Lines record of the run to FILE")
    parser.add_argument("--resume", metavar="TRACE",
                        help="continue the unfinished run recorded in TRACE, appending to it")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with status, result, rounds, usage, calls (and error);"
                             " the trace goes to stderr")
    parser.add_argument("--quiet", action="store_true", help="no round-by-round trace; only the result")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    """The flags, with the task joined into one string; a usage error exits 2."""
    parser = build_parser()
    parser.json_output = "--json" in (sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.task = " ".join(args.task).strip()
    if not args.task and not args.resume:
        parser.error("the task is empty: say what the agent should do")
    return args


@contextlib.contextmanager
def protected_output(redactor: Redactor) -> Iterator[None]:
    """stdout and stderr through the redacting writer for as long as the run lasts."""
    plain = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(sys.stdout, redactor), SafeStream(sys.stderr, redactor)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = plain


@dataclass
class Job:
    """A run ready to start: its settings, tools and task, and the rounds already done if it resumes."""

    settings: Settings
    registry: Dict[str, Tool]
    task: str
    history: List[Round]
    trace_path: Optional[str]


def allowed_tools(names: Optional[str]) -> Dict[str, Tool]:
    """The registry cut down to --tools NAME,NAME; an unknown name is a usage error."""
    if names is None:
        return REGISTRY
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in REGISTRY and name not in CONTROL_ACTIONS]
    if unknown:
        raise ConfigError(f"--tools: unknown tool {', '.join(unknown)} (available: {', '.join(REGISTRY)})")
    return {name: tool for name, tool in REGISTRY.items() if name in wanted}


def prepare(args: argparse.Namespace, environment: Dict[str, str]) -> Job:
    """Settings, the tools, the task, the rounds already done and the trace path, or ConfigError."""
    settings, registry = load_settings(args, environment), allowed_tools(args.tools)
    if not args.resume:
        return Job(settings, registry, args.task, [], args.trace)
    if args.task:
        raise ConfigError("--resume continues the task recorded in the trace; give no task with it")
    if args.trace and os.path.abspath(args.trace) != os.path.abspath(args.resume):
        raise ConfigError("--resume appends to its own trace file; --trace cannot name another one")
    try:
        start, rounds = load_trace(args.resume)
    except ValueError as error:
        raise ConfigError(str(error)) from None

    # The run's own settings hold across resumes unless the user gives them again.
    def recorded(flag: Any, variable: str, key: str, valid: Callable[[Any], bool]) -> bool:
        return flag is None and not environment.get(variable) and valid(start.get(key))
    whole = lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 1  # noqa: E731
    for key, flag, variable in [("max_rounds", args.max_rounds, "AGENT_MAX_ROUNDS"),
                                ("max_tokens", args.max_tokens, "AGENT_MAX_TOKENS"),
                                ("max_calls", args.max_calls, "AGENT_MAX_CALLS")]:
        if recorded(flag, variable, key, whole):
            setattr(settings, key, start[key])
    if recorded(args.max_reply_tokens, "AGENT_MAX_REPLY_TOKENS", "max_reply_tokens",
                lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        settings.max_reply_tokens = start["max_reply_tokens"]
    if recorded(args.mode, "AGENT_MODE", "mode", lambda mode: mode in MODES):
        settings.mode = start["mode"]
        if start.get("schema_variant") in prompts.SCHEMA_VARIANTS:  # the response_format that worked
            settings.schema_variant = start["schema_variant"]
    if recorded(args.tools, "", "tools", lambda names: isinstance(names, list)):
        registry = {name: tool for name, tool in REGISTRY.items() if name in start["tools"]}
    settings.approve = settings.approve or start.get("approve") is True  # only --yes lifts it on resume
    return Job(settings, registry, start["task"], rounds, args.resume)


def open_log(args: argparse.Namespace, trace_path: Optional[str], redactor: Redactor) -> RunLog:
    """The run log: the human trace on stdout (stderr under --json, none under --quiet) and the trace file."""
    human = None if args.quiet else (sys.stderr if args.json else sys.stdout)
    try:
        return RunLog(human, trace_path, redactor)
    except OSError as error:
        raise ConfigError(f"cannot open the trace file: {error}") from None


def terminal_approver(redactor: Redactor) -> Optional[Callable[[dict], bool]]:
    """Ask y/N about each call on the terminal the user types into; None when stdin is no terminal."""
    if sys.stdin is None or not sys.stdin.isatty():
        return None

    def approve(call: dict) -> bool:
        try:  # the terminal itself, so the question shows even with stdout and stderr redirected
            terminal = SafeStream(open(os.ttyname(sys.stdin.fileno()), "w", encoding="utf-8"), redactor)
        except OSError:
            terminal = sys.stderr
        terminal.write(f"approve {call['tool']} {prompts.to_json(call['args'])}? [y/N] ")
        terminal.flush()
        answer = sys.stdin.readline()
        if not answer:  # Ctrl-D: end the line the question left open
            terminal.write("\n")
        if terminal is not sys.stderr:
            terminal.close()
        return answer.strip().lower() in ("y", "yes")
    return approve


def show_traceback(outcome: RunResult) -> None:
    """For --debug: the traceback of the error that ended the run, through the redacting stderr."""
    error = outcome.ending
    if outcome.status == "error" and str(error):
        print("".join(traceback.format_exception(type(error), error, error.__traceback__)), file=sys.stderr, end="")


def report(outcome: RunResult, args: argparse.Namespace) -> int:
    """Print the outcome the way the flags ask for and return its exit code."""
    if args.json:
        print(json.dumps(outcome.to_json(), ensure_ascii=False))
    elif outcome.status == "finished":
        print(display(outcome.result))
    if outcome.status == "error":
        print(f"agent-demo: error: {outcome.error}", file=sys.stderr)
    elif outcome.status != "finished" and args.quiet:  # otherwise the trace ended with it
        lines = [f"agent-demo: {outcome.summary()}", *(f"  {line}" for line in outcome.progress)]
        print("\n".join(lines), file=sys.stderr)
    return outcome.exit_code


def display(value: Any) -> str:
    """A result as people read it: text as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)
