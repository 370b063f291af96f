"""What the command line does besides running one task: --batch (batch.py runs it), --runs and
--show (the run log), --summary, --report and --trend (the results), --config. Each command imports the layer
it reads only when it runs.

It imports commands (the screen, a run's outcome), the terminal, private files and the settings.
"""
import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from agent_demo_kit.commands import (ending_on_sigterm, given_settings, json_object, print_answer, say_material,
                                     screen)
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.environment import Environment, user_config_file
from agent_demo_kit.private_files import checked_folder, write_private
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.screen_trace import ScreenTrace
from agent_demo_kit.settings import (DEFAULT_RETRY_ERRORS, check_endpoint_settings, flag_name, load_settings,
                                     setting_fields, shown_default)
from agent_demo_kit.terminal import SafeStream, inert
from agent_demo_kit.urls import display_url, secrets_of


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
    """--batch FILE: every task of the file (or of its --shard), into --out; the summary with --json.
    With several models (-m a -m b), each in turn, then their comparison."""
    from agent_demo_kit.task_file import parse_fields, read_tasks
    source, notes = "stdin" if args.batch == "-" else args.batch, []
    try:
        fields = parse_fields(args.fields) if args.fields is not None else None
    except ValueError as error:
        raise ConfigError(f"--fields: {error}") from None
    from agent_demo_kit import hf_datasets
    dataset = args.batch != "-" and hf_datasets.names_a_dataset(args.batch)
    try:  # read a line at a time: a file that is not text is refused before it is all in memory
        stream = sys.stdin.buffer if args.batch == "-" else hf_datasets.dataset_rows(args.batch) if dataset \
            else open(args.batch, "rb")
    except OSError as error:
        raise ConfigError(f"--batch: cannot read {args.batch}: {error.strerror or error}") from None
    try:
        tasks = read_tasks(stream, source, notes, fields, named_by_suffix=not dataset)
    except OSError as error:
        raise ConfigError(f"--batch: cannot read {args.batch}: {error.strerror or error}") from None
    finally:
        if hasattr(stream, "close") and args.batch != "-":
            stream.close()
    if not tasks:
        raise ConfigError(f"--batch: {source} holds no task")
    listed = models_of(environment.get("AGENT_BATCH_MODELS", "")) if not args.models else []
    if listed:  # the settings file's list
        args.models, args.model = listed, listed[-1]
    if len(args.models) > 1:
        one_folder_a_model(args.models)
    if args.plan:
        return show_plan(args, environment, answer, tasks)
    if len(args.models) > 1:
        return each_model(args, environment, answer, tasks, notes)
    return batch_of(args, environment, answer, tasks, notes)


def models_of(text: str) -> List[str]:
    """AGENT_BATCH_MODELS=small,big: the models a batch runs with, each once; ConfigError for a name twice."""
    models = [name.strip() for name in text.split(",") if name.strip()]
    twice = next((model for number, model in enumerate(models) if model in models[:number]), None)
    if twice is not None:
        raise ConfigError(f"AGENT_BATCH_MODELS names {twice} twice")
    return models


def one_folder_a_model(models: List[str]) -> None:
    """ConfigError, before anything is sent, for two models whose results would go to one folder."""
    from agent_demo_kit.batch_folder import model_folder
    folders: Dict[str, str] = {}
    for model in models:
        other = folders.setdefault(model_folder(model), model)
        if other != model:
            raise ConfigError(f"-m {other} and -m {model} would share the folder {model_folder(model)}: name each"
                              " model once")


def each_model(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream, tasks: List[Any],
               notes: List[str]) -> int:
    """--batch FILE -m a -m b: the batch with each model in turn (one at a time: one endpoint, one limit
    on requests in flight), a folder each (under --out when given), then the models side by side. A
    batch stopped by Ctrl-C or an endpoint that fails everything stops the rest."""
    from agent_demo_kit import comparison, result_tables
    from agent_demo_kit.batch_folder import default_out, model_folder
    folders, worst = [], 0
    for model in args.models:
        each = argparse.Namespace(**{**vars(args), "model": model, "models": [model], "json": False,
                                     "out": str(Path(args.out) / model_folder(model)) if args.out else None})
        code = batch_of(each, environment, answer, tasks, list(notes))
        folders.append(each.out or str(default_out(args.batch, model)))
        worst = max(worst, code)
        if code not in (0, 1):  # interrupted, or the endpoint, the settings: the next model would meet it too
            return code
    compared = comparison.summarize(folders)
    if args.json:
        answer.write_json(compared)
    else:
        print(inert("\n".join([*([] if args.quiet else [""]), *result_tables.render_comparison(compared)])), file=answer)
    return worst


def batch_of(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream, tasks: List[Any],
             notes: List[str]) -> int:
    """The batch of these tasks with the settings the flags give."""
    from agent_demo_kit.batch import Batch
    scorers = None
    if args.scorer:  # files the user named: imported here, as a --tools-file is
        from agent_demo_kit.scorers import load_scorers
        scorers = load_scorers(args.scorer)
    judge = judge_of(args, environment) if args.judge is not None else None
    batch = Batch(tasks, Path(args.out) if args.out else None, given_settings(args), environment,
                  parallel=args.parallel,
                  retry_errors=DEFAULT_RETRY_ERRORS if args.retry_errors is None else args.retry_errors,
                  rerun_failed=args.rerun_failed, part=args.shard, quiet=args.quiet, named=flag_name, notes=notes,
                  match=args.match, repeat=args.repeat or 1, source=args.batch, command=args.command,
                  task_checks=args.task_checks, group_readable=args.group_readable, scorers=scorers,
                  judge=judge)
    with ending_on_sigterm():
        code, summary = batch.run(args.pass_rate)
    if args.json:
        answer.write_json(summary)
    return code


def judge_of(args: argparse.Namespace, environment: Dict[str, str]) -> Any:
    """--judge MODEL: the judge, with its rubric (--judge-rubric FILE) and its endpoint, key and price."""
    from agent_demo_kit.judge import MOST_RUBRIC_CHARS, RUBRIC, Judge, judge_settings
    rubric = RUBRIC
    if args.judge_rubric:
        try:
            with open(args.judge_rubric, encoding="utf-8") as file:
                rubric = file.read(MOST_RUBRIC_CHARS + 1).strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"--judge-rubric: cannot read {args.judge_rubric}:"
                              f" {getattr(error, 'strerror', None) or error}") from None
        if not rubric:
            raise ConfigError(f"--judge-rubric: {args.judge_rubric} is empty")
        if len(rubric) > MOST_RUBRIC_CHARS:  # every request carries it
            raise ConfigError(f"--judge-rubric: {args.judge_rubric} is longer than {MOST_RUBRIC_CHARS:,} characters;"
                              " a rubric says what makes an answer right, in a page")
    settings = load_settings(given_settings(args), environment, named=flag_name)
    return Judge(judge_settings(settings, args.judge, args.judge_url, environment.get("LLM_JUDGE_KEY") or None,
                                args.judge_price), rubric, tuple(secrets_of(environment, settings.url)))


def show_plan(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream, tasks: List[Any]) -> int:
    """--batch FILE --plan: what the batch would take (with each model, for several); nothing sent."""
    from agent_demo_kit.batch_folder import model_folder
    from agent_demo_kit.planning import render_plan
    several = len(args.models) > 1
    plans = [planned(argparse.Namespace(**{**vars(args), "model": model, "out": str(Path(args.out) / model_folder(
        model)) if args.out and several else args.out}), environment, tasks)
        for model in args.models or [args.model]]
    if args.json:
        answer.write_json([figures for figures, _ in plans] if several else plans[0][0])
    else:
        print("\n\n".join("\n".join(render_plan(figures, priced)) for figures, priced in plans), file=answer)
    return 0


def planned(args: argparse.Namespace, environment: Dict[str, str], tasks: List[Any]) -> Tuple[dict, bool]:
    """The figures of what one batch would take, from its folder's earlier results if any; and whether
    a price was given."""
    from agent_demo_kit import comparison
    from agent_demo_kit.batch_folder import (check_output_folder, check_output_parents, configuration, default_out,
                                             refuse_another_configuration, refuse_another_task_file)
    from agent_demo_kit.planning import plan
    settings = load_settings(given_settings(args), environment, named=flag_name, check_endpoint=False)  # no key yet
    sliced = tasks if args.shard is None else tasks[args.shard[0]::args.shard[1]]
    out = Path(args.out) if args.out else default_out(args.batch, settings.model)
    check_output_parents(out)  # what the batch itself would refuse, the plan refuses too
    if out.is_dir():
        check_output_folder(out)
        refuse_another_task_file(out, args.batch)
        refuse_another_configuration(out, comparison.read_results(out, sealed_only=True),
                                     {**configuration(settings), "task_checks": args.task_checks})
    try:
        earlier: Optional[dict] = comparison.summarize([str(out)]) if out.is_dir() else None
    except ConfigError:  # no results there yet: a guess then
        earlier = None
    return plan(sliced, settings, args.repeat or 1, earlier, args.significance or comparison.SIGNIFICANCE), \
        settings.price is not None


def show_summary(args: argparse.Namespace, environment: Dict[str, str], answer: SafeStream) -> int:
    """--summary [DIR...]: the figures of batch result folders (shards merged; configurations side by
    side), or of the run log folder; what failed, and how to run it again."""
    from agent_demo_kit import run_log  # the run log layer
    from agent_demo_kit import comparison, result_tables
    from agent_demo_kit.batch import summarize_runs
    from agent_demo_kit.metrics import render
    if args.baseline is not None:
        return show_gate(args, answer)
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
        shown = result_tables.render_comparison(summary, args.markdown)
    else:
        shown = result_tables.render_single(summary, args.markdown) if args.markdown else render(summary)
        if summary.get("not_sealed_by_you"):
            shown.append(result_tables.seal_note({"label": summary["folders"][0], **summary}))
        shown += comparison.render_failures(summary.get("failures") or [])
        shown = result_tables.as_markdown(shown) if args.markdown else shown
    # For people, piped or not: answers, ids and model names from results files are shown escaped.
    print(inert("\n".join(shown)), file=answer)
    if "configurations" not in summary and summary.get("failures") and summary.get("folders"):
        print(f"agent-demo: to run them again: {result_tables.rerun_command(summary)}", file=sys.stderr)
        if (summary.get("config") or {}).get("check") and (not summary.get("yours", True)
                                                          or summary.get("not_sealed_by_you")):
            print("agent-demo: (without the folder's --check: it is not yours, and a check is a command;"
                  " give one of your own if you want one)", file=sys.stderr)
    return 0


def show_gate(args: argparse.Namespace, answer: SafeStream) -> int:
    """--summary NEW --baseline OLD: the two side by side and the verdict; 1 when NEW is worse than the
    baseline by more than noise, else 0."""
    from agent_demo_kit import comparison, gate
    if not args.summary:
        raise ConfigError("--baseline: give --summary the folder of the new results (--summary NEW --baseline OLD)")
    gated = gate.gate(args.summary, args.baseline, args.significance or comparison.SIGNIFICANCE)
    if args.json:
        answer.write_json(gated)
    else:  # answers, ids and model names from results files are shown escaped
        print(inert("\n".join(gate.render_gate(gated, args.markdown))), file=answer)
    return 1 if gated["gate"]["verdict"] == "worse" else 0


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


def show_trend(args: argparse.Namespace, answer: SafeStream, redactor: Redactor) -> int:
    """--trend DIR...: the batch results over time, a row a folder in the order they ran; with --json as
    JSON, with --html as a report page (on stdout, or into -o FILE)."""
    from agent_demo_kit import trend
    trended = trend.trend(args.trend)
    if args.html:
        from agent_demo_kit import report_page
        return write_page(args.output, report_page.page(report_page.trend_data(trended), redactor), answer)
    if args.json:
        answer.write_json(trended)
    else:  # folder and model names from results files are shown escaped
        print(inert("\n".join(trend.render_trend(trended))), file=answer)
    return 0


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
