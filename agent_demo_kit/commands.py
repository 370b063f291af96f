"""What the command line runs once its flags are read: a task (a new run, a resume, a follow-up)
and its printed outcome with how to go on; --batch, --runs, --show, --summary and --config. Each
goes through the same entrance as a Python caller (`agent_demo.prepare`, `run_job`).

It imports agent_demo, batch, comparison, run_log, trace_file, report_page, output_types, the terminal and
the settings.
"""
import argparse
import contextlib
import os
import shlex
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from agent_demo_kit import prompts
from agent_demo import Agent, run_job
from agent_demo_kit.seam import Job
from agent_demo_kit.setup import prepare
from agent_demo_kit.endings import ConfigError, Interrupted, RunResult, SigTerm, Terminated
from agent_demo_kit.environment import Environment, user_config_file
from agent_demo_kit.private_files import checked_folder, write_private
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.settings import (DEFAULT_RETRY_ERRORS, check_endpoint_settings, flag_name, load_settings,
                                     setting_fields, shown_default)
from agent_demo_kit.terminal import (CONTROLLING_TERMINAL, SafeStream, Screen, ScreenTrace, inert, is_terminal,
                                     stray_prints_to_stderr)
from agent_demo_kit.urls import display_url


def start(args: argparse.Namespace, environment: Dict[str, str],
          redactor: Redactor) -> Tuple[RunResult, Optional[Agent]]:
    """Prepare the run (or the resume, or the follow-up) and run it; the outcome, and the agent
    that ran it once it started."""
    with ending_on_sigterm():
        try:
            job = prepare_job(args, environment, redactor, output_schema(args.output_schema))
        except ConfigError as error:
            return RunResult(error), None
        except KeyboardInterrupt:
            return RunResult(Interrupted()), None
        except SigTerm:
            return RunResult(Terminated("terminated by SIGTERM")), None
        with job, stray_prints_to_stderr():  # closed whatever happens: the trace, the tools worker, MCP
            return run_job(job)


def output_schema(path: Optional[str]) -> Any:
    """The type --output-schema FILE gives the result (a file the user named: trusted), or None."""
    if path is None:
        return None
    from agent_demo_kit.output_types import output_type_of, schema_file
    try:
        with open(path, encoding="utf-8") as file:
            return output_type_of(schema_file(file.read(1 << 20), f"--output-schema {path}"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read --output-schema {path}: {getattr(error, 'strerror', None) or error}") from None
    except ValueError as error:  # not a JSON Schema: it says why
        raise ConfigError(str(error)) from None


def prepare_job(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor,
                output: Optional[Any] = None) -> Job:
    """The run the flags ask for, made ready: a new one, or one taken up again from its trace
    (output: the type --output-schema gives the result)."""
    given = given_settings(args)
    follow_up = args.task if args.continue_run is not None else None
    resume = run_path(args, environment) if args.resume is not None or follow_up is not None else None
    return prepare(args.task, given=given, environment=environment, named=flag_name, material=args.material,
                   trace=args.trace or (None if args.no_log else True), resume=resume, follow_up=follow_up,
                   screen=screen(args, environment, redactor), redactor=redactor,
                   approver=asked_on_the_terminal(redactor), output=output,
                   confirm=resume and asked_on_the_terminal(redactor, confirming=True))


def asked_on_the_terminal(redactor: Redactor, confirming: bool = False) -> Optional[Callable[[Any], bool]]:
    """Who approves a call (or, confirming: says y/N to a question): the question on the controlling
    terminal, made the first time one is asked (approval.py); None when the process has no terminal."""
    try:
        os.close(os.open(CONTROLLING_TERMINAL, os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return None
    asker: List[Any] = []

    def ask(question: Any) -> bool:
        if not asker:
            from agent_demo_kit.approval import terminal_approver, terminal_confirm
            asker.append((terminal_confirm if confirming else terminal_approver)(redactor) or (lambda _: False))
        return asker[0](question)
    return ask


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
    from agent_demo_kit import run_log  # the run log layer
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


def show_traceback(outcome: RunResult) -> None:
    """For --debug: the traceback of the error that ended the run, through the redacting stderr."""
    error = outcome.ending
    if outcome.status == "error" and str(error):
        print("".join(traceback.format_exception(type(error), error, error.__traceback__)), file=sys.stderr, end="")


def print_answer(outcome: RunResult, args: argparse.Namespace, answer: SafeStream) -> None:
    """A finished run's answer on stdout: text as it is, anything else (or with --output-schema) as JSON."""
    if outcome.status != "finished":
        return
    if args.output_schema:  # JSON, whatever its type
        answer.write_json(outcome.result)
    elif isinstance(outcome.result, str):
        print(outcome.result, file=answer)
    else:
        answer.write_json(outcome.result, indent=2)


def report(outcome: RunResult, args: argparse.Namespace, answer: SafeStream, agent: Optional[Agent] = None) -> int:
    """Print the outcome the way the flags ask for (the answer, or the --json object, on `answer`;
    the rest on stderr, with how to continue a run cut short); returns the exit code."""
    if args.json:
        answer.write_json(json_object(outcome))
    else:
        print_answer(outcome, args, answer)
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
    from agent_demo_kit import run_log  # the run log layer
    path = outcome.trace
    return {**outcome.to_json(), "run_id": run_log.run_id(Path(path)) if path else None,
            "trace": os.path.abspath(path) if path else None}


def continue_hint(outcome: RunResult, agent: Optional[Agent], args: argparse.Namespace) -> str:
    """How to go on with a run cut short: agent-demo --resume and the run's id, with only the flags that
    matter. The model given as a flag is given again (the environment would win over the record), and
    the URL given anywhere (a trace decides no URL on its own: LLM_API_URL=... agent-demo "task" would
    otherwise leave the resume without one), unless they caused the error: then the hint says what to
    fix first. After a round limit a bare --resume gives another --max-rounds of rounds; after the
    token budget, the budget doubles."""
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
    url_named = args.url or settings and settings.sources.get("url") not in (None, "default", "the resumed run")
    if settings and url_named and not (url_wrong and not stronger) and "***" not in display_url(settings.url):
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
    from agent_demo_kit import run_log  # the run log layer
    named = args.trace or args.resume or args.continue_run
    if named:
        return shlex.quote(named)
    folder = Path(path).parent
    return run_log.short_ids([run_log.RunSummary(Path(path), 0, "", 0, None, "")],
                               run_log.run_files(folder)).get(Path(path), run_log.run_id(Path(path)))


def list_runs(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream) -> int:
    """--runs: the recent runs in the run log folder, newest first, a line a run, as wide as COLUMNS says,
    else the terminal (80 columns into a pipe or a file); with --json, a list of objects."""
    from agent_demo_kit import run_log  # the run log layer
    folder = run_log.log_dir(environment)
    checked_folder(folder)
    runs = run_log.recent_runs(folder, args.count or 20, args.status)
    ids = run_log.short_ids(runs, run_log.run_files(folder))
    if args.json:
        answer.write_json([run.to_json(ids[run.path]) for run in runs])
        return 0
    width = shutil.get_terminal_size().columns  # COLUMNS first, then the terminal; 80 into a pipe without it
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
                  task_checks=args.task_checks, group_readable=args.group_readable)
    with ending_on_sigterm():
        code, summary = batch.run(args.pass_rate)
    if args.json:
        answer.write_json(summary)
    return code


def show_summary(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream) -> int:
    """--summary [DIR...]: the figures of batch result folders (shards merged; configurations side by
    side), or of the run log folder; what failed, and how to run it again."""
    from agent_demo_kit import run_log  # the run log layer
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
        if summary.get("not_sealed_by_you"):
            shown.append(comparison.seal_note({"label": summary["folders"][0], **summary}))
        shown += comparison.render_failures(summary.get("failures") or [])
    # For people, piped or not: answers, ids and model names from results files are shown escaped.
    print(inert("\n".join(shown)), file=answer)
    if "configurations" not in summary and summary.get("failures") and summary.get("folders"):
        print(f"agent-demo: to run them again: {comparison.rerun_command(summary)}", file=sys.stderr)
        if (summary.get("config") or {}).get("check") and (not summary.get("yours", True)
                                                          or summary.get("not_sealed_by_you")):
            print("agent-demo: (without the folder's --check: it is not yours, and a check is a command;"
                  " give one of your own if you want one)", file=sys.stderr)
    return 0


def show_run(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream, redactor: Redactor) -> int:
    """--show RUN: the run as its live trace showed it (on stderr) and its answer (on stdout); with --json,
    its summary: the --json object of the run."""
    from agent_demo_kit import run_log, trace_file  # the run log layer
    path = run_log.pick_run(args.show, environment, "--show")
    try:
        records = trace_file.last_run_records(path)
    except OSError as error:
        raise ConfigError(f"--show: cannot read {path}: {error.strerror or error}") from None
    if args.html:
        from agent_demo_kit import report_page
        return write_page(args.output, report_page.page(report_page.run_data(path), redactor), answer)
    outcome = run_log.replay(records, ScreenTrace(screen(args, environment, redactor)))
    outcome.trace = path
    say_material(outcome)
    if args.json:
        answer.write_json({"task": records[0].get("task"), **json_object(outcome)})
    else:
        print_answer(outcome, args, answer)
    return 0


def write_report(args: argparse.Namespace, redactor: Redactor) -> int:
    """--report DIR...: the report page of the result folders, into -o FILE (default: DIR/report.html for
    one DIR, else ./report.html)."""
    from agent_demo_kit import report_page
    try:
        data = report_page.batch_data(args.report)
    except ConfigError as error:
        raise ConfigError(str(error).replace("--summary:", "--report:", 1)) from None
    default = Path(args.report[0]) / "report.html" if len(args.report) == 1 else Path("report.html")
    return write_page(args.output or str(default), report_page.page(data, redactor), None)


def write_page(path: Optional[str], page: bytes, answer: Optional[SafeStream]) -> int:
    """A report page into the file `path`, or, without one, on stdout (`answer`, written as it is: it is
    HTML, with nothing in it to act on a terminal)."""
    if path is None and answer is not None:
        sys.stdout.flush()
        sys.stdout.buffer.write(page)
        sys.stdout.buffer.flush()
        return 0
    try:
        write_private(Path(str(path)), [page])
    except OSError as error:
        raise ConfigError(f"cannot write the report page {path}: {error.strerror or error}") from None
    print(f"agent-demo: report page: {path} ({len(page) / 1e6:.1f} MB)" if len(page) >= 100_000 else
          f"agent-demo: report page: {path}", file=sys.stderr)
    return 0


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
    files = {str(path): path in environment.read for path in (Path.cwd() / ".env", user_config_file(environment))}
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
        passed_by = not found and os.path.lexists(path)  # there, and not read: the note above said why
        print(f"{'read' if found else 'not read' if passed_by else 'none'}: {path}", file=answer)
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
