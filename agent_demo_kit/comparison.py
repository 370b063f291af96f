"""Figures across result folders: --summary DIR... reads each folder's results (shards merged: a task
counted once, its latest line), puts the results of one configuration together and those of
different configurations side by side, with the tasks where they differ and whether the difference
is more than noise; and the tasks that did not finish or were wrong, a screenful at most.

A results line says which configuration it came from (`config`: model, endpoint host, mode, tools,
system prompt, --max-rounds, check, --escalate), so two models' folders are never merged into one.
It imports records, seals, scoring and metrics.
"""
import json
import os
import re
import shlex
import stat
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from agent_demo_kit import metrics, scoring
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.records import number
from agent_demo_kit.seals import is_sealed
from agent_demo_kit.settings import MOST_TRIES
from agent_demo_kit.terminal import inert

Key = Tuple[str, int]  # a task's id and which of its tries (--repeat)

MOST_COLUMNS = 12  # configurations side by side in --summary and --report; the rest are said in one line
FAILURES_SHOWN = 20  # tasks listed at the end of a batch or a summary; --json has them all
DIFFERENCES_SHOWN = 20
ANSWER_SHOWN_CHARS = 60
SIGNIFICANCE = 0.05


def result_key(line: dict) -> Key:
    """Which task and which of its tries a results line is about."""
    repeat = line.get("repeat")
    return str(line.get("id")), repeat if isinstance(repeat, int) and not isinstance(repeat, bool) \
        and 0 < repeat <= MOST_TRIES else 1


def ended_key(line: dict) -> float:
    """When a results line's run ended, to keep the latest: its ISO 8601 time (or, in older lines, seconds
    since 1970); 0 for anything else."""
    value = line.get("ended_at")
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except (ValueError, OverflowError, OSError):
            return 0.0
    return float(number(value))


def success(line: dict) -> bool:
    """Did the task succeed: right, when it had an expected answer; else finished."""
    return line["correct"] if isinstance(line.get("correct"), bool) else line.get("status") == "finished"


# The files a batch writes in its output folder: results.jsonl and summary.json, or a shard's own.
OUTPUT_FILES = re.compile(r"(results|summary)(-\d+of\d+)?\.(jsonl|json)")


def results_files(folder: Path) -> List[Path]:
    """A folder's results files, shards' too: results.jsonl, results-0of4.jsonl, ... (no other name)."""
    try:
        return sorted(path for path in folder.iterdir()
                      if OUTPUT_FILES.fullmatch(path.name) and path.name.startswith("results") and path.suffix == ".jsonl")
    except OSError:
        return []


def read_results(folder: Path, sealed_only: bool = False) -> Dict[Key, dict]:
    """The latest line for each task and try in a folder's results files (shards included).
    Lines that cannot be read are passed by; with sealed_only, so are lines agent-demo did not write
    as this user (what a batch counts, its page and its summary.json show)."""
    latest: Dict[Key, dict] = {}
    for path in results_files(folder):
        for line in read_lines(path, sealed_only):
            key = result_key(line)
            known = latest.get(key)
            if known is None or ended_key(line) >= ended_key(known):
                latest[key] = line
    return latest


MAX_LINE_BYTES = 1 << 20  # a results line longer than this is damaged: passed by


def read_lines(path: Path, sealed_only: bool = False) -> Iterator[dict]:
    """The result lines of one results file (JSON objects with an id and a status); lines that cannot be
    read, or are longer than any line a batch writes, are passed by, and with sealed_only those that
    carry no seal of this user's. ConfigError for what is not a plain file (a link to /dev/zero, a
    FIFO): it would never end."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from None
    with open(fd, "rb") as results:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path} is not a plain file: results are read only from files")
        while True:
            text = results.readline(MAX_LINE_BYTES + 1)
            if not text:
                return
            if len(text) > MAX_LINE_BYTES:  # the rest of it is passed by too
                while text and not text.endswith(b"\n"):
                    text = results.readline(MAX_LINE_BYTES)
                continue
            try:
                line = json.loads(text.decode("utf-8", "replace"))
            except (ValueError, RecursionError):
                continue
            if isinstance(line, dict) and isinstance(line.get("id"), str) and isinstance(line.get("status"), str) \
                    and (not sealed_only or is_sealed(line)):
                yield line


def config_differences(recorded: Any, current: dict) -> List[str]:
    """What differs between a recorded configuration and this one, for people ("model small, now big")."""
    recorded = recorded if isinstance(recorded, dict) else {}
    return [f"{name} {shown(recorded.get(name))}, now {shown(current.get(name))}"
            for name in dict.fromkeys([*current, *recorded]) if recorded.get(name) != current.get(name)]


def shown(value: Any) -> str:
    if value is None:
        return "none"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


# --- --summary DIR... ------------------------------------------------------------------------------

class Column:
    """The results of one configuration: from one folder or several (shards of yours), or from one
    folder that is not yours (a colleague's is never merged with another: their lines would replace
    yours)."""

    def __init__(self, config: Optional[dict], yours: bool = True):
        self.config, self.folders, self.lines = config, [], {}  # type: Optional[dict], List[str], Dict[Key, dict]
        self.where: Dict[Key, str] = {}  # the folder each line came from: its trace is there
        self.yours = yours  # its folder is yours
        self.unsealed = 0  # lines not sealed by you: someone else wrote them, or changed them
        self.label = ""

    def add(self, folder: str, key: Key, line: dict) -> None:
        if folder not in self.folders:
            self.folders.append(folder)
        known = self.lines.get(key)
        if known is None or ended_key(line) >= ended_key(known):
            self.lines[key], self.where[key] = line, folder

    def count_seals(self) -> None:
        self.unsealed = sum(not is_sealed(line) for line in self.lines.values())

    def summary(self) -> dict:
        tries = max((key[1] for key in self.lines), default=1)
        tally = metrics.Tally(tries)
        for line in self.lines.values():
            tally.add(line)
        return tally.summary()


def folders_of(names: List[str], flag: str = "--summary") -> List[Path]:
    """The result folders named: each folder that holds results*.jsonl, or, for one that holds none,
    each of its subfolders that does (the default folders of several models: FILE-results/MODEL).
    ConfigError, said of `flag`, for a name that is neither."""
    found: List[Path] = []
    for name in dict.fromkeys(os.path.realpath(name) for name in names):  # a folder named twice is read once
        folder = Path(name)
        if not os.path.isdir(folder):  # False for a name too long too (Path.is_dir raises)
            raise ConfigError(f"{flag}: {name} is not a folder of batch results")
        inside = [folder] if results_files(folder) else sorted(
            sub for sub in folder.iterdir() if sub.is_dir() and results_files(sub))
        if not inside:
            raise ConfigError(f"{flag}: {name} holds no results*.jsonl with results in it")
        found += [sub for sub in inside if sub not in found]
    return found


class Columns(list):
    """The columns shown, at most MOST_COLUMNS, and what was left out: (configurations, lines)."""

    left_out = (0, 0)


def columns_of(names: List[str]) -> Columns:
    """The results of these folders, a column for each configuration (your shards of one merged; a
    folder that is not yours a column of its own), the first MOST_COLUMNS of them."""
    columns: Dict[str, Column] = {}
    for folder in folders_of(names):
        lines = read_results(folder)
        if not lines:
            raise ConfigError(f"--summary: {folder} holds no results*.jsonl with results in it")
        yours = is_yours(folder)
        for key, line in lines.items():
            config = line.get("config") if isinstance(line.get("config"), dict) else None
            # Results from before configurations were recorded, or in a folder not yours: each folder its own.
            name = json.dumps(config, sort_keys=True) if config is not None else f"folder {folder}"
            name = name if yours else f"{name} in {folder}"
            columns.setdefault(name, Column(config, yours)).add(str(folder), key, line)
    found = Columns(list(columns.values())[:MOST_COLUMNS])
    found.left_out = (len(columns) - len(found), sum(len(column.lines) for column in list(columns.values())[MOST_COLUMNS:]))
    for column in found:
        column.label = label(column, found)
        column.count_seals()
    return found


def is_yours(folder: Path) -> bool:
    """Is the folder yours (not another user's, whose lines are theirs to vouch for)?"""
    try:
        return not hasattr(os, "geteuid") or os.stat(folder).st_uid == os.geteuid()
    except OSError:
        return False


def label(column: Column, columns: List[Column]) -> str:
    """A column's name: its model, and what tells it apart from another column of the same model."""
    config = column.config or {}
    model = str(config.get("model") or os.path.basename(column.folders[0]))
    if not column.yours:  # a colleague's folder: named by where it is
        return f"{model} ({column.folders[0]})"
    twins = [other.config or {} for other in columns
             if other is not column and (other.config or {}).get("model", model) == model]
    if not twins:
        return model
    differ = [name for name in config if name != "model" and any(twin.get(name) != config.get(name) for twin in twins)]
    return f"{model} ({', '.join(f'{name} {shown(config.get(name))}' for name in differ)})" if differ \
        else f"{model} ({column.folders[0]})"


def summarize(names: List[str]) -> dict:
    """--summary DIR...: one configuration's summary (with its config and failures), or, for several,
    the comparison: a column each, the tasks where they differ, the paired tests."""
    columns = columns_of(names)
    if len(columns) == 1 and not columns.left_out[0]:
        column = columns[0]
        return {**column.summary(), "config": column.config, "folders": column.folders, "yours": column.yours,
                "not_sealed_by_you": column.unsealed, "failures": failures(column.lines.values())}
    return {**compare(columns), "left_out": {"configurations": columns.left_out[0], "lines": columns.left_out[1]}}


def compare(columns: List[Column], level: float = SIGNIFICANCE) -> dict:
    """Several configurations side by side; each paired test more than noise below `level`."""
    described = [{"label": column.label, "folders": column.folders, "config": column.config, "yours": column.yours,
                  "not_sealed_by_you": column.unsealed, "summary": column.summary(),
                  "failures": len(failures(column.lines.values()))} for column in columns]
    first_tries = [{key[0]: line for key, line in column.lines.items() if key[1] == 1} for column in columns]
    rates = [pass_rates(column) for column in columns]  # each task's share of tries that succeeded
    repeated = any(tried > 1 for column in rates for _, tried in column.values())
    ids = list(dict.fromkeys(ident for lines in first_tries for ident in lines))
    differences = []
    for ident in ids:
        lines = [lines.get(ident) for lines in first_tries]
        ran = [line for line in lines if line is not None]
        if len(ran) < 2:
            continue
        outcomes = {rate(column[ident]) for column in rates if ident in column} if repeated \
            else {success(line) for line in ran}
        statuses = {line.get("status") for line in ran}
        if len(outcomes) > 1 or len(statuses) > 1:
            differences.append({"id": ident, "outcome_differs": len(outcomes) > 1, "runs": [
                None if line is None else {"status": line.get("status"), "correct": line.get("correct"),
                                           "answer": one_line(line.get("answer")),
                                           "answered_in_words": line.get("answered_in_words") is True,
                                           **({"passed": "{}/{}".format(*column[ident])} if repeated else {})}
                for line, column in zip(lines, rates)]})
    differences.sort(key=lambda entry: not entry["outcome_differs"])  # a different outcome first
    tests = []
    for index in range(1, len(columns)):
        both = [(rate(rates[0][ident]), rate(rates[index][ident])) for ident in ids
                if ident in rates[0] and ident in rates[index]]
        only_first = sum(a > b for a, b in both)  # tasks the first passed more often (with one try: right alone)
        only_second = sum(b > a for a, b in both)
        p_value = scoring.paired_test(only_first, only_second)
        tests.append({"first": columns[0].label, "second": columns[index].label, "both_ran": len(both),
                      "only_first": only_first, "only_second": only_second, "p_value": float(f"{p_value:.3g}"),
                      "more_than_noise": p_value < level, "level": level,
                      "test": "exact sign test of the tasks' pass rates over every try" if repeated
                      else "exact McNemar test"})
    return {"configurations": described, "differences": differences, "tests": tests}


def pass_rates(column: "Column") -> Dict[str, tuple]:
    """Each task's (tries that succeeded, tries) in a column: every try, where --repeat made several."""
    rates: Dict[str, list] = {}
    for (ident, _), line in column.lines.items():
        counted = rates.setdefault(ident, [0, 0])
        counted[0] += success(line)
        counted[1] += 1
    return {ident: tuple(counted) for ident, counted in rates.items()}


def rate(counted: tuple) -> float:
    return counted[0] / counted[1]


def one_line(value: Any, chars: int = ANSWER_SHOWN_CHARS) -> str:
    """An answer cut to one short line."""
    if value is None:
        return ""
    text = " ".join((value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).split())
    return text if len(text) <= chars else text[:chars - 3] + "..."


# --- what failed --------------------------------------------------------------------------------

def failures(lines: Any) -> List[dict]:
    """The tasks that did not finish or were wrong, each with a line of why, in the order given."""
    found = []
    for line in lines:
        if not is_failure(line):
            continue
        if line.get("status") == "finished" and isinstance(line.get("asserts"), list):  # promptfoo's
            why = f"answered {one_line(line.get('answer'))!r}, failed " \
                  f"{one_line(scoring.asserts_said(line['asserts'], failed_only=True), 120)}"
        elif line.get("status") == "finished":
            why = f"answered {one_line(line.get('answer'))!r}, expected {one_line(line.get('expected'))!r}"
        else:
            why = one_line(line.get("error") or line.get("summary") or line.get("status"), 120)
        ident, repeat = result_key(line)
        found.append({"id": ident, **({"repeat": repeat} if repeat > 1 else {}), "status": line.get("status"),
                      "why": why})
    return found


def is_failure(line: dict) -> bool:
    """Did a task not finish, or finish wrong (what "failed or wrong" counts)?"""
    return not (line.get("status") == "finished" and line.get("correct") is not False)


def render_failures(found: List[dict], shown_at_most: int = FAILURES_SHOWN) -> List[str]:
    """The failures for people: a line each, a screenful at most."""
    if not found:
        return []
    lines = [f"{len(found)} task(s) did not finish or were wrong:"]
    for entry in found[:shown_at_most]:
        tried = f" (try {entry['repeat']})" if entry.get("repeat") else ""
        status = "wrong" if entry["status"] == "finished" else entry["status"]
        lines.append(f"  {entry['id']}{tried}: {status}: {entry['why']}")
    if len(found) > shown_at_most:
        lines.append(f"  ... and {len(found) - shown_at_most} more (--json lists them all)")
    return lines


# --- the comparison, for people ------------------------------------------------------------------

def render_comparison(data: dict, markdown: bool = False) -> List[str]:
    """The side-by-side table, the differing tasks and the tests, as text or as Markdown tables."""
    columns = data["configurations"]
    lines = table(["", *(column["label"] for column in columns)], figure_rows(columns), markdown)
    lines += [seal_note(column) for column in columns if column.get("not_sealed_by_you")]
    left_out = data.get("left_out") or {}
    if left_out.get("configurations"):
        lines.append(f"... and {left_out['configurations']} more configuration(s), {left_out['lines']} line(s), not shown:"
                     f" at most {MOST_COLUMNS} side by side; give fewer folders")
    differences = data["differences"]
    lines.append("")
    if differences:
        said = "pass rate over every try; answers of the first" if any(
            run and "passed" in run for entry in differences for run in entry["runs"]) else "first try"
        lines.append(f"{len(differences)} task(s) where they differ ({said}; a different outcome first):")
        body = [[entry["id"], *(run_cell(run) for run in entry["runs"])] for entry in differences[:DIFFERENCES_SHOWN]]
        lines += table(["task", *(column["label"] for column in columns)], body, markdown)
        if len(differences) > DIFFERENCES_SHOWN:
            lines.append(f"... and {len(differences) - DIFFERENCES_SHOWN} more (--json lists them all)")
    else:
        lines.append("no task where they differ")
    lines.append("")
    lines += test_lines(data["tests"])
    return as_markdown(lines) if markdown else lines


def test_lines(tests: List[dict]) -> List[str]:
    """Each paired test in words: the same on the terminal, in Markdown and on the report page."""
    lines = []
    for test in tests:
        test = {**test, "first": table_cell(test["first"]), "second": table_cell(test["second"])}  # on one line
        verdict = "more than noise" if test["more_than_noise"] else "could be noise"
        if test.get("test", "exact McNemar test") == "exact McNemar test":
            lines.append(f"{test['second']} vs {test['first']}: on {test['both_ran']} task(s) both ran, right only with"
                         f" {test['second']} {test['only_second']}, only with {test['first']} {test['only_first']};"
                         f" exact McNemar test p = {test['p_value']:.3g} ({verdict} at"
                         f" {test.get('level', SIGNIFICANCE):g})")
        else:
            lines.append(f"{test['second']} vs {test['first']}: on {test['both_ran']} task(s) both ran, passed more"
                         f" often with {test['second']} {test['only_second']}, with {test['first']}"
                         f" {test['only_first']}; {test['test']} p = {test['p_value']:.3g} ({verdict} at"
                         f" {test.get('level', SIGNIFICANCE):g})")
    return lines


def seal_note(column: dict) -> str:
    """What a column's lines that carry no seal of yours are."""
    return (f"{table_cell(column['label'])}: {column['not_sealed_by_you']} line(s) not sealed by you (written by"
            " another user, or changed since): their figures are that folder's word, not your results")


FIGURES = ("tasks", "completion", "accuracy", "pass@1 / pass^k", "rounds (mean)", "tokens", "cost", "time p50",
           "time p95", "failed or wrong")


def render_single(summary: dict, markdown: bool = True) -> List[str]:
    """One configuration's figures as a table (Markdown, to paste into a pull request)."""
    column = {"summary": summary, "failures": len(summary.get("failures") or [])}
    return table(["", str((summary.get("config") or {}).get("model") or "runs")], figure_rows([column]), markdown)


def rerun_command(summary: dict) -> str:
    """The command that runs a folder's failed and wrong tasks again, with the flags of its configuration;
    never a check from a folder that is not yours, or from lines you did not seal (a command someone
    else wrote, such as curl ... | sh)."""
    config, folder = summary.get("config") or {}, summary["folders"][0]
    tasks_file = None
    try:
        with open(os.path.join(folder, "summary.json"), encoding="utf-8") as file:
            tasks_file = json.load(file).get("tasks_file")
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    words = ["agent-demo", "--batch", str(tasks_file or "FILE"), "--out", folder]
    if config.get("model"):
        words += ["-m", str(config["model"])]
    trusted = summary.get("yours", True) and not summary.get("not_sealed_by_you")
    for name, flag in (("mode", "--mode"), ("max_rounds", "--max-rounds"), ("check", "--check"),
                       ("escalate", "--escalate")):
        if name == "check" and not trusted:
            continue
        if config.get(name) is not None and not (name == "mode" and config[name] == "json"):
            words += [flag, str(config[name])]
    tools = config.get("tools") if isinstance(config.get("tools"), list) else []
    named = [str(tool) for tool in tools if not str(tool).startswith(("file ", "mcp ", "mcp-config "))]
    if named and named != ["all"]:  # --tools: a folder of other tools is another configuration
        words += ["--tools", ",".join(named)]
    tries = (summary.get("repeats") or {}).get("tries")
    if tries and tries > 1:
        words += ["--repeat", str(tries)]
    return shlex.join(words + ["--rerun-failed"])


def figure_rows(columns: List[dict]) -> List[List[str]]:
    """The figures of these columns (each a summary and its count of failures), a row a figure and a
    cell a column, without the rows none of them has: the same on the terminal, in Markdown and on the
    report page."""
    rows = [[name, *(cell(column, name) for column in columns)] for name in figure_names(columns)]
    return [row for row in rows if any(value != "n/a" for value in row[1:])]


def figure_names(columns: List[dict]) -> List[str]:
    """The rows of a table of these columns: the figures, then each --scorer's score, the --judge's cost
    and each group of the tasks' metadata that one of them has."""
    names = list(FIGURES)
    for column in columns:
        summary = column["summary"]
        names += [f"score {name}" for name in summary.get("scores") or {} if f"score {name}" not in names]
        names += ["judge"] if summary.get("judge") and "judge" not in names else []
        names += ["scorer failed"] if summary.get("scorer_errors") and "scorer failed" not in names else []
        names += [f"by {key}: {value}" for key, values in (summary.get("groups") or {}).items()
                  for value in values if f"by {key}: {value}" not in names]
    return names


def cell(column: dict, name: str) -> str:
    """One figure of a column."""
    summary = column["summary"]
    if name.startswith("score "):
        score = (summary.get("scores") or {}).get(name[len("score "):])
        return "n/a" if not score else f"{score['mean']:.3g} ({score['runs']} runs)"
    if name == "judge":  # what the --judge model cost, apart from the runs'
        judged = summary.get("judge")
        return "n/a" if not judged else f"{judged['runs']} graded, {judged['tokens']['total']:,} tokens" + (
            f", {metrics.dollars(judged['cost'])}" if judged.get("cost") is not None else "") + (
            f", {judged['errors']} it could not grade" if judged.get("errors") else "")
    if name == "scorer failed":
        return f"{summary['scorer_errors']} run(s)" if summary.get("scorer_errors") else "n/a"
    if name.startswith("by "):
        key, _, value = name[len("by "):].partition(": ")
        group = ((summary.get("groups") or {}).get(key) or {}).get(value)
        if not group:
            return "n/a"
        return f"{group['accuracy']:.1%} of {group['scored']}" if group["scored"] else \
            f"{group['success_rate']:.1%} succeeded of {group['runs']}"
    runs = summary.get("runs", summary["tasks"])
    if name == "tasks":  # with --repeat, how many runs too: the figures below count runs
        return str(summary["tasks"]) + (f" ({runs} runs)" if runs != summary["tasks"] else "")
    if name == "failed or wrong":
        return str(column["failures"]) + (" runs" if runs != summary["tasks"] else "")
    share = lambda value: "n/a" if value is None else f"{value:.1%}"  # noqa: E731
    if name == "completion":
        return share(summary["completion_rate"])
    if name == "accuracy":
        if not summary.get("scored"):
            return "n/a"
        low, high = summary["accuracy_interval"]
        return f"{share(summary['accuracy'])} ({share(low)}-{share(high)})"
    if name == "pass@1 / pass^k":
        repeated = summary.get("repeats")
        return f"{share(repeated['pass_at_1'])} / {share(repeated['pass_all'])}" if repeated else "n/a"
    if name == "rounds (mean)":
        return f"{summary['rounds']['mean']:g}"
    if name == "tokens":
        return f"{summary['tokens']['total']:,}"
    if name == "cost":
        return "n/a" if summary.get("cost") is None else metrics.dollars(summary["cost"])
    return f"{summary['seconds'][name[-3:]]:.3g} s"  # time p50, time p95


def run_cell(run: Optional[dict]) -> str:
    """How one configuration did on one task: its status or correctness, and its answer."""
    if run is None:
        return "-"
    said = "right" if run["correct"] is True else "wrong" if run["correct"] is False else run["status"]
    if run["status"] != "finished" and run["correct"] is not None:
        said = run["status"]
    if run.get("answered_in_words") and run["status"] == "finished":  # no finish call: words taken as the answer
        said += " (in words)"
    if run.get("passed"):
        said = f"passed {run['passed']} tries, first {said}"
    return f"{said}: {run['answer']}" if run["answer"] else said


class Markdown(str):
    """A line written as Markdown already (a table's row: its | are the table's, its cells escaped)."""


# What Markdown (GitHub's, in a pull request) would read as markup: HTML, emphasis, code, a link or image
# (each needs a "]"), a heading, a table's cell border, a mention of someone; each is written as a character
# reference, which shows as the character. A backslash stays: all it could escape here is a reference's "&".
MARKDOWN_MARKUP = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;",
                                 **{character: f"&#{ord(character)};" for character in "`*_]|@#~"}})


def markdown_text(text: str) -> str:
    """Text from the results (an id, an answer, a label, metadata) that reads as itself in Markdown, on
    one line (a line break in a model's name would end a table row, or start a heading)."""
    return " ".join(inert(str(text)).translate(MARKDOWN_MARKUP).splitlines())


def as_markdown(lines: List[str]) -> List[str]:
    """Lines for a Markdown document: the ones written as Markdown as they are, every other line escaped,
    and a blank line between a table and what follows it (else it would be the table's next row)."""
    done: List[str] = []
    for line in lines:
        if not isinstance(line, Markdown) and line and done and done[-1].startswith("|"):
            done.append(Markdown(""))
        done.append(line if isinstance(line, Markdown) else Markdown(markdown_text(line)))
    return done


def table_cell(cell: Any) -> str:
    """A cell shown inert and on one line: a line break in a name from a results file would start a
    row of its own (a forged one)."""
    return inert(str(cell)).replace("\n", "\\n").replace("\t", "\\t")


def table(header: List[str], body: List[List[str]], markdown: bool) -> List[str]:
    """Rows as aligned text, or as a Markdown table (each cell escaped); what came from outside shown inert,
    before the columns are measured."""
    if markdown:
        return [Markdown(f"| {' | '.join(map(markdown_text, header))} |"), Markdown(f"|{'---|' * len(header)}"),
                *(Markdown(f"| {' | '.join(map(markdown_text, row))} |") for row in body)]
    header, body = [table_cell(cell) for cell in header], [[table_cell(cell) for cell in row] for row in body]
    widths = [max(len(str(row[index])) for row in [header, *body]) for index in range(len(header))]
    return ["  ".join(str(value).ljust(width) for value, width in zip(row, widths)).rstrip()
            for row in [header, *body]]
