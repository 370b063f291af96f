"""The trace: what a run remembers, written as it happens and read back to resume.

A round holds everything needed to show it and to rebuild the conversation (the
model's output, its calls and results, the exact feedback sent), and a compaction
the exact digest it put in the requests, so `--resume` replays the trace file
instead of guessing. `RunLog` writes each event to the trace file (JSON Lines) and
to the screen; the run log folder keeps one such file per run, per user:
$AGENT_DEMO_LOG_DIR, else $XDG_STATE_HOME/agent-demo/runs, else ~/.local/state/agent-demo/runs.
"""
import contextlib
import json
import math
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ContextManager, Dict, List, Optional, TextIO, Tuple

from agent_demo_kit.endings import ConfigError
from agent_demo_kit.terminal import Redactor, SafeStream, Screen, Status
from prompts import clip
from tools import failure

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None

KEEP_RUNS = 500
RESUMABLE = {"max_rounds", "budget", "stuck", "error", "interrupted"}  # not finished, not failed
_TAIL_BYTES = 256 * 1024  # the end record and the last rounds are found here, however long the run



@dataclass
class Call:
    """One action of a reply and what came of it."""

    tool: str
    args: Any  # a dict when well-formed; kept as the model sent it otherwise
    result: dict  # {"ok": true, "data": ...} or {"ok": false, "error": ...}
    id: Optional[str] = None  # the tool_call id of a native call
    note: Optional[str] = None  # said to the model beside the result
    watchdog: Optional[str] = None  # "cached", "refused" or "stuck" for a repeated call
    watched: bool = False  # counted by the watchdog (a real tool call, not finish or a refusal)
    format_error: bool = False  # the action itself was malformed
    ends_run: Optional[str] = None  # "finished", "failed" or "stuck"

    @property
    def action(self) -> dict:
        return {"tool": self.tool, "args": self.args}


@dataclass
class Round:
    """One request and its reply, the calls it made and the messages that answered it."""

    number: int
    model_output: str
    calls: List[Call]
    feedback: List[dict]  # the messages sent back, exactly
    mode: str = "json"
    latency_ms: int = 0
    usage: Dict[str, Any] = field(default_factory=dict)
    usage_estimated: bool = False
    problem: Optional[str] = None  # why the reply held no usable action
    tool_calls: Optional[List[dict]] = None  # a tools-mode reply's calls, re-sent as written
    compaction: Optional["Compaction"] = None  # made after this round, before the next request

    @property
    def result(self) -> dict:
        """The first call's result, or the format error: what a one-line summary shows."""
        return self.calls[0].result if self.calls else failure("format error: " + (self.problem or ""))


_CALL_FLAGS = ("id", "note", "watchdog", "watched", "format_error", "ends_run")


def round_to_line(record: Round) -> dict:
    """A round as the trace file keeps it (the "round" event, without the event name)."""
    calls = []
    for call in record.calls:
        line = {"tool": call.tool, "args": call.args, "result": call.result}
        line.update({name: getattr(call, name) for name in _CALL_FLAGS if getattr(call, name)})
        calls.append(line)
    line = {"round": record.number, "model_output": record.model_output,
            "action": record.calls[0].action if record.calls else None, "result": record.result,
            "calls": calls, "feedback": record.feedback, "mode": record.mode,
            "latency_ms": record.latency_ms, "usage": record.usage, "usage_estimated": record.usage_estimated}
    if record.tool_calls is not None:
        line["tool_calls"] = record.tool_calls
    if record.problem is not None:
        line["problem"] = record.problem
    return line


def round_from_line(line: dict) -> Round:
    """A round read back from its trace line; KeyError, TypeError or ValueError if the line is not one."""
    calls = [Call(tool=str(call["tool"]), args=call.get("args"), result=call["result"],
                  **{name: call[name] for name in _CALL_FLAGS if call.get(name)})
             for call in line["calls"]]
    if not isinstance(line["round"], int) or any(not isinstance(call.result, dict) or not isinstance(
            call.result.get("ok"), bool) for call in calls) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in line["feedback"]) \
            or not isinstance(line.get("model_output") or "", str) \
            or not isinstance(line.get("tool_calls") or [], list):
        raise ValueError("not a round this version wrote")
    problem = line.get("problem")
    if not calls and not isinstance(problem, str):  # a trace written before "problem" was recorded
        problem = str((line.get("result") or {}).get("error") or "").replace("format error: ", "", 1)
    usage = line.get("usage")
    return Round(number=line["round"], model_output=line.get("model_output") or "", calls=calls,
                 feedback=list(line["feedback"]), mode=line.get("mode") or "json",
                 latency_ms=line.get("latency_ms") or 0, usage=usage if isinstance(usage, dict) else {},
                 usage_estimated=bool(line.get("usage_estimated")), problem=problem,
                 tool_calls=line.get("tool_calls"))


@dataclass
class Compaction:
    """Older rounds folded into the digest before a request; the requests carry this digest from then on."""

    before_round: int  # the round whose request was the first to carry it
    folded: int  # rounds 1..folded are in the digest, no longer verbatim
    omitted: int  # rounds 1..omitted are not even in the digest: recall gets them back
    digest: str  # exactly as sent, after the task
    chars_before: int = 0  # the request's size had it not compacted
    chars_after: int = 0


def compaction_to_line(compaction: Compaction) -> dict:
    """A compaction as the trace file keeps it (the "compaction" event, without the event name)."""
    return {"before_round": compaction.before_round, "folded": compaction.folded, "omitted": compaction.omitted,
            "chars_before": compaction.chars_before, "chars_after": compaction.chars_after,
            "digest": compaction.digest}


def compaction_from_line(line: dict) -> Compaction:
    """A compaction read back from its trace line; KeyError or TypeError if the line is not one."""
    before_round, folded, omitted = line["before_round"], line["folded"], line.get("omitted", 0)
    if not all(isinstance(n, int) for n in (before_round, folded, omitted)) \
            or not 0 <= omitted <= folded < before_round or not isinstance(line["digest"], str):
        raise TypeError("not a compaction")
    return Compaction(before_round, folded, omitted, line["digest"], chars_before=line.get("chars_before") or 0,
                      chars_after=line.get("chars_after") or 0)


# --- writing ------------------------------------------------------------------------------

class TraceWriteError(ConfigError):
    """The trace file could not be written (disk full, file removed): the run the user asked to
    record cannot be recorded, so it ends (exit 2)."""


class RunLog:
    """Writes each event to the human trace (a stream or nothing) and the trace file."""

    def __init__(self, human: Optional[TextIO] = None, trace_path: Optional[str] = None,
                 redactor: Optional[Redactor] = None, colour: bool = False, live: bool = False):
        self.human = human
        self.screen = Screen(human, colour, live, redactor) if human else None
        self.trace_file = None
        if trace_path:  # a new file is readable only by the user: it holds the task and every result
            raw = open(os.open(trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a", encoding="utf-8")
            if not lock(raw):
                raw.close()
                raise ConfigError(f"{trace_path} is being written by another agent-demo run that is still going")
            if raw.tell() > 0:
                with open(trace_path, "rb") as existing:
                    existing.seek(-1, 2)
                    torn = existing.read(1) != b"\n"
                if torn:
                    raw.write("\n")  # end a line torn by a crash; readers skip it
            self.trace_file = SafeStream(raw, redactor or Redactor(None))

    def say(self, text: str, kind: Optional[str] = None) -> None:
        if self.screen:
            self.screen.say(text, kind)

    def working(self) -> ContextManager[Status]:
        """Around a request: on a terminal, a live line shows the model working and its reply arriving."""
        return self.screen.working() if self.screen else contextlib.nullcontext(Status())

    def record(self, event: str, **fields: Any) -> None:
        if self.trace_file:
            line = json.dumps({"event": event, **fields}, ensure_ascii=False, default=str)
            try:
                self.trace_file.write(line + "\n")
                self.trace_file.flush()  # a crash loses at most the round in flight
            except OSError as error:
                self.close()  # nothing more can be recorded; the end is still shown
                raise TraceWriteError(f"cannot write the trace file: {error.strerror or error}") from None

    def start(self, task: str, model: str, url: str, limits: dict) -> None:
        """limits: the run's own settings (max_rounds, mode, ...), kept for --resume."""
        self.say(f"task: {clip(task, 300)}\nmodel: {model} at {url} ({limits.get('mode', 'json')} mode)")
        self.record("start", task=task, model=model, url=url, **limits, ts=time.time())

    def fallback(self, from_mode: str, to_mode: str, error: str, from_variant: Optional[str] = None,
                 to_variant: Optional[str] = None) -> None:
        """One step down after a refusal: to schema mode's next variant, or to another mode."""
        rejected = f"{from_mode} mode" + (f" as {from_variant}" if from_variant else "")
        then = f"trying {to_variant}" if to_variant else f"falling back to {to_mode} mode"
        self.say(f"note: the endpoint rejected {rejected} ({error}); {then}", "note")
        variants = {name: value for name, value in [("from_variant", from_variant), ("to_variant", to_variant)]
                    if value}
        self.record("fallback", from_mode=from_mode, to_mode=to_mode, **variants, error=error, ts=time.time())

    def setting(self, name: str, value: Any, text: str) -> None:
        """A setting the endpoint made the run change (kept by --resume), and why."""
        self.say(f"note: {text}", "note")
        self.record("setting", name=name, value=value, text=text, ts=time.time())

    def retry(self, cause: str, attempt: int, retries: int, wait: float) -> None:
        """One attempt failed and the next is coming: why, which retry, and after how long."""
        self.say(f"note: {cause}, retry {attempt}/{retries} in {wait:.3g} s", "note")
        self.record("retry", cause=cause, attempt=attempt, retries=retries, wait=wait, ts=time.time())

    def note(self, text: str) -> None:
        self.say(f"note: {text}", "note")
        self.record("note", text=text, ts=time.time())

    def compaction(self, compaction: Compaction) -> None:
        """Record the digest the requests carry from now on, before the first of them is sent (--resume needs it)."""
        self.say(f"context: rounds 1-{compaction.folded} folded into the digest"
                 f" ({compaction.chars_before:,} -> {compaction.chars_after:,} chars)")
        self.record("compaction", **compaction_to_line(compaction), ts=time.time())

    def resume(self, task: str, model: str, url: str, done_rounds: int, limits: dict) -> None:
        self.say(f"resuming after round {done_rounds}: {clip(task, 300)}\nmodel: {model} at {url}"
                 f" ({limits.get('mode', 'json')} mode)")
        self.record("resume", model=model, url=url, after_round=done_rounds, **limits, ts=time.time())

    def reply(self, number: int, max_rounds: int, reply: Any, usage: Optional[dict] = None,
              estimated: bool = False) -> None:
        """Show what the model said, with the round's time and tokens (~ when estimated), before its
        calls run (and before --approve asks about them); think blocks are shortened here, not in
        the trace file."""
        tokens = (usage or {}).get("total_tokens")
        counted = f", {'~' if estimated else ''}{tokens:,} tokens" if isinstance(tokens, int) else ""
        if self.screen:
            self.screen.show_reply(f"\n--- round {number}/{max_rounds} --- {reply.latency_ms / 1000:.1f} s{counted}",
                                   reply)

    def round(self, record: Round) -> None:
        """Show the round's calls and results, and append the round to the trace file."""
        if self.screen:
            self.screen.show_round(record)
        self.record("round", **round_to_line(record))

    def end(self, outcome: Any) -> None:
        if outcome.status != "error":  # an error is one line on stderr, said by the CLI
            self.say(f"\n=== {outcome.summary()} ===", "finished" if outcome.status == "finished" else "stopped")
        for line in outcome.progress:
            self.say(f"  {line}")
        try:
            self.record("end", **{k: v for k, v in outcome.to_json().items() if k != "calls"})
        except TraceWriteError as error:  # the outcome stands; only its record is missing
            print(f"agent-demo: warning: {error}", file=self.human or sys.stderr)

    def close(self) -> None:
        trace_file, self.trace_file = self.trace_file, None
        if trace_file:
            try:
                trace_file.close()
            except OSError:
                pass  # a full disk refuses the last flush too; the file is closed all the same


def load_trace(path: str) -> Tuple[dict, List[Round]]:
    """The start record and the completed rounds of the file's last run, or ValueError if it cannot go on."""
    try:
        with open(path, "rb") as trace:
            lines = trace.read().split(b"\n")
    except OSError as error:
        raise ValueError(f"cannot read the trace file {path}: {error.strerror or error}") from None
    records = []
    for line in lines:
        try:  # a line torn by a crash, even mid-character, is skipped and its round redone
            record = json.loads(line.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append(record)
    starts = [index for index, record in enumerate(records) if record.get("event") == "start"]
    if not starts or not isinstance(records[starts[-1]].get("task"), str):
        raise ValueError(f"{path} is not an agent-demo trace (it holds no start record)")
    run = records[starts[-1]:]  # a trace file appended to by several runs: the last one
    lines_of_rounds: List[dict] = []
    for record in run:
        if record.get("event") == "round" and record.get("round") == len(lines_of_rounds) + 1:
            lines_of_rounds.append(record)
    status = None  # how the run last stood: an end record, or a round in which the model finished
    for record in run:
        if record.get("event") == "end":
            status = record.get("status")
        elif record.get("event") == "round":
            calls = record.get("calls") if isinstance(record.get("calls"), list) else []
            endings = [call.get("ends_run") for call in calls if isinstance(call, dict)]
            status = next((s for s in endings if s in ("finished", "failed")), None)
    if status is not None and status not in RESUMABLE:
        raise ValueError(f"{path} holds a run that already ended with status {status!r};"
                         " only an unfinished run can be resumed")
    try:
        rounds = [round_from_line(line) for line in lines_of_rounds]
    except (KeyError, TypeError, AttributeError, ValueError):
        raise ValueError(f"{path} holds rounds this version cannot read (an older version's, or damaged);"
                         " cannot resume") from None
    for record in run:  # each compaction goes with the round before it; a later one for the same request wins
        if record.get("event") == "compaction" and isinstance(record.get("before_round"), int) \
                and 2 <= record["before_round"] <= len(rounds) + 1:
            try:
                rounds[record["before_round"] - 2].compaction = compaction_from_line(record)
            except (KeyError, TypeError):
                pass  # the conversation is then rebuilt and folded anew
    start = dict(run[0])
    for record in run:  # what a later resume or a fallback set holds for the next resume too
        if record.get("event") == "resume":
            start.update({key: value for key, value in record.items() if key not in ("event", "ts", "after_round")})
        elif record.get("event") == "setting" and record.get("name") in ("reply_cap_field", "stream"):
            start[record["name"]] = record.get("value")
        elif record.get("event") == "fallback":
            start["mode"] = record.get("to_mode")
            if record.get("to_variant"):
                start["schema_variant"] = record["to_variant"]
    return start, rounds


# --- the run log folder --------------------------------------------------------------------

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
        with open(path, "a") as trace:
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
    """A fresh file name for a new run: its start time, then a few random letters."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
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

    @property
    def resumable(self) -> bool:
        return self.status in RESUMABLE or self.status == "unfinished"


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
    status, rounds, tokens = "unfinished", 0, None
    for record in after_start:
        if record.get("event") == "round" and isinstance(record.get("round"), int):
            rounds, status = record["round"], "unfinished"
        elif record.get("event") in ("resume", "start"):
            status = "unfinished"
        elif record.get("event") == "end":
            status, rounds = str(record.get("status")), record.get("rounds") or rounds
            usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
            tokens = usage.get("total_tokens") if isinstance(usage.get("total_tokens"), int) else None
    started = start.get("ts")
    if not (isinstance(started, (int, float)) and math.isfinite(started) and 0 <= started < 1e11):
        started = _mtime(path)
    return RunSummary(path, started, status, rounds if isinstance(rounds, int) else 0, tokens,
                      str(start.get("task") or ""))


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


def render_runs(runs: List[RunSummary], folder: Path) -> str:
    """The --runs table: when, status, rounds, tokens, the task's first words, the file."""
    if not runs:
        return f"no runs yet in {folder}"
    lines = [f"{'when':<16}  {'status':<11}  {'rounds':>6}  {'tokens':>8}  {'task':<40}  file"]
    for run in runs:
        words = " ".join(run.task.split())
        words = words if len(words) <= 40 else words[:39] + "…"
        tokens = "-" if run.tokens is None else str(run.tokens)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started))
        lines.append(f"{when:<16}  {run.status:<11}  {run.rounds:>6}  {tokens:>8}  {words:<40}  {run.path}")
    return "\n".join(lines)


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
    path = latest_unfinished(folder)
    if path is None:
        raise ConfigError(f"--resume: no unfinished run in {folder}; name a trace file: --resume FILE")
    return str(path)


def list_runs(environment: Dict[str, str]) -> int:
    """--runs: print the recent runs in the run log folder, newest first."""
    folder = log_dir(environment)
    print(render_runs(recent_runs(folder), folder))
    return 0
