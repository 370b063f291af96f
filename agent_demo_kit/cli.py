"""The command line: its flags and help (each setting's from its one definition in settings.py),
the task and what stdin brings, and which command runs (commands.py runs it and prints what comes
of it).

It imports commands and what the flags are made from: settings, scoring, comparison, endings.
"""
import argparse
import contextlib
import difflib
import os
import re
import shlex
import stat
import sys
from typing import Any, Callable, Dict, List, Optional

from agent_demo_kit import __version__
from agent_demo_kit.commands import json_object, report, show_traceback, start
from agent_demo_kit.endings import RUN_STATUSES, ConfigError, EndpointError, Finished, GaveUp, Interrupted, \
    OutputClosed, RunResult, Terminated
from agent_demo_kit.environment import read_environment
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.settings import (DEFAULT_RETRY_ERRORS, HOSTED_PARALLEL, MATCHES, MODES, MOST_TRIES, pass_rate,
                                     setting_fields, shard_of_n, shown_default, significance, token_price,
                                     whole_number)
from agent_demo_kit.terminal import is_terminal, protected
from agent_demo_kit.urls import mcp_urls, secrets_of
from agent_demo_kit.tools import REGISTRY

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
        message += self.meant(message)
        if self.json_output:
            with contextlib.suppress(OutputClosed):  # the usage error and its exit code stand
                sys.stdout.write_json(json_object(RunResult(ConfigError(f"usage: {message}"))))
        self.exit(ConfigError.exit_code, f"agent-demo: error: {message} (see agent-demo --help)\n")  # one line, not the usage block

    def meant(self, message: str) -> str:
        """" (did you mean --json?)" for a mistyped flag, " (did you mean 'json'?)" for a mistyped choice, as
        argparse itself says on no Python before 3.14; "" when nothing known is near."""
        if message.startswith("unrecognized arguments: "):
            flags = [word.split("=", 1)[0] for word in message.split(": ", 1)[1].split() if word.startswith("-")]
            near = [match for flag in flags[:1] for match in difflib.get_close_matches(
                flag, [name for name in self._option_string_actions if name.startswith("--")], 1)]
            return f" (did you mean {near[0]}?)" if near else ""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice and "did you mean" not in message and "maybe you meant" not in message:
            choices = [name.strip().strip("'") for name in choice[2].split(",")]
            near = difflib.get_close_matches(choice[1], choices, 1)
            return f" (did you mean {near[0]!r}?)" if near else ""
        return ""


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
        elif isinstance(default, list) or item.name == "model":  # -m a -m b: a batch a model
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
                            " plain text; CSV; promptfoo's tests; - reads stdin; hf:NAME[:SPLIT] a Hugging Face"
                            " dataset of the local cache, or FOLDER[:SPLIT] one saved on disk) and write a trace per"
                            " task, results.jsonl and summary.json to --out; the same command again goes on where it"
                            " stopped")
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
    batch.add_argument("--fields", metavar="KEY=NAME,...",
                       help="--batch: which key of a JSON line, or column of a CSV file, is the task, what is"
                            " expected, the id, the match (task=question,expected=answer,id=idx); what it leaves"
                            " out is read by name (answer: what is expected); other keys are not read, other"
                            " columns are the task's metadata")
    batch.add_argument("--plan", action="store_true",
                       help="--batch: say how many requests and tokens the batch would take (as its folder's earlier"
                            " results did, else a guess), what that costs at --price, and how large a difference"
                            " between two configurations its tasks can show (at --significance); send nothing")
    batch.add_argument("--scorer", metavar="FILE:FUNCTION", action="append",
                       help="--batch: score each answer with FUNCTION of the Python file FILE too, called with"
                            " task=, answer=, expected= once a task ends (True, False, 0 to 1, or None); never"
                            " seen by the model; repeatable")
    batch.add_argument("--judge", metavar="MODEL",
                       help="--batch: MODEL grades each answer (0 to 1, with a reason) against --judge-rubric, on"
                            " the batch's endpoint unless --judge-url; its tokens and cost are counted apart")
    batch.add_argument("--judge-url", metavar="URL",
                       help="--judge: the judge's endpoint (its key: LLM_JUDGE_KEY; default: the batch's endpoint"
                            " and key)")
    batch.add_argument("--judge-rubric", metavar="FILE",
                       help="--judge: what makes an answer right, read from FILE (default: it does what the task"
                            " asks and agrees with what is expected)")
    batch.add_argument("--judge-price", type=flag_type(token_price), metavar="IN,OUT[,CACHED]",
                       help="--judge: the judge's price, as --price")
    batch.add_argument("--match", choices=MATCHES, metavar="HOW",
                       help="--batch: how an answer is scored against a task's expected: exact, includes, number"
                            " or regex (a task line's \"match\" wins; default: case, quotes, surrounding"
                            " whitespace and final punctuation do not count, and a number is compared with the"
                            " answer's final number)")
    batch.add_argument("--group-readable", action="store_true",
                       help="--batch: the output folder's group may read it (never write): for a shared volume, or"
                            " a --summary or --report run as another user of the group")
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
    batch.add_argument("--baseline", metavar="DIR", nargs="+",
                       help="--summary NEW: compare NEW with the batch results in DIR on the tasks both ran, and exit"
                            " 1 when NEW is worse by more than noise (the paired test), 0 otherwise: a gate for CI")
    batch.add_argument("--significance", type=flag_type(significance), metavar="LEVEL",
                       help="--baseline, --plan: the paired test's level below which a difference is more than"
                            " noise (default 0.05)")
    batch.add_argument("--markdown", action="store_true",
                       help="--summary: print the figures as Markdown tables, to paste into a pull request")
    batch.add_argument("--report", metavar="DIR", nargs="+",
                       help="write the report page of the batch results in each DIR (several configurations side"
                            " by side, the tasks where they differ first): one HTML file, to open in a browser;"
                            " into DIR/report.html for one DIR, else ./report.html, or -o FILE")
    batch.add_argument("--trend", metavar="DIR", nargs="+",
                       help="print the batch results in each DIR over time: a row a folder in the order they ran"
                            " (when its first task ended) with its model, tasks, accuracy and its interval, tokens"
                            " and cost, and exit; with --json, as JSON; with --html, as a page with a line a model")
    batch.add_argument("-o", "--output", metavar="FILE",
                       help="--report, --show --html, --trend --html: the file the page goes to")
    parser.add_argument("--html", action="store_true",
                        help="--show, --trend: write the run, or the trend, as a report page (on stdout, or into"
                             " -o FILE)")
    parser.add_argument("--config", action="store_true",
                        help="show each setting's value and where it came from (a flag, the shell, ./.env, your"
                             " settings file, the default), the key redacted, and exit; with --json, as JSON")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with status, result, rounds, usage, calls (and error), and the"
                             " run's run_id and trace file; the trace goes to stderr")
    parser.add_argument("--output-schema", metavar="FILE",
                        help="the finish's result must fit the JSON Schema in FILE (told to the model; a result"
                             " that does not fit is sent back, as --check does); the answer is printed as JSON")
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
    if args.continue_run and not words:
        from agent_demo_kit.run_log import looks_like_a_run  # --continue: the run log's
    if args.continue_run and not words and not looks_like_a_run(args.continue_run):
        words, args.continue_run = args.continue_run.strip(), ""  # --continue "follow-up" alone
    if args.continue_run is not None and args.resume is not None:
        parser.error("--continue and --resume cannot go together: a follow-up starts from where the run stands")
    if (args.count is not None or args.status is not None) and not args.runs:
        parser.error("-n and --status go with --runs")
    batch_only = [flag for flag, value in (("--out", args.out), ("--parallel", args.parallel),
                                           ("--retry-errors", args.retry_errors), ("--rerun-failed", args.rerun_failed),
                                           ("--shard", args.shard), ("--pass-rate", args.pass_rate),
                                           ("--match", args.match), ("--repeat", args.repeat),
                                           ("--fields", args.fields), ("--scorer", args.scorer),
                                           ("--judge", args.judge),
                                           ("--plan", args.plan),
                                           ("--task-checks", args.task_checks),
                                           ("--group-readable", args.group_readable)) if value]
    if batch_only and args.batch is None:
        parser.error(f"{', '.join(batch_only)} go{'es' if len(batch_only) == 1 else ''} with --batch")
    args.models, args.model = args.model or [], (args.model or [None])[-1]
    twice = next((model for number, model in enumerate(args.models)
                  if model.strip() in [other.strip() for other in args.models[:number]]), None)
    if twice is not None:
        parser.error(f"-m {twice} is named twice")
    if len(args.models) > 1 and args.batch is None:
        parser.error(f"several models ({' '.join('-m ' + model for model in args.models)}) go with --batch: a run has"
                     " one model")
    judge_only = [flag for flag, value in (("--judge-url", args.judge_url), ("--judge-rubric", args.judge_rubric),
                                           ("--judge-price", args.judge_price)) if value]
    if judge_only and args.judge is None:
        parser.error(f"{', '.join(judge_only)} go{'es' if len(judge_only) == 1 else ''} with --judge")
    if args.markdown and args.summary is None:
        parser.error("--markdown goes with --summary")
    if args.baseline is not None and args.summary is None:
        parser.error("--baseline goes with --summary NEW: it compares NEW with the baseline")
    if args.significance is not None and args.baseline is None and not args.plan:
        parser.error("--significance goes with --baseline or --plan")
    if args.html and args.show is None and args.trend is None:
        parser.error("--html goes with --show or --trend")
    if args.output and args.report is None and not args.html:
        parser.error("-o goes with --report, --show --html or --trend --html")
    args.command = shlex.join(["agent-demo", *(sys.argv[1:] if argv is None else argv)])  # the same command again
    if args.batch is not None:
        clash = [flag for flag, value in (("--resume", args.resume is not None),
                                          ("--continue", args.continue_run is not None), ("--runs", args.runs),
                                          ("--show", args.show is not None), ("--trace", args.trace),
                                          ("--no-log", args.no_log), ("--approve", args.approve),
                                          ("--summary", args.summary is not None), ("--config", args.config),
                                          ("--output-schema", args.output_schema), ("--report", args.report),
                                          ("--trend", args.trend),
                                          ("a task", words)) if value]
        if clash:
            parser.error(f"--batch runs the tasks of its file, each with a trace in --out; {clash[0]} does not go"
                         f" with it" + (" (nobody is there to ask)" if clash[0] == "--approve" else ""))
        args.task = ""
        return args
    if args.trend is not None:
        clash = [flag for flag, value in (("--summary", args.summary is not None), ("--report", args.report),
                                          ("--show", args.show is not None), ("--runs", args.runs),
                                          ("--config", args.config), ("--baseline", args.baseline)) if value]
        if clash:
            parser.error(f"--trend shows result folders over time; {clash[0]} does not go with it")
    if args.summary is not None:  # the words are folders too: --summary --json DIR
        args.summary, args.task = args.summary + list(args.task), ""
        return args
    if args.report is not None:
        args.report, args.task = args.report + list(args.task), ""
        return args
    if args.trend is not None:
        args.trend, args.task = args.trend + list(args.task), ""
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
        redactor.add(*secrets_of(environment, args.url, args.judge_url, *mcp_urls(args.mcp_servers or [])))
        for note in getattr(environment, "notes", []):  # a ./.env passed by
            print(f"agent-demo: {note}", file=sys.stderr)
        if unreadable or args.runs or args.show is not None or args.config or args.summary is not None \
                or args.batch is not None or args.report is not None or args.trend is not None:
            from agent_demo_kit.side_commands import list_runs, run_batch, show_config, show_run, show_summary, \
                show_trend, write_report
            try:
                if args.config:  # what is wrong with a settings file is one of the things it shows
                    return show_config(args, environment, answer, unreadable)
                if unreadable:
                    return report(RunResult(unreadable), args, answer)
                if args.summary is not None:
                    return show_summary(args, environment, answer)
                if args.report is not None:
                    return write_report(args, redactor)
                if args.trend is not None:
                    return show_trend(args, answer, redactor)
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


# --- what is printed --------------------------------------------------------------------------


