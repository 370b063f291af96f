"""The run store: what a run leaves on disk, and finding it again.

A trace file holds one run as JSON Lines: its start record (the task and the settings a resume
keeps), each round (everything needed to show it and to rebuild the conversation: the model's
output, its calls and results, the exact feedback sent), each compaction (the exact digest it
put in the requests), each side-effecting call before it runs, and the end. `--resume` replays
the file instead of guessing. `RunLog` writes each event to the trace file and to the screen.

The run log folder keeps one trace file per run, per user: $AGENT_DEMO_LOG_DIR, else
$XDG_STATE_HOME/agent-demo/runs, else ~/.local/state/agent-demo/runs. It is listed by --runs and
searched by --resume. The folder and the files are checked the way ssh checks ~/.ssh: owned by the
user (or root), not writable by group or others, not reached through a symlink someone else owns;
files are readable only by the user; the oldest beyond KEEP_RUNS are pruned; a run still going
holds a lock on its file.
"""
import contextlib
import json
import math
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ContextManager, Dict, List, Optional

from agent_demo_kit.records import is_count, Call, Compaction, Reply, Round, RunEvents, Working, to_json
from agent_demo_kit.endings import RESUMABLE, ConfigError, RunResult
from agent_demo_kit.seals import SEALED_EVENTS, is_sealed, sealed
from agent_demo_kit.private_files import checked_folder, open_private, private_folder
from agent_demo_kit.settings import TASK_SHOWN_CHARS
from agent_demo_kit.terminal import Redactor, SafeStream, Screen, columns, first_columns
from prompts import MATERIAL_HEADER, clip

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None


# --- private files -------------------------------------------------------------------


# --- writing ------------------------------------------------------------------------------

class TraceWriteError(ConfigError):
    """The trace file could not be written (disk full, file removed): the run the user asked to
    record cannot be recorded, so it ends (exit 2)."""


class RunLog(RunEvents):
    """Writes each event of a run to the trace file (if any) and shows it on the screen (if any);
    the key and its forms never reach either, nor the model (`redact`)."""

    def __init__(self, screen: Optional[Screen] = None, trace_path: Optional[str] = None,
                 redactor: Optional[Redactor] = None):
        self.redactor = redactor or Redactor()
        self.screen = screen
        self.start_fields: Dict[str, Any] = {}  # recorded with the start or resume (the MCP servers used)
        self.start_notes: List[str] = []  # said right after it
        self.url_note = ""  # on the header line: where requests go was chosen by ./.env, the key not
        self.header_said = False
        self.trace_file: Optional[SafeStream] = None
        self.path = trace_path
        self.written: Optional[List[dict]] = None  # when a list, each record written is added to it, as written
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

    def redact(self, text: str) -> str:
        return self.redactor(text, placeholders=False)  # a short placeholder key may be a number in the data

    def redact_values(self, value: Any) -> Any:
        return self.redactor.values(value)

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

    def say(self, text: str, kind: Optional[str] = None) -> None:
        if self.screen:
            self.screen.say(text, kind)

    def working(self, label: str = "model working") -> ContextManager[Working]:
        """Around a request, a tool call or a check: on a terminal, a live line shows it working (and
        the model's reply arriving)."""
        return self.screen.working(label) if self.screen else contextlib.nullcontext(Working())

    def record(self, event: str, **fields: Any) -> None:
        if self.trace_file:
            record = {"event": event, **fields}
            if event in SEALED_EVENTS:  # sealed as written: its strings redacted
                record = sealed(self.redactor.values(record))
            try:  # its strings redacted, not its text: every line parses, whatever the key
                self.trace_file.write_json(record)
                self.trace_file.flush()  # a crash loses at most the round in flight
                if self.written is not None:
                    self.written.append(self.redactor.values(record))
            except OSError as error:
                self.close()  # nothing more can be recorded; the end is still shown
                raise TraceWriteError(f"cannot write the trace file: {error.strerror or error}") from None

    def header(self, task: str, model: str, url: str, mode: str) -> None:
        """The run's first lines, said before any request is made (a local server's window is asked
        before the start is recorded); start() does not say them again."""
        self.say(f"task: {clip(task, TASK_SHOWN_CHARS)}\nmodel: {model} at {url}{self.url_note} ({mode} mode)")
        self.header_said = True

    def start(self, task: str, model: str, url: str, kept: dict) -> None:
        """kept: the run's own settings (max_rounds, mode, ...), for --resume."""
        if not self.header_said:
            self.header(task, model, url, str(kept.get("mode")))
        self.record("start", task=task, model=model, url=url, **kept, **self.start_fields, ts=time.time())
        self._say_start_notes()

    def resume(self, task: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self.say(f"resuming after round {done_rounds}: {clip(task, TASK_SHOWN_CHARS)}\nmodel: {model} at {url}"
                 f"{self.url_note} ({kept.get('mode')} mode)")
        self.record("resume", model=model, url=url, after_round=done_rounds, **kept, **self.start_fields,
                    ts=time.time())
        self._say_start_notes()

    def follow_up(self, text: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        """--continue: the user's next turn after the run's last round, with the settings the run goes on with."""
        self.say(f"follow-up after round {done_rounds}: {clip(text, TASK_SHOWN_CHARS)}\nmodel: {model} at {url}"
                 f"{self.url_note} ({kept.get('mode')} mode)")
        self.record("follow_up", text=text, model=model, url=url, after_round=done_rounds, **kept,
                    **self.start_fields, ts=time.time())
        self._say_start_notes()

    def _say_start_notes(self) -> None:
        for text in self.start_notes:
            self.note(text)

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
        if attempt:
            self.say(f"note: {cause}, retry {attempt}/{retries} in {wait:.3g} s", "note")
        else:  # a batch's shared limit took the blame: no retry spent
            self.say(f"note: {cause}; sent again in {wait:.3g} s", "note")
        self.record("retry", cause=cause, attempt=attempt, retries=retries, wait=wait, ts=time.time())

    def note(self, text: str) -> None:
        self.say(f"note: {text}", "note")
        self.record("note", text=text, ts=time.time())

    def escalation(self, after_round: int, from_model: str, to_model: str, trigger: str, reason: str,
                   notice: str) -> None:
        """Another model takes the run over: said on the trace (escalated to MODEL: why) and recorded with
        the notice it is given, which --resume puts back after its round."""
        said = f"back to {to_model}: {reason}" if trigger == "calm" else f"escalated to {to_model}: {reason}"
        self.say(f"{said} (after round {after_round})", "note")
        self.record("escalation", after_round=after_round, from_model=from_model, to_model=to_model, trigger=trigger,
                    reason=reason, notice=notice, ts=time.time())

    def compaction(self, compaction: Compaction) -> None:
        """Record the digest the requests carry from now on, before the first of them is sent (--resume needs it)."""
        self.say(f"context: rounds 1-{compaction.folded} folded into the digest"
                 f" ({compaction.chars_before:,} -> {compaction.chars_after:,} chars)")
        self.record("compaction", **compaction.to_line(), ts=time.time())

    def reply(self, number: int, limit: int, reply: Reply, prose: str, usage: dict, estimated: bool) -> None:
        """Show what the model said besides its actions, under the round's header, before its calls
        run; think blocks are shortened here, not in the trace file."""
        if self.screen:
            self.screen.show_reply(number, limit, reply, prose, usage, estimated)

    def action(self, index: int, count: int, tool: str, args: Any, in_words: bool = False) -> None:
        """Show an action before it runs (a tool's own prints come after this line)."""
        if self.screen:
            self.screen.show_action(index, count, tool, args, in_words)

    def result(self, call: Call, sent: dict) -> None:
        """Show what the model is told of a call: its result as sent."""
        if self.screen:
            self.screen.show_result(call, sent)

    def call_started(self, number: int, call: Call) -> None:
        """Before a call with side effects runs: if the run is killed before its round is recorded,
        a resume knows it may have happened."""
        self.record("call", round=number, tool=call.tool, args=call.args, ts=time.time())

    def round(self, record: Round) -> None:
        """Append the round to the trace file (its calls were shown as they ran)."""
        if self.screen and not record.calls:
            self.screen.say(f"result: {to_json(record.result)}", "error")
        self.record("round", **record.to_line(), ts=time.time())

    def end(self, outcome: RunResult) -> None:
        self.ended(outcome.status, outcome.summary(), outcome.progress, outcome.models)
        said = {"summary": outcome.summary(), **({"progress": outcome.progress} if outcome.progress else {})}
        ending = outcome.ending  # what kind of endpoint error, for figures (a refused key is no attempt of the task)
        said.update({name: getattr(ending, name) for name in ("http_status", "unreachable") if getattr(ending, name, None)})
        try:
            self.record("end", **{k: v for k, v in outcome.to_json().items() if k not in ("calls", "checks")},
                        resumable=outcome.resumable, **said, ts=time.time())
        except TraceWriteError as error:  # the outcome stands; only its record is missing
            print(f"agent-demo: warning: {error}", file=self.screen.stream if self.screen else sys.stderr)

    def ended(self, status: str, summary: str, progress: List[str], models: Optional[dict] = None) -> None:
        """Show how the run ended, and the lines after it (an error is one line on stderr, said by the
        caller); with --escalate, each model's rounds and tokens."""
        if status != "error":
            self.say(f"\n=== {summary} ===", "finished" if status == "finished" else "stopped")
        if models:
            self.say("  " + "; ".join(f"{name}: {used.get('rounds', 0)} round(s), {used.get('tokens', 0):,} tokens"
                                      for name, used in models.items() if isinstance(used, dict)))
        for line in progress:
            self.say(f"  {line}")

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
                      "material", "material_shown", "mcp"}


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
    lines = [(number, _record(line)) for number, line in enumerate(data.split(b"\n"), 1) if line.strip()]
    starts = [index for index, (_, record) in enumerate(lines) if record and record.get("event") == "start"]
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
            if index + 1 == len(run) or after and after.get("event") in ("resume", "follow_up"):
                continue  # torn by a crash (and the run was taken up after it)
            raise damaged("not a JSON record")
        event = record.get("event")
        if event == "round":
            if record.get("round") != len(rounds) + 1 or isinstance(record.get("round"), bool):
                raise damaged(f"round {record.get('round')!r} where round {len(rounds) + 1} was due")
            try:
                rounds.append(Round.from_line(record))
            except (KeyError, TypeError, AttributeError, ValueError):
                raise damaged(f"round {len(rounds) + 1} cannot be read by this version") from None
            started = []
            endings = [call.ends_run for call in rounds[-1].calls]
            status = next((s for s in endings if s in ("finished", "failed")), None)
        elif event == "call":
            if record.get("round") != len(rounds) + 1 or not isinstance(record.get("tool"), str):
                raise damaged(f"a call of round {record.get('round')!r} where round {len(rounds) + 1} was going")
            started.append(Call(record["tool"], record.get("args"), {}))
        elif event == "escalation":
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
        elif event == "compaction":
            try:
                compaction = Compaction.from_line(record)
            except (KeyError, TypeError):
                raise damaged("a compaction this version cannot read") from None
            if compaction.before_round != len(rounds) + 1:
                raise damaged(f"a compaction before round {compaction.before_round} after round {len(rounds)}")
            if rounds:  # it goes with the round before it; a later one for the same request wins
                rounds[-1].compaction = compaction
        elif event == "follow_up":
            text, after_round = record.get("text"), record.get("after_round")
            if not isinstance(text, str) or not isinstance(after_round, int) or not 1 <= after_round <= len(rounds):
                raise damaged("a follow-up this version cannot read")
            rounds[after_round - 1].add_follow_up(text)
            start.update({key: value for key, value in record.items() if key in LATER_RECORDS_KEEP})
            status = None
        elif event == "end":
            status = record.get("status")
        elif event == "resume":  # what a later resume or a fallback set holds for the next resume too
            start.update({key: value for key, value in record.items() if key in LATER_RECORDS_KEEP})
        elif event == "setting" and record.get("name") in ("reply_cap_field", "stream"):
            start[record["name"]] = record.get("value")
        elif event == "fallback":
            start["mode"] = record.get("to_mode")
            if record.get("to_variant"):
                start["schema_variant"] = record["to_variant"]
        elif not isinstance(event, str):
            raise damaged("a record without an event")
    if status is not None and status not in RESUMABLE and not ended_too:
        raise ValueError(f"{name} holds a run that already ended with status {status!r};"
                         " only an unfinished run can be resumed")
    first = run[0][1].get("max_rounds")
    ours = all(is_sealed(record) for _, record in run if record and record.get("event") in SEALED_EVENTS)
    return RecordedRun(start, rounds, started, status, first if isinstance(first, int) and first > 0 else None,
                       escalations, task_notices, ours)


def read_run(log: RunLog, path: str, continuing: bool) -> RecordedRun:
    """What a trace brings back, read through the file `log` has locked; ConfigError if the run
    cannot go on (continuing: a follow-up, which a finished run takes too)."""
    try:
        recorded = load_trace(log.recorded(), path, ended_too=continuing)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if continuing and not recorded.rounds:
        raise ConfigError(f"--continue: {path} holds no round to follow up on; run the task again")
    return recorded


def _record(line: bytes) -> Optional[dict]:
    """One line's record, or None if it is not a JSON object (torn by a crash, or damaged)."""
    try:  # a line torn even mid-character is found out here
        record = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


# --- the run log folder --------------------------------------------------------------

KEEP_RUNS = 500
_TAIL_BYTES = 256 * 1024  # the end record and the last rounds are found here, however long the run


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
    status, rounds, tokens, goes_on, answer = "unfinished", 0, None, True, ""
    for record in after_start:
        if record.get("event") == "round" and isinstance(record.get("round"), int):
            rounds, status, goes_on, answer = record["round"], "unfinished", True, ""
            usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
            if is_count(usage.get("total_tokens")):
                tokens = (tokens or 0) + usage["total_tokens"]
        elif record.get("event") in ("resume", "start", "follow_up"):
            status, goes_on, answer = "unfinished", True, ""
        elif record.get("event") == "end":
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


def _long_start(head: bytes) -> Optional[dict]:
    """The start record of a run whose first line is too long to read whole: its task's beginning."""
    if not head.startswith(b'{"event": "start"'):
        return None
    match = re.search(rb'"task": "((?:[^"\\]|\\.){0,%d})' % TASK_SHOWN_CHARS, head)
    try:
        task = json.loads(b'"' + match[1] + b'"') if match else ""
    except ValueError:
        task = ""
    return {"event": "start", "task": task + "…"}


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


def last_run_records(path: str) -> List[dict]:
    """The records of the last run in a trace file, in order (lines that cannot be read left out)."""
    with open(path, "rb") as trace:
        records = [record for record in map(_record, trace.read().split(b"\n")) if record]
    starts = [index for index, record in enumerate(records) if record.get("event") == "start"]
    if not starts:
        raise ConfigError(f"{path} is not an agent-demo trace (it holds no start record)")
    return records[starts[-1]:]


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
