"""The run log folder: one trace file a run, a user's own ($AGENT_DEMO_LOG_DIR, else
$XDG_STATE_HOME/agent-demo/runs, else ~/.local/state/agent-demo/runs), checked like ~/.ssh, the
oldest beyond KEEP_RUNS pruned; listed by --runs, searched by --resume, --continue and --show, a
run named by its id.

It reads trace files through trace_file.py. It imports records, endings, private_files, settings,
terminal and trace_file.
"""
import math
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from agent_demo_kit import prompts
from agent_demo_kit.actions import parse_actions
from agent_demo_kit.conversation import truncate_result
from agent_demo_kit.endings import RESUMABLE, ConfigError, RunResult, ending_of
from agent_demo_kit.private_files import checked_folder, in_use, private_folder
from agent_demo_kit.records import Compaction, Reply, Round, is_count, to_json, total_usage
from agent_demo_kit.settings import Settings
from agent_demo_kit.terminal import columns, first_columns
from agent_demo_kit import trace_file
from agent_demo_kit.prompts import MATERIAL_HEADER


KEEP_RUNS = 500


_TAIL_BYTES = 256 * 1024  # the end record and the last rounds are found here, however long the run


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
    ours = [path for path in run_files(folder) if _OUR_NAME.fullmatch(path.name)]
    for old in ours[keep:]:
        try:
            old.unlink()
        except OSError:
            pass  # another run removed it, or it is not ours to remove


def run_files(folder: Path) -> List[Path]:
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
    answer: str = ""  # its answer, or why it ended: the reason it gave up, the error, its last words

    @property
    def resumable(self) -> bool:
        return (self.status in RESUMABLE or self.status == "unfinished") and self.goes_on

    def to_json(self, short_id: str) -> dict:
        """The run as --runs --json lists it."""
        return {"id": short_id, "run_id": run_id(self.path), "started": time.strftime(
                    "%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)), "status": self.status,
                "rounds": self.rounds, "tokens": self.tokens, "task": self.task, "answer": self.answer,
                "trace": str(self.path)}


def summarize(path: Path) -> Optional[RunSummary]:
    """How the last run in a trace file stands, read from its first line and its tail; None if not a trace."""
    records = trace_file.head_and_tail(path, _TAIL_BYTES)
    after_start = trace_file.last_run(records)
    if not after_start:
        return None
    start = after_start[0]
    status, rounds, tokens, goes_on, answer = "unfinished", 0, None, True, ""
    for record in after_start:
        event = trace_file.event_of(record)
        if event == trace_file.ROUND and isinstance(record.get("round"), int):
            rounds, status, goes_on, answer = record["round"], "unfinished", True, ""
            usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
            if is_count(usage.get("total_tokens")):
                tokens = (tokens or 0) + usage["total_tokens"]
        elif event in trace_file.SETS_UP:
            status, goes_on, answer = "unfinished", True, ""
        elif event == trace_file.END:
            status, rounds, tokens = str(record.get("status")), record.get("rounds") or rounds, None
            goes_on = record.get("resumable") is not False
            usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
            tokens = usage.get("total_tokens") if isinstance(usage.get("total_tokens"), int) else None
            said = record.get("result") if status in ("finished", "failed") else \
                record.get("error") or record.get("last_words")
            answer = "" if said is None else said if isinstance(said, str) else to_json(said)
    started = start.get("ts")
    if not (isinstance(started, (int, float)) and math.isfinite(started) and 0 <= started < 1e11):
        started = _mtime(path)
    task = str(start.get("task") or "").split(MATERIAL_HEADER)[0].rstrip()  # the words asked, not the material
    return RunSummary(path, started, status, rounds if isinstance(rounds, int) else 0, tokens, task, goes_on, answer)


def recent_runs(folder: Path, limit: int = 20, status: Optional[str] = None) -> List[RunSummary]:
    """The newest runs first, at most `limit`, only those that ended with `status` when it is given."""
    summaries = (summarize(path) for path in run_files(folder))
    return [summary for summary in summaries if summary and status in (None, summary.status)][:limit]


def latest_unfinished(folder: Path) -> Optional[Path]:
    """The most recent run that can go on, or None."""
    for path in run_files(folder):
        summary = summarize(path)
        if summary and summary.resumable and not in_use(path):
            return path
    return None


def render_runs(runs: List[RunSummary], folder: Path, ids: Optional[Dict[Path, str]] = None,
                width: int = 80) -> str:
    """The --runs table in `width` columns, a line a run: its id, when it started, status, rounds,
    tokens, the task's first words and its answer (or why it ended); then the folder, once."""
    if not runs:
        return f"no runs yet in {folder}"
    ids = ids or {run.path: run_id(run.path) for run in runs}
    id_width = max(3, *(len(ids[run.path]) for run in runs))
    this_year = time.strftime("%Y")
    rows = [(f"{'run':<{id_width}}  {'when':<11}  {'status':<11}  {'rounds':>6}  {'tokens':>7}  ", "task → answer")]
    for run in runs:
        started = time.localtime(run.started)
        when = time.strftime("%m-%d %H:%M" if time.strftime("%Y", started) == this_year else "%Y-%m-%d", started)
        tokens = "-" if run.tokens is None else str(run.tokens) if run.tokens < 10**7 else f"{run.tokens // 10**6}M"
        rows.append((f"{ids[run.path]:<{id_width}}  {when:<11}  {run.status:<11}  {run.rounds:>6}  {tokens:>7}  ",
                     one_line(run.task, run.answer, max(10, width - id_width - 45))))
    lines = [columns + words for columns, words in rows]
    return "\n".join([*lines, f"runs in {folder}",
                      'agent-demo --resume RUN goes on with a run; --continue RUN "..." follows one up'])


def one_line(task: str, answer: str, room: int) -> str:
    """A task and its answer in `room` columns on one line: "task → answer", each cut with … when
    they do not fit, the task to at most half the room when there is an answer."""
    task, answer = " ".join(task.split()), " ".join(answer.split())

    def cut(text: str, size: int) -> str:
        return text if columns(text) <= size else first_columns(text, max(0, size - 1)) + "…"
    if not answer:
        return cut(task, room)
    task = cut(task, max(room // 2, room - columns(answer) - 3))
    return f"{task} → {cut(answer, room - columns(task) - 3)}"


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
    found = _matching(key, run_files(folder))
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
    passed_by: List[str] = []
    for path in run_files(folder):
        summary = summarize(path)
        if summary and summary.rounds and not in_use(path):
            if passed_by:  # said: a newer run the user may have meant is not the one followed up on
                print(f"agent-demo: following up on {run_id(path)}, not on the newer {', '.join(passed_by)}",
                      file=sys.stderr)
            return str(path)
        passed_by.append(f"{run_id(path)} ({'still running' if summary and summary.rounds else 'no round yet'})")
    raise ConfigError(f"--continue: no run with a round to follow up on in {folder}; name one: --continue RUN")


def pick_run(name: str, environment: Dict[str, str], flag: str) -> str:
    """The trace file `flag [NAME]` is about: the run NAME names, else the most recent that flag can take
    (--show: the most recent run)."""
    if name:
        return find_run(name, environment, flag)
    if flag == "--show":
        folder = log_dir(environment)
        newest = run_files(folder) if checked_folder(folder) else []
        if not newest:
            raise ConfigError(f"--show: no runs yet in {folder}")
        return str(newest[0])
    return latest_run(environment) if flag == "--resume" else latest_to_follow_up(environment)


def replay(records: List[dict], log: Any, errors: Any = "stderr") -> RunResult:
    """Show a recorded run through the same screen calls the live run made; its outcome ("unfinished"
    when it has no end record). An error ending is one line on `errors` (stderr, as the live run says
    it; None: not said)."""
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
    outcome = ended(end, rounds, log)
    if outcome.status == "error" and errors is not None:
        print(f"agent-demo: error: {outcome.error}", file=sys.stderr if errors == "stderr" else errors)
    return outcome


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
    return outcome
