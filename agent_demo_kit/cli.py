"""The command line: flags and help (each setting's from its one definition in settings.py), the
task and what stdin brings, which run --resume and --continue take up, and the outcome printed.
The run itself is prepared and run by `agent_demo.prepare`, the entrance every caller shares."""
import argparse
import contextlib
import os
import shlex
import shutil
import signal
import stat
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import prompts
from agent_demo import Agent, Job, prepare, run_job
from agent_demo_kit import __version__, run_log, trace_file
from agent_demo_kit.actions import parse_actions
from agent_demo_kit.conversation import truncate_result
from agent_demo_kit.comparison import MOST_TRIES
from agent_demo_kit.scoring import MATCHES
from agent_demo_kit.records import Compaction, Reply, Round, total_usage
from agent_demo_kit.endings import (RUN_STATUSES, ConfigError, EndpointError, Finished, GaveUp, Interrupted,
                                    OutputClosed, RunResult, SigTerm, Terminated, ending_of)
from agent_demo_kit.settings import (DEFAULT_RETRY_ERRORS, HOSTED_PARALLEL, MODES, Settings, check_endpoint_settings,
                                     flag_name, load_settings, setting_fields, shown_default, pass_rate, shard_of_n,
                                     whole_number)
from agent_demo_kit.environment import Environment, read_environment, user_config_file
from agent_demo_kit.private_files import checked_folder
from agent_demo_kit.urls import display_url, secrets_of
from agent_demo_kit.terminal import SafeStream, Screen, inert, is_terminal, protected, stray_prints_to_stderr
from agent_demo_kit.approval import terminal_approver, terminal_confirm
from agent_demo_kit.redaction import Redactor
from tools import REGISTRY

HELP_START = """Run a task with a tool-calling LLM agent loop over any OpenAI-compatible endpoint.

examples:
  agent-demo "compute (12 + 500) * 3 and look up order A1002"
  cat report.txt | agent-demo "summarize this"        # piped text is the material
  agent-demo -m qwen2.5:7b --url http://localhost:11434/v1 --approve "look up order A1002"

stdout holds only the answer; the round-by-round trace goes to stderr."""

OTHER_VARIABLES = [  # read by the command line itself, not settings of a run
    ("AGENT_DEMO_LOG_DIR", "the run log folder (else $XDG_STATE_HOME/agent-demo/runs,\n"
                           + " " * 26 + "else ~/.local/state/agent-demo/runs)"),
    ("NO_COLOR", "set (not empty): no colour in the trace, even on a terminal"),
    ("AGENT_DEBUG=1", "same as --debug"),
]

EXIT_CODES = (f"exit codes: {Finished.exit_code} finished; {GaveUp.exit_code} not completed (gave up, --check rejected"
              f" the answers,\nround limit, token budget, stuck, or an internal error); {ConfigError.exit_code} usage"
              f" or configuration\nerror; {EndpointError.exit_code} endpoint failed; {Interrupted.exit_code} interrupted"
              f" (Ctrl-C); {Terminated.exit_code} terminated (SIGTERM)")


def environment_help() -> str:
    """The variables --help lists, each setting's from its definition."""
    lines = []
    for item in setting_fields():
        meta = item.metadata
        for index, variable in enumerate(meta["variables"]):
            if index:
                said = f"read when {meta['variables'][0]} is unset"
            elif meta["flag"] and item.name not in ("url", "model"):
                said = f"default for {meta['flag']} ({shown_default(item)})"
            elif item.name == "api_key":
                said = meta["help"]
            else:
                said = f"{meta['help']} ({'default ' if meta['flag'] else ''}{shown_default(item)})"
            lines.append(f"  {variable:<22}  {said}")
    lines += [f"  {variable:<22}  {said}" for variable, said in OTHER_VARIABLES]
    return "environment (also read from ./.env; the real environment wins):\n" + "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error under --json still prints the one JSON object on stdout."""

    json_output = False

    def error(self, message: str):
        if self.json_output:
            with contextlib.suppress(OutputClosed):  # the usage error and its exit code stand
                sys.stdout.write_json(json_object(RunResult(ConfigError(f"usage: {message}"))))
        self.exit(ConfigError.exit_code, f"agent-demo: error: {message} (see agent-demo --help)\n")  # one line, not the usage block


def at_most(parse: Callable[[str], int], most: int) -> Callable[[str], int]:
    """A whole number's check, with a most it may be."""
    def checked(text: str) -> int:
        value = parse(text)
        if value > most:
            raise ValueError(f"must be at most {most}, got {value}")
        return value
    checked.__name__ = parse.__name__
    return checked


def flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """The argparse type of a flag: the same check as its environment variable."""
    def checked(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    checked.__name__ = parse.__name__
    return checked


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for each setting that has one, with its help and default from the setting's definition."""
    for item in setting_fields():
        meta = item.metadata
        if not meta["flag"]:
            continue
        names = [meta["short"], meta["flag"]] if meta["short"] else [meta["flag"]]
        where = f"{' or '.join(meta['variables'])}; " if meta["variables"] else ""
        help_text = f"{meta['help']} ({where}default {shown_default(item)})"
        if item.name == "tool_names":
            help_text += f"; available: {', '.join(REGISTRY)}"
        options: Dict[str, Any] = {"dest": item.name, "help": help_text}
        default = item.default_factory()
        if item.name == "stream":
            options.update(action=argparse.BooleanOptionalAction, default=None)
        elif isinstance(default, bool):
            options.update(action="store_true", default=None)  # None: not given, so the environment or a resume holds
        elif isinstance(default, list):
            options.update(action="append", metavar=meta["metavar"])
        elif item.name == "mode":
            options.update(choices=MODES)
        else:
            options.update(metavar=meta["metavar"], **({"type": flag_type(meta["parse"])} if meta["parse"] else {}))
        parser.add_argument(*names, **options)


def build_parser() -> Parser:
    parser = Parser(
        prog="agent-demo", usage="agent-demo [options] TASK...   (or -: the task from stdin)",
        description=HELP_START, epilog=f"{environment_help()}\n\n{EXIT_CODES}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", nargs="*", help='what to do, e.g. "compute (12 + 500) * 3"; "-" reads it from'
                        " stdin, and text piped to stdin beside a task is the material the task is about")
    add_setting_flags(parser)
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
                        help="list the recent runs in the run log folder, a line a run (id, when, status, rounds,"
                             " tokens, the task and its answer or why it ended) and exit; with --json, as JSON")
    parser.add_argument("-n", dest="count", type=flag_type(whole_number(1)), metavar="N",
                        help="--runs: the N most recent (default 20)")
    parser.add_argument("--status", choices=RUN_STATUSES, metavar="STATUS",
                        help=f"--runs: only the runs that ended with STATUS ({', '.join(RUN_STATUSES)})")
    parser.add_argument("--show", metavar="RUN", nargs="?", const="",
                        help="print the run RUN (named as for --resume; without RUN the most recent) as its live"
                             " trace showed it, and its answer; with --json, its summary")
    batch = parser.add_argument_group("many tasks (docs/batch.md)")
    batch.add_argument("--batch", metavar="FILE",
                       help='run each task of FILE (JSON Lines: {"id", "task", "check", "expected"}, or a line of'
                            " plain text; - reads stdin) and write a trace per task, results.jsonl and"
                            " summary.json to --out; the same command again goes on where it stopped")
    batch.add_argument("--out", metavar="DIR", help="--batch: the output folder (default: FILE-results beside FILE)")
    batch.add_argument("--parallel", type=flag_type(whole_number(1)), metavar="N",
                       help=f"--batch: tasks at once, under one limit on requests in flight that a 429 lowers"
                            f" (default {HOSTED_PARALLEL}; 1 against a local server, which answers one request"
                            f" at a time)")
    batch.add_argument("--retry-errors", type=flag_type(whole_number(0)), metavar="N",
                       help=f"--batch: run a task that ended in an endpoint error again, from its trace, up to"
                            f" N times across reruns (default {DEFAULT_RETRY_ERRORS})")
    batch.add_argument("--rerun-failed", action="store_true",
                       help="--batch: start again every task that ended without finishing (failed, stuck, round"
                            " limit, budget); finished ones are kept")
    batch.add_argument("--shard", type=flag_type(shard_of_n), metavar="I/N",
                       help="--batch: run only the I-th (from 0) of N interleaved slices of FILE, into its own"
                            " results-IofN.jsonl (a Slurm array, a Kubernetes Indexed Job)")
    batch.add_argument("--pass-rate", type=flag_type(pass_rate), metavar="SHARE",
                       help="--batch: exit 0 when at least this share of the tasks finished (0.9 or 90%%;"
                            " default: all of them)")
    batch.add_argument("--match", choices=MATCHES, metavar="HOW",
                       help="--batch: how an answer is scored against a task's expected: exact, includes, number"
                            " or regex (a task line's \"match\" wins; default: case, quotes, surrounding"
                            " whitespace and final punctuation do not count, and a number is compared with the"
                            " answer's final number)")
    batch.add_argument("--task-checks", action="store_true",
                       help="--batch: run the check commands task lines name (shown before the first request), as"
                            " you, beside --check: both must pass (without it they are not run: a task file is"
                            " data)")
    batch.add_argument("--repeat", type=flag_type(at_most(whole_number(1), MOST_TRIES)), metavar="K",
                       help="--batch: run each task K times, each with its own trace; the summary gives pass@1,"
                            " pass^K and the spread (default 1)")
    batch.add_argument("--summary", metavar="DIR", nargs="*",
                       help="print the figures of the batch results in each DIR (shards merged; results of"
                            " different configurations side by side, with the tasks where they differ), or"
                            " without DIR of the runs in the run log folder, and exit; with --json, as JSON")
    batch.add_argument("--markdown", action="store_true",
                       help="--summary: print the figures as Markdown tables, to paste into a pull request")
    parser.add_argument("--config", action="store_true",
                        help="show each setting's value and where it came from (a flag, the shell, ./.env, your"
                             " settings file, the default), the key redacted, and exit; with --json, as JSON")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with status, result, rounds, usage, calls (and error), and the"
                             " run's run_id and trace file; the trace goes to stderr")
    parser.add_argument("-q", "--quiet", action="store_true", help="no round-by-round trace; only the result")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("-V", "--version", action="version", version=f"agent-demo {__version__}")
    return parser


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    """The flags, with the task (and what stdin brings) joined into one string; a usage error exits 2."""
    parser = build_parser()
    parser.json_output = "--json" in (sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    words, args.material = " ".join(args.task).strip(), ""
    if args.continue_run and not words and not run_log.looks_like_a_run(args.continue_run):
        words, args.continue_run = args.continue_run.strip(), ""  # --continue "follow-up" alone
    if args.continue_run is not None and args.resume is not None:
        parser.error("--continue and --resume cannot go together: a follow-up starts from where the run stands")
    if (args.count is not None or args.status is not None) and not args.runs:
        parser.error("-n and --status go with --runs")
    batch_only = [flag for flag, value in (("--out", args.out), ("--parallel", args.parallel),
                                           ("--retry-errors", args.retry_errors), ("--rerun-failed", args.rerun_failed),
                                           ("--shard", args.shard), ("--pass-rate", args.pass_rate),
                                           ("--match", args.match), ("--repeat", args.repeat),
                                           ("--task-checks", args.task_checks)) if value]
    if batch_only and args.batch is None:
        parser.error(f"{', '.join(batch_only)} go{'es' if len(batch_only) == 1 else ''} with --batch")
    if args.markdown and args.summary is None:
        parser.error("--markdown goes with --summary")
    args.command = shlex.join(["agent-demo", *(sys.argv[1:] if argv is None else argv)])  # the same command again
    if args.batch is not None:
        clash = [flag for flag, value in (("--resume", args.resume is not None),
                                          ("--continue", args.continue_run is not None), ("--runs", args.runs),
                                          ("--show", args.show is not None), ("--trace", args.trace),
                                          ("--no-log", args.no_log), ("--approve", args.approve),
                                          ("--summary", args.summary is not None), ("--config", args.config),
                                          ("a task", words)) if value]
        if clash:
            parser.error(f"--batch runs the tasks of its file, each with a trace in --out; {clash[0]} does not go"
                         f" with it" + (" (nobody is there to ask)" if clash[0] == "--approve" else ""))
        args.task = ""
        return args
    if args.summary is not None:  # the words are folders too: --summary --json DIR
        args.summary, args.task = args.summary + list(args.task), ""
        return args
    if args.resume is None and not args.runs and args.show is None and not args.config:
        if words == "-":
            if is_terminal(sys.stdin):
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
        if sys.stdin is None or is_terminal(sys.stdin):
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


# --- running ----------------------------------------------------------------------------------

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
        for note in getattr(environment, "notes", []):  # a ./.env passed by
            print(f"agent-demo: {note}", file=sys.stderr)
        if unreadable or args.runs or args.show is not None or args.config or args.summary is not None \
                or args.batch is not None:
            try:
                if args.config:  # what is wrong with a settings file is one of the things it shows
                    return show_config(args, environment, answer, unreadable)
                if unreadable:
                    return report(RunResult(unreadable), args, answer)
                if args.summary is not None:
                    return show_summary(args, environment, answer)
                if args.batch is not None:
                    return run_batch(args, environment, answer)
                return list_runs(args, environment, answer) if args.runs else show_run(args, environment, answer,
                                                                                         redactor)
            except OutputClosed:  # agent-demo --runs | head -1
                return unreadable.exit_code if unreadable else 0
            except ConfigError as error:  # the run log folder failed its checks, or no such run
                return report(RunResult(error), args, answer)
        outcome, agent = start(args, environment, redactor)
        try:
            if args.debug or environment.get("AGENT_DEBUG", "") not in ("", "0"):
                show_traceback(outcome)
            return report(outcome, args, answer, agent)
        except OutputClosed:  # the reader took what it wanted (| head): the run's own ending stands
            return outcome.exit_code


def start(args: argparse.Namespace, environment: Dict[str, str],
          redactor: Redactor) -> Tuple[RunResult, Optional[Agent]]:
    """Prepare the run (or the resume, or the follow-up) and run it; the outcome, and the agent
    that ran it once it started."""
    with ending_on_sigterm():
        try:
            job = prepare_job(args, environment, redactor)
        except ConfigError as error:
            return RunResult(error), None
        except KeyboardInterrupt:
            return RunResult(Interrupted()), None
        except SigTerm:
            return RunResult(Terminated("terminated by SIGTERM")), None
        with job, stray_prints_to_stderr():  # closed whatever happens: the trace, the tools worker, MCP
            return run_job(job)


def prepare_job(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor) -> Job:
    """The run the flags ask for, made ready: a new one, or one taken up again from its trace."""
    given = given_settings(args)
    follow_up = args.task if args.continue_run is not None else None
    resume = run_path(args, environment) if args.resume is not None or follow_up is not None else None
    return prepare(args.task, given=given, environment=environment, named=flag_name, material=args.material,
                   trace=args.trace or (None if args.no_log else True), resume=resume, follow_up=follow_up,
                   screen=screen(args, environment, redactor), redactor=redactor,
                   approver=terminal_approver(redactor), confirm=terminal_confirm(redactor))


def given_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The settings the flags give, by name (None: not given)."""
    return {item.name: getattr(args, item.name) for item in setting_fields() if item.metadata["flag"]}


def screen(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor) -> Optional[Screen]:
    """The human trace on stderr (none under --quiet), so stdout holds only the answer; on a terminal
    it is live and in colour (never with NO_COLOR set, nor on a dumb terminal, which takes no codes)."""
    if args.quiet:
        return None
    terminal = is_terminal(sys.stderr) and environment.get("TERM") != "dumb"
    return Screen(sys.stderr, colour=terminal and not environment.get("NO_COLOR"), live=terminal,
                  redactor=redactor)


def run_path(args: argparse.Namespace, environment: Dict[str, str]) -> str:
    """The trace file --resume or --continue is about; ConfigError if there is none to take up."""
    continuing = args.continue_run is not None
    flag = "--continue" if continuing else "--resume"
    if args.task and not continuing:
        raise ConfigError("--resume continues the task recorded in the trace; give no task with it")
    named = (args.continue_run if continuing else args.resume) or args.trace  # the run in --trace FILE
    path = run_log.pick_run(named or "", environment, flag)
    if args.trace and os.path.abspath(args.trace) != os.path.abspath(path) or continuing and args.no_log:
        raise ConfigError(f"{flag} appends to the run's own trace file; --trace cannot name another one,"
                          " nor --no-log keep none")
    if not os.path.lexists(path):
        raise ConfigError(f"cannot read the trace file {path}: no such file")
    return path


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


# --- what is printed --------------------------------------------------------------------------

def show_traceback(outcome: RunResult) -> None:
    """For --debug: the traceback of the error that ended the run, through the redacting stderr."""
    error = outcome.ending
    if outcome.status == "error" and str(error):
        print("".join(traceback.format_exception(type(error), error, error.__traceback__)), file=sys.stderr, end="")


def report(outcome: RunResult, args: argparse.Namespace, answer: SafeStream, agent: Optional[Agent] = None) -> int:
    """Print the outcome the way the flags ask for (the answer, or the --json object, on `answer`;
    the rest on stderr, with how to continue a run cut short); returns the exit code."""
    if args.json:
        answer.write_json(json_object(outcome))
    elif outcome.status == "finished" and isinstance(outcome.result, str):
        print(outcome.result, file=answer)
    elif outcome.status == "finished":
        answer.write_json(outcome.result, indent=2)
    say_material(outcome)
    refused = sum(call["result"].get("error") == prompts.NO_TERMINAL for call in outcome.calls)
    if refused:  # even under --quiet: the run may have "finished" without doing what was asked
        print(f"agent-demo: {refused} tool call(s) refused: they need approval and there was no terminal"
              " to ask; --yes runs them", file=sys.stderr)
    if outcome.status == "error":
        print(f"agent-demo: error: {outcome.error}", file=sys.stderr)
    elif outcome.status != "finished" and args.quiet:  # otherwise the trace ended with it
        lines = [f"agent-demo: {outcome.summary()}", *(f"  {line}" for line in outcome.progress)]
        print("\n".join(lines), file=sys.stderr)
    if outcome.trace and outcome.resumable:
        print(f"agent-demo: to continue: {continue_hint(outcome, agent, args)}", file=sys.stderr)
    return outcome.exit_code


def say_material(outcome: RunResult) -> None:
    """Even under --quiet: an answer about part of the material piped in says how much the model read."""
    read = outcome.material
    if read:
        print(f"agent-demo: {prompts.render_material_read(read['read_chars'], read['chars'], read['bytes'])}",
              file=sys.stderr)


def json_object(outcome: RunResult) -> dict:
    """The --json object: the outcome, and the run's id and trace file (null when nothing was recorded)."""
    path = outcome.trace
    return {**outcome.to_json(), "run_id": run_log.run_id(Path(path)) if path else None,
            "trace": os.path.abspath(path) if path else None}


def continue_hint(outcome: RunResult, agent: Optional[Agent], args: argparse.Namespace) -> str:
    """How to go on with a run cut short: agent-demo --resume and the run's id, with only the flags that
    matter. The model and URL given as flags are given again (the environment would win over the
    record), unless they caused the error: then the hint says what to fix first. After a round limit
    a bare --resume gives another --max-rounds of rounds; after the token budget, the budget doubles."""
    command = f"agent-demo --resume {run_name(outcome.trace, args)}"
    ending, settings = outcome.ending, agent and agent.settings
    stronger = bool(agent and agent.escalation and agent.escalation.in_charge == "second")  # its endpoint failed
    failing = agent.client.settings if agent else None
    http_status = getattr(ending, "http_status", None)
    model_wrong, url_wrong = http_status == 404, http_status == 404 or getattr(ending, "unreachable", False)
    if settings and args.model and not (model_wrong and not stronger):
        command += f" -m {shlex.quote(settings.model)}"
    if settings and settings.escalate and settings.sources.get("escalate", "").startswith(("-", "the resumed run")) \
            and not (model_wrong and stronger):
        command += f" --escalate {shlex.quote(settings.escalate)}"
    if settings and args.url and not (url_wrong and not stronger) and "***" not in display_url(settings.url):
        command += f" --url {shlex.quote(settings.url)}"
    for name in ("tools_files", "mcp_servers", "mcp_config", "check", "escalate_url"):  # named, never decided
        if name == "escalate_url" and "***" in display_url(settings.escalate_url or ""):
            continue  # a password that was not recorded: the user gives it again
        values = getattr(settings, name) if settings else None
        if values and settings.sources.get(name, "").startswith("-"):
            command += "".join(f" {flag_name(name)} {shlex.quote(value)}"
                               for value in (values if isinstance(values, list) else [values]))
    if args.yes:  # never assumed on resume: said again, in the open
        command += " --yes"
    if agent and outcome.status == "budget" and agent.token_limit:
        command += f" --max-tokens {agent.token_limit * 2}"
    if http_status in (401, 403):
        return f"check {key_source(failing)}, then: {command}"
    model_flag, url_flag = ("--escalate", "--escalate-url") if stronger else ("-m", "--url")
    if model_wrong:
        return f"give a model the endpoint has ({model_flag} NAME) or its right URL ({url_flag}), then: {command}"
    if url_wrong:
        return f"once {display_url(failing.endpoint) if failing else 'the endpoint'} answers (or with the right" \
               f" {url_flag}): {command}"
    return command


def key_source(settings: Any) -> str:
    """The variable the key came from, to say which to check."""
    source = settings.sources.get("api_key", "default") if settings else "default"
    return "LLM_API_KEY" if source in ("default", "the resumed run") else source


def run_name(path: str, args: argparse.Namespace) -> str:
    """How --resume names a run: as the user named it (--trace FILE, --resume RUN), else by its short
    id in the run log folder."""
    named = args.trace or args.resume or args.continue_run
    if named:
        return shlex.quote(named)
    folder = Path(path).parent
    return run_log.short_ids([run_log.RunSummary(Path(path), 0, "", 0, None, "")],
                               run_log.run_files(folder)).get(Path(path), run_log.run_id(Path(path)))


def list_runs(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream) -> int:
    """--runs: the recent runs in the run log folder, newest first, a line a run, as wide as the terminal
    (80 columns into a pipe or a file); with --json, a list of objects."""
    folder = run_log.log_dir(environment)
    checked_folder(folder)
    runs = run_log.recent_runs(folder, args.count or 20, args.status)
    ids = run_log.short_ids(runs, run_log.run_files(folder))
    if args.json:
        answer.write_json([run.to_json(ids[run.path]) for run in runs])
        return 0
    width = shutil.get_terminal_size().columns if is_terminal(sys.stdout) else 80
    print(run_log.render_runs(runs, folder, ids, width) if runs or not args.status
          else f"no runs that ended {args.status} in {folder}")
    return 0


def run_batch(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream) -> int:
    """--batch FILE: every task of the file (or of its --shard), into --out; the summary with --json."""
    from agent_demo_kit.batch import Batch
    from agent_demo_kit.task_file import read_tasks
    source, notes = "stdin" if args.batch == "-" else args.batch, []
    try:  # read a line at a time: a file that is not text is refused before it is all in memory
        stream = sys.stdin.buffer if args.batch == "-" else open(args.batch, "rb")
    except OSError as error:
        raise ConfigError(f"--batch: cannot read {args.batch}: {error.strerror or error}") from None
    try:
        tasks = read_tasks(stream, source, notes)
    except OSError as error:
        raise ConfigError(f"--batch: cannot read {args.batch}: {error.strerror or error}") from None
    finally:
        if args.batch != "-":
            stream.close()
    if not tasks:
        raise ConfigError(f"--batch: {source} holds no task")
    batch = Batch(tasks, Path(args.out) if args.out else None, given_settings(args), environment,
                  parallel=args.parallel,
                  retry_errors=DEFAULT_RETRY_ERRORS if args.retry_errors is None else args.retry_errors,
                  rerun_failed=args.rerun_failed, part=args.shard, quiet=args.quiet, named=flag_name, notes=notes,
                  match=args.match, repeat=args.repeat or 1, source=args.batch, command=args.command,
                  task_checks=args.task_checks)
    with ending_on_sigterm():
        code, summary = batch.run(args.pass_rate)
    if args.json:
        answer.write_json(summary)
    return code


def show_summary(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream) -> int:
    """--summary [DIR...]: the figures of batch result folders (shards merged; configurations side by
    side), or of the run log folder; what failed, and how to run it again."""
    from agent_demo_kit import comparison
    from agent_demo_kit.batch import summarize_runs
    from agent_demo_kit.metrics import render
    if args.summary:
        summary = comparison.summarize(args.summary)
    else:
        folder = run_log.log_dir(environment)
        checked_folder(folder)
        summary = summarize_runs(run_log.run_files(folder))
        print(f"agent-demo: the runs in {folder}", file=sys.stderr)
    if args.json:
        answer.write_json(summary)
        return 0
    if "configurations" in summary:
        shown = comparison.render_comparison(summary, args.markdown)
    else:
        shown = comparison.render_single(summary, args.markdown) if args.markdown else render(summary)
        shown += comparison.render_failures(summary.get("failures") or [])
    # For people, piped or not: answers, ids and model names from results files are shown escaped.
    print(inert("\n".join(shown)), file=answer)
    if "configurations" not in summary and summary.get("failures") and summary.get("folders"):
        print(f"agent-demo: to run them again: {comparison.rerun_command(summary)}", file=sys.stderr)
    return 0


def show_run(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream, redactor: Redactor) -> int:
    """--show RUN: the run as its live trace showed it (on stderr) and its answer (on stdout); with --json,
    its summary: the --json object of the run."""
    path = run_log.pick_run(args.show, environment, "--show")
    try:
        records = trace_file.last_run_records(path)
    except OSError as error:
        raise ConfigError(f"--show: cannot read {path}: {error.strerror or error}") from None
    outcome = replay(records, trace_file.RunLog(screen(args, environment, redactor)))
    outcome.trace = path
    say_material(outcome)
    if args.json:
        answer.write_json({"task": records[0].get("task"), **json_object(outcome)})
    elif outcome.status == "finished" and isinstance(outcome.result, str):
        print(outcome.result, file=answer)
    elif outcome.status == "finished":
        answer.write_json(outcome.result, indent=2)
    return 0


def replay(records: List[dict], log: Any) -> RunResult:
    """Show a recorded run through the same screen calls the live run made; its outcome ("unfinished"
    when it has no end record)."""
    kept, rounds, end = dict(records[0]), [], None
    for record in records:
        event = trace_file.event_of(record)
        try:
            if event in trace_file.SETS_UP:
                kept.update(record)
                task, model, url = str(kept.get("task")), str(record.get("model")), str(record.get("url"))
                if event == trace_file.START:
                    log.start(task, model, url, kept)
                elif event == trace_file.RESUME:
                    log.resume(task, model, url, record.get("after_round"), kept)
                else:
                    log.follow_up(str(record.get("text")), model, url, record.get("after_round"), kept)
            elif event == trace_file.ROUND:
                rounds.append(Round.from_line(record))
                show_round(rounds[-1], kept, log)
            elif event == trace_file.NOTE:
                log.note(str(record.get("text")))
            elif event == trace_file.RETRY:
                log.retry(str(record.get("cause")), record["attempt"], record["retries"], record["wait"])
            elif event == trace_file.SETTING:
                log.setting(str(record.get("name")), record.get("value"), str(record.get("text")))
            elif event == trace_file.FALLBACK:
                log.fallback(str(record.get("from_mode")), str(record.get("to_mode")), str(record.get("error")),
                             record.get("from_variant"), record.get("to_variant"))
            elif event == trace_file.COMPACTION:
                log.compaction(Compaction.from_line(record))
            elif event == trace_file.ESCALATION:
                log.escalation(record["after_round"], str(record.get("from_model")), str(record.get("to_model")),
                               str(record.get("trigger")), str(record.get("reason")), str(record.get("notice")))
            elif event == trace_file.END:
                end = record
        except (KeyError, TypeError, ValueError):  # a record this version cannot show: left out
            continue
    return ended(end, rounds, log)


def show_round(record: Round, kept: dict, log: Any) -> None:
    """One recorded round, as it was shown when it ran."""
    native = record.tool_calls is not None
    prose = record.model_output if native else parse_actions(record.model_output).prose
    reply = Reply(content=record.model_output, tool_calls=record.tool_calls or [], latency_ms=record.latency_ms)
    log.reply(record.number, kept.get("max_rounds") or record.number, reply, prose, record.usage,
              record.usage_estimated)
    for index, call in enumerate(record.calls, 1):
        log.action(index, len(record.calls), call.tool, call.args, call.note == prompts.ANSWERED_IN_WORDS)
        log.result(call, truncate_result(call.result, kept.get("max_result_chars") or Settings().max_result_chars))
    log.round(record)


def ended(end: Optional[dict], rounds: List[Round], log: Any) -> RunResult:
    """The outcome an end record holds (shown as it was), or an unfinished one."""
    calls = [{"round": record.number, "tool": call.tool, "args": call.args, "result": call.result}
             for record in rounds for call in record.calls]
    if end is None:
        outcome = RunResult(ending_of("error", "unfinished: cut short before its end record"), len(rounds),
                            total_usage(rounds), calls)
        log.ended("unfinished", f"unfinished after {len(rounds)} round(s)", [])
        return outcome
    outcome = RunResult(ending_of(str(end.get("status")), str(end.get("error") or ""), end.get("result")),
                        end.get("rounds") if isinstance(end.get("rounds"), int) else len(rounds),
                        end.get("usage") if isinstance(end.get("usage"), dict) else {}, calls,
                        last_words=str(end.get("last_words") or ""),
                        material=end.get("material") if isinstance(end.get("material"), dict) else None,
                        models=end.get("models") if isinstance(end.get("models"), dict) else None,
                        answered_in_words=end.get("answered_in_words") is True,
                        checks=[{"round": record.number, **call.check} for record in rounds for call in record.calls
                                if call.check])
    progress = end.get("progress") if isinstance(end.get("progress"), list) else outcome.progress
    log.ended(outcome.status, str(end.get("summary") or outcome.summary()), [str(line) for line in progress],
              outcome.models)
    if outcome.status == "error":
        print(f"agent-demo: error: {outcome.error}", file=sys.stderr)
    return outcome


def show_config(args: argparse.Namespace, environment: Any, answer: SafeStream,
                unreadable: Optional[ConfigError] = None) -> int:
    """--config: each setting's value and where it came from, the key redacted; then the files read,
    and what is wrong with them or with the endpoint's settings, if anything."""
    if not isinstance(environment, Environment):  # a settings file could not be read: the shell's alone
        environment = Environment(environment, {})
    settings = load_settings(given_settings(args), environment, check_endpoint=False)
    shown = {}
    for item in setting_fields():
        source = settings.sources[item.name]
        where = ("default" if source == "default" else f"flag {source}" if source.startswith("-")
                 else f"{source} in {environment.origin(source)}")
        shown[item.name] = {"value": config_value(item, getattr(settings, item.name)), "source": where}
    files = {str(path): path.is_file() for path in (Path.cwd() / ".env", user_config_file(environment))}
    try:
        check_endpoint_settings(settings)
        problem = str(unreadable) if unreadable else None
    except ConfigError as error:
        problem = str(unreadable or error)
    if args.json:
        answer.write_json({"settings": shown, "files": files, "problem": problem})
        return 0
    width = max(map(len, shown))
    for name, entry in shown.items():
        print(f"{name:<{width}}  {entry['value']:<32}  {entry['source']}", file=answer)
    for path, found in files.items():
        print(f"{'read' if found else 'none'}: {path}", file=answer)
    if problem:
        print(f"problem: {problem}", file=answer)
    return 0


def config_value(item: Any, value: Any) -> str:
    """A setting's value as --config shows it: the key never, a URL without its password."""
    if item.name in ("api_key", "escalate_key"):
        return "[redacted]" if value else "not set"
    if item.name in ("url", "escalate_url") and value:
        return display_url(value)
    if item.name == "escalate_on" and value == []:
        return "none"
    if isinstance(value, tuple):  # a price
        return ",".join(f"{part:g}" for part in value if part is not None)
    if value is None or value == [] or isinstance(value, bool):
        return {True: "on", False: "off"}.get(value, shown_default(item)) if isinstance(value, bool) \
            else shown_default(item)
    return ", ".join(value) if isinstance(value, list) else f"{value:g}" if isinstance(value, float) else str(value)
