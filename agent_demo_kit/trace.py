"""The trace: what a run remembers, written as it happens and read back to resume.

A round holds everything needed to show it and to rebuild the conversation (the
model's output, its calls and results, the exact feedback sent), and a compaction
the exact digest it put in the requests, so `--resume` replays the trace file
instead of guessing. `RunLog` writes each event to the trace file (JSON Lines) and
to the screen; the run log folder (log_folder.py) keeps one such file per run.
"""
import contextlib
import json
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Any, ContextManager, Dict, List, Optional, TextIO, Tuple

from agent_demo_kit.endings import ConfigError
from agent_demo_kit.log_folder import RESUMABLE, can_resume, lock
from agent_demo_kit.private_files import open_private
from agent_demo_kit.terminal import Redactor, SafeStream, Screen, Status, to_json
from prompts import clip
from tools import failure


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
    check: Optional[dict] = None  # what --check said of a finish: command, exit_code, output, ms

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
    follow_up: Optional[str] = None  # the user's next turn after this round (--continue), recorded on its own

    @property
    def result(self) -> dict:
        """The first call's result, or the format error: what a one-line summary shows."""
        return self.calls[0].result if self.calls else failure("format error: " + (self.problem or ""))


_CALL_FLAGS = ("id", "note", "watchdog", "watched", "format_error", "ends_run", "check")


def add_follow_up(record: Round, text: str) -> None:
    """The user's next turn after this round (--continue), joined to one given before that got no reply.
    A compaction made after the round was for a request without it: the next request is folded anew."""
    record.follow_up = text if record.follow_up is None else f"{record.follow_up}\n\n{text}"
    record.compaction = None


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
            call.result.get("ok"), bool) or not isinstance(call.check or {}, dict) for call in calls) or not all(
            isinstance(m, dict) and m.get("role") in ("user", "tool") and isinstance(m.get("content"), str)
            for m in line["feedback"]) \
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
    notes: str = ""  # the working notes of the folded rounds, exactly as sent after the digest


def compaction_to_line(compaction: Compaction) -> dict:
    """A compaction as the trace file keeps it (the "compaction" event, without the event name)."""
    line = {"before_round": compaction.before_round, "folded": compaction.folded, "omitted": compaction.omitted,
            "chars_before": compaction.chars_before, "chars_after": compaction.chars_after,
            "digest": compaction.digest}
    if compaction.notes:
        line["notes"] = compaction.notes
    return line


def compaction_from_line(line: dict) -> Compaction:
    """A compaction read back from its trace line; KeyError or TypeError if the line is not one."""
    before_round, folded, omitted = line["before_round"], line["folded"], line.get("omitted", 0)
    if not all(isinstance(n, int) for n in (before_round, folded, omitted)) \
            or not 0 <= omitted <= folded < before_round or not isinstance(line["digest"], str) \
            or not isinstance(line.get("notes") or "", str):
        raise TypeError("not a compaction")
    return Compaction(before_round, folded, omitted, line["digest"], chars_before=line.get("chars_before") or 0,
                      chars_after=line.get("chars_after") or 0, notes=line.get("notes") or "")


# --- writing ------------------------------------------------------------------------------

class TraceWriteError(ConfigError):
    """The trace file could not be written (disk full, file removed): the run the user asked to
    record cannot be recorded, so it ends (exit 2)."""


class RunLog:
    """Writes each event to the human trace (a stream or nothing) and the trace file."""

    follow_up: Optional[str] = None  # --continue: the run picks up with this user turn rather than resuming

    def __init__(self, human: Optional[TextIO] = None, trace_path: Optional[str] = None,
                 redactor: Optional[Redactor] = None, colour: bool = False, live: bool = False):
        self.human = human
        self.redactor = redactor or Redactor()
        self.screen = Screen(human, colour, live, self.redactor) if human else None
        self.start_fields: Dict[str, Any] = {}  # recorded with the start or resume (the MCP servers used)
        self.start_notes: List[str] = []  # said right after it
        self.trace_file = None
        if trace_path:  # a new file is readable only by the user: it holds the task and every result
            raw = open(open_private(trace_path), "a", encoding="utf-8")
            if not lock(raw):
                raw.close()
                raise ConfigError(f"{trace_path} is being written by another agent-demo run that is still going")
            size = raw.tell()
            if size > 0 and os.pread(raw.fileno(), 1, size - 1) not in (b"\n", b""):
                raw.write("\n")  # end a line torn by a crash; readers skip it
                raw.flush()
            self.trace_file = SafeStream(raw, self.redactor)

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

    def working(self, label: str = "model working") -> ContextManager[Status]:
        """Around a request, a tool call or a check: on a terminal, a live line shows it working (and
        the model's reply arriving)."""
        return self.screen.working(label) if self.screen else contextlib.nullcontext(Status(label))

    def record(self, event: str, **fields: Any) -> None:
        if self.trace_file:
            try:  # its strings redacted, not its text: every line parses, whatever the key
                self.trace_file.write_json({"event": event, **fields})
                self.trace_file.flush()  # a crash loses at most the round in flight
            except OSError as error:
                self.close()  # nothing more can be recorded; the end is still shown
                raise TraceWriteError(f"cannot write the trace file: {error.strerror or error}") from None

    def start(self, task: str, model: str, url: str, limits: dict) -> None:
        """limits: the run's own settings (max_rounds, mode, ...), kept for --resume."""
        self.say(f"task: {clip(task, 300)}\nmodel: {model} at {url} ({limits.get('mode', 'json')} mode)")
        self.record("start", task=task, model=model, url=url, **limits, **self.start_fields, ts=time.time())
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
        if self.follow_up is not None:
            return self.followed_up(model, url, done_rounds, limits)
        self.say(f"resuming after round {done_rounds}: {clip(task, 300)}\nmodel: {model} at {url}"
                 f" ({limits.get('mode', 'json')} mode)")
        self.record("resume", model=model, url=url, after_round=done_rounds, **limits, **self.start_fields,
                    ts=time.time())
        self._say_start_notes()

    def followed_up(self, model: str, url: str, done_rounds: int, limits: dict) -> None:
        """--continue: the user's next turn after the run's last round, with the settings the run goes on with."""
        self.say(f"follow-up after round {done_rounds}: {clip(self.follow_up or '', 300)}\nmodel: {model} at {url}"
                 f" ({limits.get('mode', 'json')} mode)")
        self.record("follow_up", text=self.follow_up, model=model, url=url, after_round=done_rounds, **limits,
                    **self.start_fields, ts=time.time())
        self._say_start_notes()

    def reply(self, header: str, reply: Any, prose: str) -> None:
        """Show what the model said besides its actions, under the round's header, before its calls
        run; think blocks are shortened here, not in the trace file."""
        if self.screen:
            self.screen.show_reply(header, reply, prose)

    def action(self, label: str, tool: str, args: Any) -> None:
        """Show an action before it runs (a tool's own prints come after this line)."""
        if self.screen:
            self.screen.show_action(label, tool, args)

    def result(self, call: Any, sent: dict) -> None:
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
        self.record("round", **round_to_line(record))

    def end(self, outcome: Any) -> None:
        if outcome.status != "error":  # an error is one line on stderr, said by the CLI
            self.say(f"\n=== {outcome.summary()} ===", "finished" if outcome.status == "finished" else "stopped")
        for line in outcome.progress:
            self.say(f"  {line}")
        try:
            self.record("end", **{k: v for k, v in outcome.to_json().items() if k not in ("calls", "checks")},
                        resumable=can_resume(outcome))
        except TraceWriteError as error:  # the outcome stands; only its record is missing
            print(f"agent-demo: warning: {error}", file=self.human or sys.stderr)

    def close(self) -> None:
        trace_file, self.trace_file = self.trace_file, None
        if trace_file:
            try:
                trace_file.close()
            except OSError:
                pass  # a full disk refuses the last flush too; the file is closed all the same


def load_trace(data: bytes, name: str, ended_too: bool = False) -> Tuple[dict, List[Round], List[Call]]:
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
                rounds.append(round_from_line(record))
            except (KeyError, TypeError, AttributeError, ValueError):
                raise damaged(f"round {len(rounds) + 1} cannot be read by this version") from None
            started = []
            endings = [call.ends_run for call in rounds[-1].calls]
            status = next((s for s in endings if s in ("finished", "failed")), None)
        elif event == "call":
            if record.get("round") != len(rounds) + 1 or not isinstance(record.get("tool"), str):
                raise damaged(f"a call of round {record.get('round')!r} where round {len(rounds) + 1} was going")
            started.append(Call(record["tool"], record.get("args"), {}))
        elif event == "compaction":
            try:
                compaction = compaction_from_line(record)
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
            add_follow_up(rounds[after_round - 1], text)
            start.update({key: value for key, value in record.items()
                          if key not in ("event", "ts", "after_round", "text")})
            status = None
        elif event == "end":
            status = record.get("status")
        elif event == "resume":  # what a later resume or a fallback set holds for the next resume too
            start.update({key: value for key, value in record.items() if key not in ("event", "ts", "after_round")})
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
    return start, rounds, started


def _record(line: bytes) -> Optional[dict]:
    """One line's record, or None if it is not a JSON object (torn by a crash, or damaged)."""
    try:  # a line torn even mid-character is found out here
        record = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None
