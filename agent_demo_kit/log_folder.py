"""The run log folder: one trace file per run, per user, listed by --runs and found by --resume.

$AGENT_DEMO_LOG_DIR, else $XDG_STATE_HOME/agent-demo/runs, else ~/.local/state/agent-demo/runs.
The folder is checked like ~/.ssh before any use (private_files.py); files are readable only by
the user; the oldest beyond KEEP_RUNS are pruned; a run still going holds a lock on its file.
"""
import json
import math
import os
import re
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Dict, List, Optional

from agent_demo_kit.endings import ConfigError, RunResult
from agent_demo_kit.private_files import checked_folder, private_folder

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None

KEEP_RUNS = 500
RESUMABLE = {"max_rounds", "budget", "stuck", "error", "interrupted"}  # not finished, not failed
_TAIL_BYTES = 256 * 1024  # the end record and the last rounds are found here, however long the run


def can_resume(outcome: RunResult) -> bool:
    """Can --resume take the run further? Not once it finished or failed, not after a usage or
    configuration error (nothing was sent, or the flags must change first), and not when a refused
    key stopped it before its first round: going on would only start it again."""
    return (outcome.status in RESUMABLE and outcome.exit_code != 2
            and not (outcome.key_refused and outcome.rounds == 0))


def lock(trace: IO) -> bool:
    """Mark an open trace file as in use by this run, for as long as it stays open (on systems
    with flock); False if another run holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(trace.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def in_use(path: Path) -> bool:
    """Is a run still writing this file?"""
    try:
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))) as trace:
            return not lock(trace)
    except OSError:
        return False


def log_dir(environment: Dict[str, str]) -> Path:
    """Where this user's runs are kept."""
    if environment.get("AGENT_DEMO_LOG_DIR"):
        return Path(environment["AGENT_DEMO_LOG_DIR"]).expanduser()
    state = environment.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "agent-demo" / "runs"


def new_run_path(folder: Path) -> Path:
    """A fresh file name for a new run (its start time, then a few random letters), in the folder
    made (0700, parents too) or checked."""
    private_folder(folder)
    return folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.jsonl"


_OUR_NAME = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}\.jsonl")  # what new_run_path names a file


def prune(folder: Path, keep: int = KEEP_RUNS) -> None:
    """Delete our oldest run files beyond `keep`; files named otherwise are not ours to delete."""
    ours = [path for path in _run_files(folder) if _OUR_NAME.fullmatch(path.name)]
    for old in ours[keep:]:
        try:
            old.unlink()
        except OSError:
            pass  # another run removed it, or it is not ours to remove


def _run_files(folder: Path) -> List[Path]:
    """The folder's run files, newest first (by last write: a resumed run counts as recent)."""
    try:
        files = [path for path in folder.glob("*.jsonl") if path.is_file()]
    except OSError:
        return []
    return sorted(files, key=lambda path: (_mtime(path), path.name), reverse=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


@dataclass
class RunSummary:
    """One line of --runs: how a run stands, from its first and last records."""

    path: Path
    started: float
    status: str  # an end status, or "unfinished" for a run killed before its end record
    rounds: int
    tokens: Optional[int]
    task: str
    goes_on: bool = True  # False when its end record says --resume cannot take it further

    @property
    def resumable(self) -> bool:
        return (self.status in RESUMABLE or self.status == "unfinished") and self.goes_on


def summarize(path: Path) -> Optional[RunSummary]:
    """How the last run in a trace file stands, read from its first line and its tail; None if not a trace."""
    try:
        with open(path, "rb") as trace:
            first = trace.readline(_TAIL_BYTES)  # a task with megabytes of piped material: its start is enough
            size = trace.seek(0, os.SEEK_END)
            trace.seek(max(0, size - _TAIL_BYTES))
            tail = trace.read().split(b"\n")
    except OSError:
        return None
    head = _record(first) if first.endswith(b"\n") else _long_start(first)
    records = [head, *(_record(line) for line in tail)]
    records = [record for record in records if record]
    start = next((r for r in reversed(records) if r.get("event") == "start"), None)
    if not start:
        return None
    after_start = records[len(records) - 1 - records[::-1].index(start):]
    status, rounds, tokens, goes_on = "unfinished", 0, None, True
    for record in after_start:
        if record.get("event") == "round" and isinstance(record.get("round"), int):
            rounds, status, goes_on = record["round"], "unfinished", True
        elif record.get("event") in ("resume", "start", "follow_up"):
            status, goes_on = "unfinished", True
        elif record.get("event") == "end":
            status, rounds = str(record.get("status")), record.get("rounds") or rounds
            goes_on = record.get("resumable") is not False
            usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
            tokens = usage.get("total_tokens") if isinstance(usage.get("total_tokens"), int) else None
    started = start.get("ts")
    if not (isinstance(started, (int, float)) and math.isfinite(started) and 0 <= started < 1e11):
        started = _mtime(path)
    return RunSummary(path, started, status, rounds if isinstance(rounds, int) else 0, tokens,
                      str(start.get("task") or ""), goes_on)


def _long_start(head: bytes) -> Optional[dict]:
    """The start record of a run whose first line is too long to read whole: its task's beginning."""
    if not head.startswith(b'{"event": "start"'):
        return None
    match = re.search(rb'"task": "((?:[^"\\]|\\.){0,200})', head)
    task = match[1].decode("utf-8", errors="replace") if match else ""
    return {"event": "start", "task": task + "…"}


def _record(line: bytes) -> Optional[dict]:
    try:
        record = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def recent_runs(folder: Path, limit: int = 20) -> List[RunSummary]:
    """The newest runs first."""
    summaries = (summarize(path) for path in _run_files(folder))
    return [summary for summary in summaries if summary][:limit]


def latest_unfinished(folder: Path) -> Optional[Path]:
    """The most recent run that can go on, or None."""
    for path in _run_files(folder):
        summary = summarize(path)
        if summary and summary.resumable and not in_use(path):
            return path
    return None


def render_runs(runs: List[RunSummary], folder: Path, ids: Optional[Dict[Path, str]] = None,
                width: int = 80) -> str:
    """The --runs table in `width` columns: the run's id, when it started, status, rounds, tokens,
    the task's first words; then the folder, once."""
    if not runs:
        return f"no runs yet in {folder}"
    ids = ids or {run.path: run_id(run.path) for run in runs}
    id_width = max(3, *(len(ids[run.path]) for run in runs))
    this_year = time.strftime("%Y")
    rows = [(f"{'run':<{id_width}}  {'when':<11}  {'status':<11}  {'rounds':>6}  {'tokens':>7}  ", "task")]
    for run in runs:
        started = time.localtime(run.started)
        when = time.strftime("%m-%d %H:%M" if time.strftime("%Y", started) == this_year else "%Y-%m-%d", started)
        tokens = "-" if run.tokens is None else str(run.tokens) if run.tokens < 10**7 else f"{run.tokens // 10**6}M"
        rows.append((f"{ids[run.path]:<{id_width}}  {when:<11}  {run.status:<11}  {run.rounds:>6}  {tokens:>7}  ",
                     " ".join(run.task.split())))
    room = max(10, width - len(rows[0][0]))
    lines = [columns + (words if len(words) <= room else words[:room - 1] + "…") for columns, words in rows]
    return "\n".join([*lines, f"runs in {folder}",
                      'agent-demo --resume RUN goes on with a run; --continue RUN "..." follows one up'])


def new_log_file(environment: Dict[str, str]) -> str:
    """A new file in the run log folder, or ConfigError saying how to do without."""
    folder = log_dir(environment)
    try:
        return str(new_run_path(folder))
    except OSError as error:
        raise ConfigError(f"cannot create the run log folder {folder}: {error.strerror or error};"
                          " set AGENT_DEMO_LOG_DIR, or use --no-log or --trace FILE") from None


def latest_run(environment: Dict[str, str]) -> str:
    """The most recent unfinished run in the run log folder, for --resume without a file."""
    folder = log_dir(environment)
    path = latest_unfinished(folder) if checked_folder(folder) else None
    if path is None:
        raise ConfigError(f"--resume: no unfinished run in {folder}; name a trace file: --resume FILE")
    return str(path)


def list_runs(environment: Dict[str, str]) -> int:
    """--runs: print the recent runs in the run log folder, newest first, as wide as the terminal
    (80 columns into a pipe or a file)."""
    folder = log_dir(environment)
    checked_folder(folder)
    runs = recent_runs(folder)
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 80
    print(render_runs(runs, folder, short_ids(runs, _run_files(folder)), width))
    return 0


# --- naming a run: --resume RUN, --continue RUN ------------------------------------------------

def run_id(path: Path) -> str:
    """A run's id: its file's name without .jsonl (20261201-010203-a1b2c3)."""
    return Path(path).stem


def _short_id(path: Path) -> str:
    """The random letters that end our file names (a1b2c3); the whole id for a file named otherwise."""
    return path.stem[16:] if _OUR_NAME.fullmatch(path.name) else path.stem


def _matching(key: str, files: List[Path]) -> List[Path]:
    """The run files an id names: the one it is exactly, else those it is the start of (or of their short id)."""
    exact = [path for path in files if path.stem == key]
    return exact or [path for path in files if path.stem.startswith(key) or _short_id(path).startswith(key)]


def short_ids(runs: List[RunSummary], files: List[Path]) -> Dict[Path, str]:
    """How --runs names each run: its short id where that names no other run in the folder, else its id."""
    return {run.path: _short_id(run.path) if _matching(_short_id(run.path), files) == [run.path]
            else run_id(run.path) for run in runs}


def looks_like_a_run(text: str) -> bool:
    """Is this a run's name rather than words: a short id, an id or the start of one from its date on,
    a file name ending in .jsonl, or a path?"""
    return bool(re.fullmatch(r"[0-9a-f]{6}|\d{8}(-\d{1,6}(-[0-9a-f]{0,6})?)?|\S+\.jsonl", text)
                or "/" in text or os.sep in text)


def find_run(name: str, environment: Dict[str, str], flag: str) -> str:
    """The trace file that `flag NAME` names: a path or a file here as it is, else the run in the run
    log folder with that file name, id, short id or the start of one; ConfigError if none or several."""
    if "/" in name or os.sep in name or os.path.isfile(name):
        return name
    folder = log_dir(environment)
    key = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
    found = _matching(key, _run_files(folder))
    if len(found) == 1:
        return str(found[0])
    if not found:
        raise ConfigError(f"{flag} {name}: no run {key} in {folder}, and no file {name} here"
                          " (agent-demo --runs lists the runs)")
    shown = ", ".join(run_id(path) for path in found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    raise ConfigError(f"{flag} {name}: {len(found)} runs match: {shown}; give more of the id")


def latest_to_follow_up(environment: Dict[str, str]) -> str:
    """The most recent run with a round to follow up on, finished or not, that no run is writing (--continue)."""
    folder = log_dir(environment)
    for path in _run_files(folder):
        summary = summarize(path)
        if summary and summary.rounds and not in_use(path):
            return str(path)
    raise ConfigError(f"--continue: no run with a round to follow up on in {folder}; name one: --continue RUN")


def pick_run(name: str, environment: Dict[str, str], flag: str) -> str:
    """The trace file `flag [NAME]` is about: the run NAME names, else the most recent that flag can take."""
    if name:
        return find_run(name, environment, flag)
    return latest_run(environment) if flag == "--resume" else latest_to_follow_up(environment)
