"""The trace file's one owner: its event names, the writer (TraceFile, a listener on a run's hooks
beside the screen), the one line reader everything else reads through, and the reader that rebuilds a
run for a resume.

A trace file holds a run as JSON Lines: its start record (the task and the settings a resume
keeps), each round (everything needed to show it and to rebuild the conversation: the model's
output, its calls and results, the exact feedback sent), each compaction (the exact digest it
put in the requests), each side-effecting call before it runs, and the end. `--resume` replays
the file instead of guessing. A file may hold several runs (--trace FILE again): each begins with
its start record, and the records that set a run up carry the user's seal (seals.py). A run still
going holds a lock on its file.

It imports records, endings, seals, private_files, terminal and redaction.
"""
import json
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from agent_demo_kit.records import Call, Compaction, Round, RunEvents
from agent_demo_kit.endings import RESUMABLE, ConfigError, RunResult
from agent_demo_kit.seals import is_sealed, seal_of
from agent_demo_kit.private_files import lock, open_private
from agent_demo_kit.limits import TASK_SHOWN_CHARS
from agent_demo_kit.terminal import SafeStream
from agent_demo_kit.redaction import Redactor



# --- the events --------------------------------------------------------------------------------

START, RESUME, FOLLOW_UP = "start", "resume", "follow_up"  # what sets a run up: sealed
ROUND, CALL, END = "round", "call", "end"
NOTE, RETRY, SETTING, FALLBACK, COMPACTION, ESCALATION = "note", "retry", "setting", "fallback", "compaction", \
    "escalation"
SETS_UP = (START, RESUME, FOLLOW_UP)
_EVENT = "event"


def event_of(record: dict) -> Optional[str]:
    """The event a record is (START, ROUND, END, ...), or None."""
    event = record.get(_EVENT)
    return event if isinstance(event, str) else None


# --- reading: the one line reader -----------------------------------------------------------------

def record_of(line: bytes) -> Optional[dict]:
    """One line's record, or None if it is not a JSON object (torn by a crash, or damaged)."""
    try:  # a line torn even mid-character is found out here
        record = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def read_records(path: str) -> List[dict]:
    """The records of a trace file (lines that are not JSON objects left out); [] if it cannot be read
    or is not a plain file (/dev/zero or a FIFO would never end)."""
    try:
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        with open(os.open(path, flags), "rb") as trace:
            if not stat.S_ISREG(os.fstat(trace.fileno()).st_mode):
                return []
            lines = trace.read().split(b"\n")
    except OSError:
        return []
    return [record for record in map(record_of, lines) if record is not None]


def last_run(records: List[dict]) -> List[dict]:
    """The records of the last run among a file's, from its start record ([] when there is none)."""
    starts = [index for index, record in enumerate(records) if event_of(record) == START]
    return records[starts[-1]:] if starts else []


def last_run_records(path: str) -> List[dict]:
    """The records of the last run in a trace file, in order; ConfigError if it holds none."""
    run = last_run(read_records(path))
    if not run:
        raise ConfigError(f"{path} is not an agent-demo trace (it holds no start record)")
    return run


def head_and_tail(path: Path, tail_bytes: int) -> List[dict]:
    """The records of a trace file's first line and of its last tail_bytes (how a run stands, however
    long it ran); a first line too long to read whole gives its task's beginning. [] if unreadable."""
    try:
        with open(path, "rb") as trace:
            first = trace.readline(tail_bytes)  # a task with megabytes of piped material: its start is enough
            size = trace.seek(0, os.SEEK_END)
            trace.seek(max(0, size - tail_bytes))
            tail = trace.read().split(b"\n")
    except OSError:
        return []
    head = record_of(first) if first.endswith(b"\n") else _long_start(first)
    return [record for record in [head, *map(record_of, tail)] if record]


def _long_start(head: bytes) -> Optional[dict]:
    """The start record of a run whose first line is too long to read whole: its task's beginning."""
    if not head.startswith(b'{"event": "start"'):
        return None
    match = re.search(rb'"task": "((?:[^"\\]|\\.){0,%d})' % TASK_SHOWN_CHARS, head)
    try:
        task = json.loads(b'"' + match[1] + b'"') if match else ""
    except ValueError:
        task = ""
    return {_EVENT: START, "task": task + "…"}


def has_start(path: Path) -> bool:
    """Does a trace file hold a run's start (so that the run can be taken up)?"""
    try:
        with open(path, "rb") as file:
            return any(line.startswith(b'{"event": "start"') for line in file)
    except OSError:
        return False


def started_as(records: List[dict], text: str) -> bool:
    """Did the last run in these records start with this task (or with it, the key taken out)?"""
    start = next((record for record in reversed(records) if event_of(record) == START), None)
    return start is None or start.get("task") == text or "[redacted]" in str(start.get("task"))


def sealed_run(path: Path) -> bool:
    """Is the last run in a trace file set up by records of the user's own, each where it was written
    (or is there no run in it)? A batch counts no trace it did not write."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return False
    try:
        return load_trace(data, str(path), ended_too=True).sealed
    except ValueError as error:  # no start record: nothing it could count
        return "holds no start record" in str(error)


# --- writing ------------------------------------------------------------------------------

class TraceWriteError(ConfigError):
    """The trace file could not be written (disk full, file removed): the run the user asked to
    record cannot be recorded, so it ends (exit 2)."""


class TraceFile(RunEvents):
    """A listener that writes each report of a run to its trace file, the key and its forms redacted
    (the screen is another listener: screen_trace.ScreenTrace)."""

    def __init__(self, trace_path: Optional[str] = None, redactor: Optional[Redactor] = None,
                 written: Optional[List[dict]] = None):
        self.redactor = redactor or Redactor()
        self.start_fields: Dict[str, Any] = {}  # recorded with the start or resume (the MCP servers used)
        self.trace_file: Optional[SafeStream] = None
        self.path = trace_path
        self.written = written  # when a list, each record written is added to it, as written
        self.run_id: Optional[str] = None  # the run's id in its file, which its sealed records name
        if trace_path:  # a new file is readable only by the user: it holds the task and every result
            try:
                raw = open(open_private(trace_path), "a", encoding="utf-8")
            except OSError as error:
                raise ConfigError(f"cannot open the trace file: {error}") from None
            if not lock(raw):
                raw.close()
                raise ConfigError(f"{trace_path} is being written by another agent-demo run that is still going")
            size = raw.tell()
            if size > 0 and os.pread(raw.fileno(), 1, size - 1) not in (b"\n", b""):
                raw.write("\n")  # end a line torn by a crash; readers skip it
                raw.flush()
            self.trace_file = SafeStream(raw, self.redactor)

    def recording(self, start_fields: Dict[str, Any]) -> None:
        """What the start (or resume) record keeps besides the settings (the MCP servers used): known once
        the run's tools have started, after a resumed run's file was opened to be read."""
        self.start_fields = start_fields

    def recorded(self) -> bytes:
        """What the trace file holds, read through the file this run locked, to resume from (nothing
        from a device such as /dev/zero)."""
        if not self.trace_file or not stat.S_ISREG(os.fstat(self.trace_file.fileno()).st_mode):
            return b""
        chunks, fd, offset = [], self.trace_file.fileno(), 0
        while True:
            chunk = os.pread(fd, 1 << 20, offset)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            offset += len(chunk)

    def record(self, event: str, **fields: Any) -> None:
        if self.trace_file:
            record = {_EVENT: event, **fields}
            if event in SETS_UP:  # sealed as written, where it is written, for its run: its strings redacted
                if event == START:
                    self.run_id = secrets.token_hex(8)
                at = os.fstat(self.trace_file.fileno()).st_size  # every record before it is flushed
                record.pop("seal", None)
                record.update(run=self.run_id, at=at)
            try:  # its strings redacted, not its text: every line parses, whatever the key
                text, kept = self.redactor.redacted(record)
                if event in SETS_UP:  # the seal goes last, as a dict that gets it last is written
                    seal = seal_of(kept)
                    text, kept = f"{text[:-1]}, \"seal\": \"{seal}\"}}", {**kept, "seal": seal}
                self.trace_file.write_line(text)
                self.trace_file.flush()  # a crash loses at most the round in flight
                if self.written is not None:
                    self.written.append(kept)
            except OSError as error:
                self.close()  # nothing more can be recorded; the end is still shown
                raise TraceWriteError(f"cannot write the trace file: {error.strerror or error}") from None

    def start(self, task: str, model: str, url: str, kept: dict) -> None:
        """kept: the run's own settings (max_rounds, mode, ...), for --resume."""
        self.record(START, task=task, model=model, url=url, **kept, **self.start_fields, ts=time.time())

    def resume(self, task: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self.record(RESUME, model=model, url=url, after_round=done_rounds, **kept, **self.start_fields,
                    ts=time.time())

    def follow_up(self, text: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        """--continue: the user's next turn after the run's last round, with the settings the run goes on with."""
        self.record(FOLLOW_UP, text=text, model=model, url=url, after_round=done_rounds, **kept,
                    **self.start_fields, ts=time.time())

    def fallback(self, from_mode: str, to_mode: str, error: str, from_variant: Optional[str] = None,
                 to_variant: Optional[str] = None) -> None:
        """One step down after a refusal: to schema mode's next variant, or to another mode."""
        variants = {name: value for name, value in [("from_variant", from_variant), ("to_variant", to_variant)]
                    if value}
        self.record(FALLBACK, from_mode=from_mode, to_mode=to_mode, **variants, error=error, ts=time.time())

    def setting(self, name: str, value: Any, text: str) -> None:
        """A setting the endpoint made the run change (kept by --resume), and why."""
        self.record(SETTING, name=name, value=value, text=text, ts=time.time())

    def retry(self, cause: str, attempt: int, retries: int, wait: float) -> None:
        """One attempt failed and the next is coming: why, which retry, and after how long."""
        self.record(RETRY, cause=cause, attempt=attempt, retries=retries, wait=wait, ts=time.time())

    def note(self, text: str) -> None:
        self.record(NOTE, text=text, ts=time.time())

    def escalation(self, after_round: int, from_model: str, to_model: str, trigger: str, reason: str,
                   notice: str) -> None:
        """Another model takes the run over, with the notice it is given, which --resume puts back after its round."""
        self.record(ESCALATION, after_round=after_round, from_model=from_model, to_model=to_model, trigger=trigger,
                    reason=reason, notice=notice, ts=time.time())

    def compaction(self, compaction: Compaction) -> None:
        """Record the digest the requests carry from now on, before the first of them is sent (--resume needs it)."""
        self.record(COMPACTION, **compaction.to_line(), ts=time.time())

    def call_started(self, number: int, call: Call) -> None:
        """Before a call with side effects runs: if the run is killed before its round is recorded,
        a resume knows it may have happened."""
        self.record(CALL, round=number, tool=call.tool, args=call.args, ts=time.time())

    def round(self, record: Round) -> None:
        self.record(ROUND, **record.to_line(), ts=time.time())

    def end(self, outcome: RunResult) -> None:
        said = {"summary": outcome.summary(), **({"progress": outcome.progress} if outcome.progress else {})}
        ending = outcome.ending  # what kind of endpoint error, for figures (a refused key is no attempt of the task)
        said.update({name: getattr(ending, name) for name in ("http_status", "unreachable") if getattr(ending, name, None)})
        try:
            self.record(END, **{k: v for k, v in outcome.to_json().items() if k not in ("calls", "checks")},
                        resumable=outcome.resumable, **said, ts=time.time())
        except TraceWriteError as error:  # the outcome stands; only its record is missing
            print(f"agent-demo: warning: {error}", file=sys.stderr)

    def close(self) -> None:
        trace_file, self.trace_file = self.trace_file, None
        if trace_file:
            try:
                trace_file.close()
            except OSError:
                pass  # a full disk refuses the last flush too; the file is closed all the same


# What a resume or a follow-up record may change for the resume after it: the run's limits (a follow-up
# has its own), the request's form, the tools it narrowed to, the material it reads, the MCP servers it
# saw (to say what changed). Never what starts a process, loads a file or chooses where requests go.
LATER_RECORDS_KEEP = {"max_rounds", "max_tokens", "mode", "schema_variant", "reply_cap_field", "stream", "tools",
                      "answer_only", "material", "material_shown", "mcp"}


@dataclass
class RecordedRun:
    """The last run in a trace file, as a resume takes it up."""

    start: dict  # its start record, with what later records changed
    rounds: List[Round]  # its completed rounds
    unfinished: List[Call]  # side-effecting calls started after them: their outcome is unknown
    status: Optional[str]  # how it last ended (None: it was cut short before its end record)
    first_limit: Optional[int] = None  # the --max-rounds it started with: what a bare --resume adds
    escalations: List[dict] = field(default_factory=list)  # its escalation records: who took over, after which round
    task_notices: List[str] = field(default_factory=list)  # what a model that took over before round 1 was told
    sealed: bool = True  # every record that set it up was written by agent-demo as this user


def load_trace(data: bytes, name: str, ended_too: bool = False) -> RecordedRun:
    """The start record, the completed rounds, and the side-effecting calls started after them (their
    outcome unknown) of the last run in a trace file's bytes; ValueError if it cannot go on (ended_too:
    a run that finished or failed can, with a follow-up). A line torn by a crash is skipped when it
    ends the file or a resume followed it; any other line that cannot be read or does not fit
    refuses the whole trace, naming the line."""
    lines, offsets, offset = [], {}, 0  # offsets: where each line starts, which a sealed record names
    for number, line in enumerate(data.split(b"\n"), 1):
        offsets[number], offset = offset, offset + len(line) + 1
        if line.strip():
            lines.append((number, record_of(line)))
    starts = [index for index, (_, record) in enumerate(lines) if record and event_of(record) == START]
    if not starts or not isinstance(lines[starts[-1]][1].get("task"), str):
        raise ValueError(f"{name} is not an agent-demo trace (it holds no start record)")
    run = lines[starts[-1]:]  # a trace file appended to by several runs: the last one
    start, rounds, started = dict(run[0][1]), [], []
    escalations: List[dict] = []
    task_notices: List[str] = []
    status = None  # how the run last stood: an end record, or a round in which the model finished
    for index, (number, record) in enumerate(run):
        def damaged(why: str) -> ValueError:
            return ValueError(f"{name} line {number} is damaged ({why}); cannot resume: only a line torn by"
                              " a crash at the end of the file is skipped")
        if record is None:
            after = run[index + 1][1] if index + 1 < len(run) else None
            if index + 1 == len(run) or after and event_of(after) in (RESUME, FOLLOW_UP):
                continue  # torn by a crash (and the run was taken up after it)
            raise damaged("not a JSON record")
        event = event_of(record)
        if event == ROUND:
            if record.get("round") != len(rounds) + 1 or isinstance(record.get("round"), bool):
                raise damaged(f"round {record.get('round')!r} where round {len(rounds) + 1} was due")
            try:
                rounds.append(Round.from_line(record))
            except (KeyError, TypeError, AttributeError, ValueError):
                raise damaged(f"round {len(rounds) + 1} cannot be read by this version") from None
            started = []
            endings = [call.ends_run for call in rounds[-1].calls]
            status = next((s for s in endings if s in ("finished", "failed")), None)
        elif event == CALL:
            if record.get("round") != len(rounds) + 1 or not isinstance(record.get("tool"), str):
                raise damaged(f"a call of round {record.get('round')!r} where round {len(rounds) + 1} was going")
            started.append(Call(record["tool"], record.get("args"), {}))
        elif event == ESCALATION:
            after, notice = record.get("after_round"), record.get("notice")
            if not isinstance(after, int) or isinstance(after, bool) or not 0 <= after <= len(rounds) \
                    or not isinstance(notice, str):
                raise damaged("an escalation this version cannot read")
            escalations.append(record)
            if after:
                said = rounds[after - 1].notice
                rounds[after - 1].notice = notice if said is None else f"{said}\n\n{notice}"
            else:
                task_notices.append(notice)
        elif event == COMPACTION:
            try:
                compaction = Compaction.from_line(record)
            except (KeyError, TypeError):
                raise damaged("a compaction this version cannot read") from None
            if compaction.before_round != len(rounds) + 1:
                raise damaged(f"a compaction before round {compaction.before_round} after round {len(rounds)}")
            if rounds:  # it goes with the round before it; a later one for the same request wins
                rounds[-1].compaction = compaction
        elif event == FOLLOW_UP:
            text, after_round = record.get("text"), record.get("after_round")
            if not isinstance(text, str) or not isinstance(after_round, int) or not 1 <= after_round <= len(rounds):
                raise damaged("a follow-up this version cannot read")
            rounds[after_round - 1].add_follow_up(text)
            start.update({key: value for key, value in record.items() if key in LATER_RECORDS_KEEP})
            status = None
        elif event == END:
            status = record.get("status")
        elif event == RESUME:  # what a later resume or a fallback set holds for the next resume too
            start.update({key: value for key, value in record.items() if key in LATER_RECORDS_KEEP})
        elif event == SETTING and record.get("name") in ("reply_cap_field", "stream"):
            start[record["name"]] = record.get("value")
        elif event == FALLBACK:
            start["mode"] = record.get("to_mode")
            if record.get("to_variant"):
                start["schema_variant"] = record["to_variant"]
        elif not isinstance(event, str):
            raise damaged("a record without an event")
    if status is not None and status not in RESUMABLE and not ended_too:
        raise ValueError(f"{name} holds a run that already ended with status {status!r};"
                         " only an unfinished run can be resumed")
    first = run[0][1].get("max_rounds")
    ours = all(sealed_here(record, offsets[number], start.get("run")) for number, record in run
               if record and event_of(record) in SETS_UP)
    return RecordedRun(start, rounds, started, status, first if isinstance(first, int) and first > 0 else None,
                       escalations, task_notices, ours)


def sealed_here(record: dict, offset: int, run: Any) -> bool:
    """Was this record written, as it is, by agent-demo as this user, at this place in this file, for
    this run (a sealed record copied from another trace, or to another place in this one, is not)?"""
    return is_sealed(record) and record.get("at") == offset and isinstance(run, str) and record.get("run") == run


def read_run(log: TraceFile, path: str, continuing: bool) -> RecordedRun:
    """What a trace brings back, read through the file `log` has locked (which goes on recording this
    run); ConfigError if the run cannot go on (continuing: a follow-up, which a finished run takes too)."""
    try:
        recorded = load_trace(log.recorded(), path, ended_too=continuing)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    log.run_id = recorded.start.get("run") if isinstance(recorded.start.get("run"), str) else None
    if continuing and not recorded.rounds:
        raise ConfigError(f"--continue: {path} holds no round to follow up on; run the task again")
    return recorded
