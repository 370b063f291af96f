"""What a run remembers: each round and each tool call, each compaction, and their trace-file lines.

A round holds everything needed to show it and to rebuild the conversation
(the model's output, its calls and results, the exact feedback sent), and a
compaction the exact digest it put in the requests, so `--resume` replays the
trace file instead of guessing.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

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
    error = (line.get("result") or {}).get("error")
    problem = None
    if not calls:
        problem = str(error or "").replace("format error: ", "", 1)
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
