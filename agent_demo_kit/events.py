"""What a run reports as it goes, as typed events for a caller (`run(on_event=...)`, `astream`):
one event for each report the live trace is drawn from (records.RunEvents), made by `EventStream`,
a listener on the run's hooks (seam.py) beside the trace. What an event holds went through the same
redaction as the trace: no key.

It imports records and endings.
"""
import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from agent_demo_kit.endings import RunResult
from agent_demo_kit.records import (Call, Compaction, Reply, Round, RunEvents, Working, compaction_said,  # noqa: F401
                                    fallback_said, retry_said)


@dataclass(frozen=True)
class Started:
    """The run began (resumed: taken up again after `done_rounds` rounds)."""

    task: str
    model: str
    url: str
    resumed: bool = False
    done_rounds: int = 0


@dataclass(frozen=True)
class Text:
    """A piece of the model's reply as it arrives (streamed replies only)."""

    text: str


@dataclass(frozen=True)
class ReplyArrived:
    """Round `round`'s whole reply: its text, what it said besides its actions, its token counts."""

    round: int
    text: str
    prose: str
    usage: dict


@dataclass(frozen=True)
class ToolCalled:
    """Action `index` of the round's reply is about to run (finish and fail too)."""

    round: int
    index: int
    tool: str
    args: Any


@dataclass(frozen=True)
class ToolResult:
    """What the model is told of a call: its result ({"ok": true, "data": ...} or {"ok": false, "error": ...})."""

    round: int
    tool: str
    args: Any
    result: dict


@dataclass(frozen=True)
class AnswerRejected:
    """A finish the loop did not take: a check or the output type rejected it, or a call before it
    failed; `why` is what the model is told. The run goes on (or ends, out of attempts)."""

    round: int
    answer: Any
    why: str


@dataclass(frozen=True)
class Note:
    """Something the trace says once (a repaired action, a retry, a changed request form, a fold)."""

    text: str


@dataclass(frozen=True)
class Escalated:
    """Another model took the run over after round `after_round` (trigger "calm": the first one again)."""

    after_round: int
    from_model: str
    to_model: str
    trigger: str
    reason: str


@dataclass(frozen=True)
class RoundDone:
    """A round is complete, as its trace line records it."""

    round: Round


@dataclass(frozen=True)
class Ended:
    """The run ended: the RunResult the call returns. Always the last event."""

    result: RunResult


# --- what the trace says of a report, in words (screen_trace.ScreenTrace shows the same) --------------------

class _Feeding(Working):
    """Each piece of a streamed reply reported, redacted: what could be the start of a key still being
    written is held back until the next piece says (as the trace's writer does), and said when the
    reply is whole."""

    def __init__(self, emit: Callable[[Any], None], redactor: Any):
        self.emit, self.redactor = emit, redactor
        self.pending = ""

    def feed(self, piece: str) -> None:
        self.pending += piece
        self.say(self.redactor.unsafe_tail(self.pending) if self.redactor else 0)

    def say(self, hold: int) -> None:
        ready, self.pending = self.pending[:len(self.pending) - hold], self.pending[len(self.pending) - hold:]
        if ready:
            self.emit(Text(self.redactor(ready, placeholders=False) if self.redactor else ready))


class EventStream(RunEvents):
    """A listener that makes each report an event for `emit` (on_event, astream's queue), redacted."""

    def __init__(self, emit: Callable[[Any], None], redactor: Any):
        self.emit, self.redactor = emit, redactor
        self.number = 0  # the round whose reply arrived last

    def redact(self, text: str) -> str:
        return self.redactor(text, placeholders=False) if self.redactor else text

    def redact_values(self, value: Any) -> Any:
        return self.redactor.values(value) if self.redactor else value

    @contextlib.contextmanager
    def working(self, label: str = "model working") -> Iterator[Working]:
        feeding = _Feeding(self.emit, self.redactor)
        try:
            yield feeding
        finally:
            feeding.say(hold=0)

    def start(self, task: str, model: str, url: str, kept: dict) -> None:
        self.emit(Started(task, model, url))

    def resume(self, task: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self.number = done_rounds
        self.emit(Started(task, model, url, resumed=True, done_rounds=done_rounds))

    def follow_up(self, text: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self.number = done_rounds
        self.emit(Started(text, model, url, resumed=True, done_rounds=done_rounds))

    def note(self, text: str) -> None:
        self.emit(Note(self.redact(text)))

    def retry(self, cause: str, attempt: int, retries: int, wait: float) -> None:
        self.emit(Note(self.redact(retry_said(cause, attempt, retries, wait))))

    def setting(self, name: str, value: Any, text: str) -> None:
        self.emit(Note(self.redact(text)))

    def fallback(self, from_mode: str, to_mode: str, error: str, from_variant: Optional[str] = None,
                 to_variant: Optional[str] = None) -> None:
        self.emit(Note(self.redact(fallback_said(from_mode, to_mode, error, from_variant, to_variant))))

    def compaction(self, compaction: Compaction) -> None:
        self.emit(Note(compaction_said(compaction)))

    def escalation(self, after_round: int, from_model: str, to_model: str, trigger: str, reason: str,
                   notice: str) -> None:
        self.emit(Escalated(after_round, from_model, to_model, trigger, self.redact(reason)))

    def reply(self, number: int, limit: int, reply: Reply, prose: str, usage: dict, estimated: bool) -> None:
        self.number = number
        self.emit(ReplyArrived(number, self.redact(reply.content), self.redact(prose), dict(usage)))

    def action(self, index: int, count: int, tool: str, args: Any, in_words: bool = False) -> None:
        self.emit(ToolCalled(self.number, index, self.redact(tool), self.redact_values(args)))

    def result(self, call: Call, sent: dict) -> None:
        args, result = self.redact_values(call.args), self.redact_values(call.result)
        self.emit(ToolResult(self.number, self.redact(call.tool), args, result))
        if call.tool == "finish" and not result.get("ok") and isinstance(args, dict) and "result" in args:
            self.emit(AnswerRejected(self.number, args["result"], str(result.get("error"))))

    def round(self, record: Round) -> None:
        redact = self.redact_values  # the trace file redacts the round as it writes it; so does the event
        calls = [dataclasses.replace(call, **redact({name: getattr(call, name) for name in (
            "tool", "args", "result", "id", "note", "check")})) for call in record.calls]
        self.emit(RoundDone(dataclasses.replace(record, model_output=self.redact(record.model_output), calls=calls,
                                                feedback=redact(record.feedback), tool_calls=redact(record.tool_calls))))

    def end(self, outcome: Any) -> None:
        self.emit(Ended(outcome))


EVENT_TYPES = (Started, Text, ReplyArrived, ToolCalled, ToolResult, AnswerRejected, Note, Escalated, RoundDone,
               Ended)
