"""Figures over time (--trend DIR...): each result folder is a batch, dated by when its first task
ended (the earliest `ended_at` of its results lines), and gets a row in the order they ran: its
model, tasks, accuracy and its interval, tokens and cost, counted as --summary counts that folder.
Folders that do not hold the same tasks are shown, and said to be: accuracy over different tasks is
not a trend. (The run log keeps single runs, with nothing expected of them, not batches.)

It imports comparison, result_tables, metrics and endings.
"""
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from agent_demo_kit import metrics
from agent_demo_kit.comparison import Column, ended_key, folders_of, is_yours, read_results
from agent_demo_kit.result_tables import seal_note, table
from agent_demo_kit.endings import ConfigError

LATEST_TIME = 1e11  # seconds since 1970 (the year 5138): a later ended_at is no time a batch ran
COLUMNS = ["when", "model", "tasks", "accuracy", "95% interval", "tokens", "cost"]


def trend(names: List[str]) -> dict:
    """--trend DIR...: a row a batch (a folder, or each configuration of a folder that holds several), in the
    order they ran; the models in the order they first ran; how many different sets of tasks the rows
    hold (a task set: the tasks' ids, texts and expected answers). ConfigError naming a folder that
    does not say when it ran."""
    dated: List[Tuple[float, dict]] = []
    for folder in folders_of(names, "--trend"):
        columns: Dict[str, Column] = {}
        yours = is_yours(folder)
        for key, line in read_results(folder).items():
            config = line.get("config") if isinstance(line.get("config"), dict) else None
            columns.setdefault(json.dumps(config, sort_keys=True), Column(config, yours)).add(str(folder), key, line)
        if not columns:
            raise ConfigError(f"--trend: {folder} holds no results*.jsonl with results in it")
        dated += [batch_row(folder, column) for column in columns.values()]
    dated.sort(key=lambda item: (item[0], item[1]["model"], item[1]["folder"]))
    sets: Dict[Any, int] = {}
    rows = []
    for _, row in dated:
        row["task_set"] = sets.setdefault(row.pop("tasks_held"), len(sets) + 1)
        rows.append(row)
    return {"rows": rows, "models": list(dict.fromkeys(row["model"] for row in rows)), "task_sets": len(sets),
            "same_tasks": len(sets) <= 1}


def batch_row(folder: Path, column: Column) -> Tuple[float, dict]:
    """When a folder's batch (one configuration's lines) ran, and its row."""
    ended = sorted(when for when in map(ended_key, column.lines.values()) if 0 < when < LATEST_TIME)
    if not ended:
        raise ConfigError(f"--trend: {folder} does not say when it ran (no results line has an ended_at): leave it"
                          " out, or see it with --summary")
    summary = column.summary()
    config = column.config or {}
    column.count_seals()
    held = frozenset((key[0], str(line.get("task_hash")), json.dumps(  # a task, and how its answer was judged
        [line.get("expected"), line.get("match"), [(each.get("type"), each.get("value")) for each in line["asserts"]
                                                   if isinstance(each, dict)] if isinstance(line.get("asserts"), list)
         else None], sort_keys=True, default=str)) for key, line in column.lines.items())
    return ended[0], {
        "first_ended_at": iso(ended[0]), "last_ended_at": iso(ended[-1]),
        "model": str(config.get("model") or folder.name), "folder": str(folder), "config": column.config,
        "tasks": summary["tasks"], "runs": summary["runs"], "scored": summary["scored"], "correct": summary["correct"],
        "accuracy": summary["accuracy"], "accuracy_interval": summary["accuracy_interval"],
        "tokens": summary["tokens"]["total"], "cost": summary["cost"],
        **({"repeats": summary["repeats"]} if summary.get("repeats") else {}), "yours": column.yours,
        "not_sealed_by_you": column.unsealed, "tasks_held": held}


def iso(seconds: float) -> str:
    """A time as results lines write it: ISO 8601, UTC, to the millisecond."""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")


def when_shown(written: str) -> str:
    """An ISO 8601 time as people read it: the date and the minute, in local time."""
    return datetime.fromisoformat(written).astimezone().strftime("%Y-%m-%d %H:%M")


def row_cells(row: dict) -> List[str]:
    """A batch's row in words, as the terminal and the page show it."""
    def share(value: Optional[float]) -> str:
        return "n/a" if value is None else f"{value:.1%}"
    interval = row["accuracy_interval"] if row["scored"] else None
    return [when_shown(row["first_ended_at"]), row["model"],
            str(row["tasks"]) + (f" ({row['runs']} runs)" if row["runs"] != row["tasks"] else ""),
            share(row["accuracy"]) if row["scored"] else "n/a",
            f"{share(interval[0])}-{share(interval[1])}" if interval else "n/a", f"{row['tokens']:,}",
            "n/a" if row["cost"] is None else metrics.dollars(row["cost"])]


def header(data: dict) -> List[str]:
    """The table's columns: a task set's only when the rows hold more than one."""
    return [*COLUMNS, *(["task set"] if not data["same_tasks"] else []), "folder"]


def cells(data: dict, row: dict) -> List[str]:
    """A row's cells under header(data)."""
    return [*row_cells(row), *([str(row["task_set"])] if not data["same_tasks"] else []), shown_folder(row["folder"])]


def shown_folder(folder: str) -> str:
    """A folder as people named it: from the current folder when it is inside it, else in full."""
    inside = os.path.relpath(folder)
    return folder if inside.startswith("..") else inside


def notes(data: dict) -> List[str]:
    """What is said under the rows: that they are not all of the same tasks, and which folders hold lines
    you did not seal (their figures are that folder's word)."""
    return ([] if data["same_tasks"] else [
        f"not all of the same tasks: {data['task_sets']} task sets (the column \"task set\"); accuracy over different"
        " tasks is not a trend: compare the rows of one task set"]) + [
        seal_note({"label": shown_folder(row["folder"]), **row}) for row in data["rows"] if row["not_sealed_by_you"]]


def render_trend(data: dict) -> List[str]:
    """The rows as a plain table, in the order the batches ran; then what is said of them, if anything."""
    lines = table(header(data), [cells(data, row) for row in data["rows"]], markdown=False)
    said = notes(data)
    return lines + (["", *said] if said else [])
