"""What a run is made of, as plain data: the model's replies, each round with its calls, the
compactions, the token counts, and what a run reports as it goes (RunEvents). Each record says
how it is written to a trace file and read back. How a run ends is endings.py's.

It imports only limits: everything else may import it.
"""
import contextlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional

from agent_demo_kit.limits import ESTIMATED_CHARS_A_TOKEN


# --- JSON as records and requests hold it -----------------------------------------------------

def to_json(value: Any) -> str:
    """JSON as people and the model read it: compact, non-ASCII kept readable."""
    return json.dumps(value, ensure_ascii=False)


def json_size(value: Any) -> int:
    """Characters a value takes in a request body (non-ASCII escaped, as requests sends it)."""
    return len(json.dumps(value))


def wire_size(text: str) -> int:
    """Characters text takes inside a JSON string in a request."""
    return json_size(text) - 2


def printable(text: str) -> str:
    """text that any UTF-8 stream takes: a lone surrogate (from a "\\ud83d" escape) becomes "?"."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def success(data: Any) -> dict:
    """The result of a call that worked: what every tool answers."""
    return {"ok": True, "data": data}


def failure(error: str, **details: Any) -> dict:
    """The result of a call that did not work; details help the model fix it."""
    return {"ok": False, "error": error, **details}


# --- a reply, a call, a round ---------------------------------------------------------------------

@dataclass
class Reply:
    """What the model said in one round, however it arrived (a plain body or server-sent events)."""

    content: str
    tool_calls: List[dict] = field(default_factory=list)
    usage: Optional[dict] = None
    latency_ms: int = 0
    finish_reason: Optional[str] = None  # "length" when the reply was cut off
    reasoning: str = ""  # reasoning_content, which some servers send beside the content
    unread: Optional[str] = None  # what of a streamed reply was left unread, past a limit (then said once)


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
    ends_run: Optional[str] = None  # the status of the ending this call reached: "finished", "failed", "stuck"
    check: Optional[dict] = None  # what --check said of a finish: command, exit_code, output, ms

    @property
    def action(self) -> dict:
        return {"tool": self.tool, "args": self.args}


_CALL_FLAGS = ("id", "note", "watchdog", "watched", "format_error", "ends_run", "check")


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

    def to_line(self) -> dict:
        """The compaction as the trace file keeps it (the "compaction" event, without the event name)."""
        line = {"before_round": self.before_round, "folded": self.folded, "omitted": self.omitted,
                "chars_before": self.chars_before, "chars_after": self.chars_after, "digest": self.digest}
        if self.notes:
            line["notes"] = self.notes
        return line

    @classmethod
    def from_line(cls, line: dict) -> "Compaction":
        """A compaction read back from its trace line; KeyError or TypeError if the line is not one."""
        before_round, folded, omitted = line["before_round"], line["folded"], line.get("omitted", 0)
        if not all(isinstance(n, int) for n in (before_round, folded, omitted)) \
                or not 0 <= omitted <= folded < before_round or not isinstance(line["digest"], str) \
                or not isinstance(line.get("notes") or "", str):
            raise TypeError("not a compaction")
        return cls(before_round, folded, omitted, line["digest"], chars_before=line.get("chars_before") or 0,
                   chars_after=line.get("chars_after") or 0, notes=line.get("notes") or "")


@dataclass
class Round:
    """One request and its reply, the calls it made and the messages that answered it."""

    number: int
    model_output: str
    calls: List[Call]
    feedback: List[dict]  # the messages sent back, exactly
    mode: str = "json"  # how actions were asked for (a trace written before modes were recorded: json)
    latency_ms: int = 0
    usage: Dict[str, Any] = field(default_factory=dict)
    usage_estimated: bool = False
    problem: Optional[str] = None  # why the reply held no usable action
    tool_calls: Optional[List[dict]] = None  # a tools-mode reply's calls, re-sent as written
    compaction: Optional[Compaction] = None  # made after this round, before the next request
    follow_up: Optional[str] = None  # the user's next turn after this round (--continue), recorded on its own
    request_chars: int = 0  # the request's size as measured against --max-context
    model: Optional[str] = None  # the model that answered, recorded when a run may change models (--escalate)
    notice: Optional[str] = None  # what the loop told the model after this round (who took over, and why)

    @property
    def result(self) -> dict:
        """The first call's result, or the format error: what a one-line summary shows."""
        return self.calls[0].result if self.calls else failure("format error: " + (self.problem or ""))

    def add_follow_up(self, text: str) -> None:
        """The user's next turn after this round (--continue), joined to one given before that got no reply.
        A compaction made after the round was for a request without it: the next request is folded anew."""
        self.follow_up = text if self.follow_up is None else f"{self.follow_up}\n\n{text}"
        self.compaction = None

    def to_line(self) -> dict:
        """The round as the trace file keeps it (the "round" event, without the event name)."""
        calls = []
        for call in self.calls:
            line = {"tool": call.tool, "args": call.args, "result": call.result}
            line.update({name: getattr(call, name) for name in _CALL_FLAGS if getattr(call, name)})
            calls.append(line)
        line = {"round": self.number, "model_output": self.model_output,
                "action": self.calls[0].action if self.calls else None, "result": self.result,
                "calls": calls, "feedback": self.feedback, "mode": self.mode,
                "latency_ms": self.latency_ms, "usage": self.usage, "usage_estimated": self.usage_estimated}
        if self.tool_calls is not None:
            line["tool_calls"] = self.tool_calls
        if self.problem is not None:
            line["problem"] = self.problem
        if self.request_chars:
            line["request_chars"] = self.request_chars
        if self.model is not None:
            line["model"] = self.model
        return line

    @classmethod
    def from_line(cls, line: dict) -> "Round":
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
        return cls(number=line["round"], model_output=line.get("model_output") or "", calls=calls,
                   feedback=list(line["feedback"]), mode=line.get("mode") or "json",
                   latency_ms=line.get("latency_ms") or 0, usage=usage if isinstance(usage, dict) else {},
                   usage_estimated=bool(line.get("usage_estimated")), problem=problem,
                   tool_calls=line.get("tool_calls"),
                   request_chars=line["request_chars"] if is_count(line.get("request_chars")) else 0,
                   model=line["model"] if isinstance(line.get("model"), str) else None)


# --- token counts ---------------------------------------------------------------------------------

MOST_TOKENS_A_ROUND = 10_000_000  # more than any model's context holds: a count above it is not a count
COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def is_count(value: Any) -> bool:
    """A token count that can be true: a whole number, not negative, not absurd (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MOST_TOKENS_A_ROUND


def impossible_counts(usage: Optional[dict]) -> dict:
    """The counts an endpoint reported that cannot be true (-1e9, NaN, true): the round is then estimated."""
    usage = usage or {}
    return {key: usage[key] for key in COUNTS if usage.get(key) is not None and not is_count(usage[key])}


def cached_tokens(usage: dict) -> Optional[int]:
    """Prompt tokens the endpoint served from its cache, as OpenAI, vLLM and Qwen or as DeepSeek report them."""
    details = usage.get("prompt_tokens_details")
    for value in (details.get("cached_tokens") if isinstance(details, dict) else None,
                  usage.get("prompt_cache_hit_tokens")):
        if is_count(value):
            return value
    return None


def count_usage(reply: Reply, request_chars: Callable[[], int], note: Callable[[str], None]) -> tuple:
    """The round's token counts and whether they are estimated: the endpoint's when they can be
    true, else about ESTIMATED_CHARS_A_TOKEN characters a token, so no reply can give back the budget it spent
    (and `note` is told why). request_chars gives the request's size, asked only for an estimate
    (measuring costs a serialization)."""
    impossible = impossible_counts(reply.usage)
    if impossible:
        note(f"the endpoint reported token counts that cannot be right ({to_json(impossible)}); this round's tokens"
             " are estimated")
    usage = reply.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    cached = cached_tokens(usage)
    if cached is not None:
        usage = {**usage, "cached_tokens": cached}
    if not impossible_counts(usage):
        if is_count(usage.get("total_tokens")):
            return usage, False
        if is_count(prompt) and is_count(completion):
            return {**usage, "total_tokens": prompt + completion}, False
    prompt = request_chars() // ESTIMATED_CHARS_A_TOKEN
    written = len(reply.content) + (len(to_json(reply.tool_calls)) if reply.tool_calls else 0)
    completion = written // ESTIMATED_CHARS_A_TOKEN
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}, True


def add_usage(total: dict, record: Round) -> None:
    """Add one round's token counts to the run's totals (a count a trace holds that cannot be true is not added)."""
    for key in (*COUNTS, "cached_tokens"):
        value = record.usage.get(key)
        if is_count(value):
            total[key] = total.get(key, 0) + value
    if record.usage_estimated:
        total["estimated"] = True


def total_usage(rounds: List[Round]) -> dict:
    """The token counts of these rounds (a resumed run goes on counting)."""
    total: dict = {}
    for record in rounds:
        add_usage(total, record)
    return total


def answer_text(value: Any) -> str:
    """An answer as people (and --check) read it: text as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


# --- what a run reports as it goes ------------------------------------------------------------------

class Working:
    """What a status line is told while the model, a tool or a check works: here, nothing."""

    def feed(self, piece: str) -> None:
        """A piece of a streamed reply."""


class RunEvents:
    """Everything a run reports as it goes, to whoever listens: this one keeps nothing and hides
    nothing. A run tells them to its hooks (seam.py), which tell every listener: the screen
    (screen_trace.ScreenTrace), the trace file (trace_file.TraceFile), ...; the loop, the client and the
    conversation know only these methods."""

    def redact(self, text: str) -> str:
        """text without the secrets, before it goes to the model."""
        return text

    def redact_values(self, value: Any) -> Any:
        """JSON data with the secrets taken out of its strings."""
        return value

    def working(self, label: str = "model working") -> ContextManager[Working]:
        return contextlib.nullcontext(Working())

    def start(self, task: str, model: str, url: str, kept: dict) -> None:
        """A new run: its task, where requests go, and the settings a resume keeps."""

    def resume(self, task: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        """A run taken up again after its last completed round."""

    def follow_up(self, text: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        """The user's next turn after a run's last round (--continue)."""

    def note(self, text: str) -> None:
        """Something the user should know, said once."""

    def retry(self, cause: str, attempt: int, retries: int, wait: float) -> None:
        """One attempt failed and the next is coming."""

    def setting(self, name: str, value: Any, text: str) -> None:
        """The endpoint made the run change how it asks (kept by --resume)."""

    def fallback(self, from_mode: str, to_mode: str, error: str, from_variant: Optional[str] = None,
                 to_variant: Optional[str] = None) -> None:
        """The endpoint refused a form of request; the next one is tried."""

    def compaction(self, compaction: Compaction) -> None:
        """Older rounds were folded, before the first request that carries the new digest."""

    def escalation(self, after_round: int, from_model: str, to_model: str, trigger: str, reason: str,
                   notice: str) -> None:
        """Another model takes the run over after round `after_round` (trigger "calm": the first model again),
        and is told so (notice)."""

    def reply(self, number: int, limit: int, reply: Reply, prose: str, usage: dict, estimated: bool) -> None:
        """Round `number` of at most `limit`: the model's reply arrived (prose: what it said besides its
        actions), with its token counts."""

    def action(self, index: int, count: int, tool: str, args: Any, in_words: bool = False) -> None:
        """Action `index` of the reply's `count` is about to run (in_words: the reply's words, as its answer)."""

    def result(self, call: Call, sent: dict) -> None:
        """What the model is told of a call."""

    def call_started(self, number: int, call: Call) -> None:
        """A call with side effects is about to run (written ahead, for a resume after a crash)."""

    def round(self, record: Round) -> None:
        """A round is complete."""

    def end(self, outcome: Any) -> None:  # an endings.RunResult
        """The run ended."""


MOST_A_FIGURE = 1e15  # more rounds, tokens or seconds than any run has: a damaged file's number


def number(value: Any) -> float:
    """A figure as a number: 0 for anything that is not one (or not one a run could have)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or isinstance(value, float) \
            and not math.isfinite(value):
        return 0
    return value if -MOST_A_FIGURE <= value <= MOST_A_FIGURE else 0  # an int of 400 digits is no float


# --- the reports in words: the same on the screen and in a caller's events ---------------------

def retry_said(cause: str, attempt: int, retries: int, wait: float) -> str:
    if attempt:
        return f"{cause}, retry {attempt}/{retries} in {wait:.3g} s"
    return f"{cause}; sent again in {wait:.3g} s"  # a batch's shared limit took the blame: no retry spent


def fallback_said(from_mode: str, to_mode: str, error: str, from_variant: Optional[str],
                  to_variant: Optional[str]) -> str:
    rejected = f"{from_mode} mode" + (f" as {from_variant}" if from_variant else "")
    then = f"trying {to_variant}" if to_variant else f"falling back to {to_mode} mode"
    return f"the endpoint rejected {rejected} ({error}); {then}"


def compaction_said(compaction: Compaction) -> str:
    return (f"rounds 1-{compaction.folded} folded into the digest ({compaction.chars_before:,} ->"
            f" {compaction.chars_after:,} chars)")
