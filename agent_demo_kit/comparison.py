"""Figures across result folders: --summary DIR... reads each folder's results (shards merged: a task
counted once, its latest line), puts the results of one configuration together and those of
different configurations side by side, with the tasks where they differ and whether the difference
is more than noise; and the tasks that did not finish or were wrong, a screenful at most. How they
are shown to people, as text or Markdown, is result_tables.py's.

A results line says which configuration it came from (`config`: model, endpoint host, mode, tools,
system prompt, --max-rounds, check, --escalate), so two models' folders are never merged into one.
It imports records, seals, scoring and metrics.
"""
import json
import os
import re
import stat
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from agent_demo_kit import metrics, scoring
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.records import number
from agent_demo_kit.seals import is_sealed
from agent_demo_kit.settings import MOST_TRIES

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
