"""A cheap model first, a stronger one on trouble (--escalate): who is in charge of a run, and when
that changes. The loop asks after each round (and after an endpoint error) whether the first model
is in trouble by what the loop itself sees: no usable action again and again, a call repeated until
the watchdog calls it stuck, an answer --check rejected, replies cut at the cap, an endpoint that
failed after its retries. The stronger model then takes the same conversation over, told once why
(the receipt). After --escalate-back good rounds it hands the run back; after --escalate-max
escalations it keeps it, so models never take turns in circles.

It imports records, settings and prompts; the loop (agent_demo.py) does the switching.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from agent_demo_kit import prompts
from agent_demo_kit.records import Round, to_json
from agent_demo_kit.endings import CheckFailed, EndpointError, RunEnded, Stuck
from agent_demo_kit.settings import Settings
from agent_demo_kit.limits import LAST_WORDS_CHARS

# The first model's endpoint failures that the stronger model may get past: not found, overloaded,
# down or silent. A refused key or a request the endpoint rejects would only fail again.
PASSING_STATUSES = (404, 408, 429, 500, 502, 503, 504, 529)
CUTS_IN_A_ROW = 2  # replies cut at the cap in a row that hand the run over
TRIED_SHOWN = 8  # the calls the receipt lists, the last ones


@dataclass
class Takeover:
    """A change of who is in charge: why (the trigger, and a line for people), and what else the
    model that takes over is told."""

    trigger: str  # format, stuck, check, length, endpoint; "calm": back to the first model
    reason: str  # for people: the trace's line
    detail: str = ""
    told: str = ""  # the reason as the model is told it, when not the same (no URLs, no advice for people)


class Escalation:
    """The two models of a run (their clients) and which one is in charge."""

    def __init__(self, settings: Settings, first: Any, second: Any):
        self.settings = settings
        self.clients = {"first": first, "second": second}
        self.in_charge = "first"
        self.escalations = 0  # hand-overs to the stronger model so far (resumes included)
        self.good = 0  # the stronger model's good rounds in a row
        self.cut = 0  # replies in a row cut at the reply cap

    @property
    def client(self) -> Any:
        return self.clients[self.in_charge]

    def model(self, which: str) -> str:
        return self.clients[which].settings.model

    def may_escalate(self, trigger: str) -> bool:
        return self.in_charge == "first" and trigger in self.settings.escalate_on \
            and self.escalations < self.settings.escalate_max

    def after_round(self, record: Round, finish_reason: Optional[str], ending: Optional[RunEnded]) -> Optional[Takeover]:
        """What a completed round means for who is in charge: the stronger model takes over (the first
        one's trouble), the first one takes the run back (the stronger one's good rounds), or None."""
        self.cut = self.cut + 1 if finish_reason == "length" else 0
        trouble = self.trouble(record, ending)
        if self.in_charge == "second":
            self.good = 0 if trouble or not good_round(record) or self.cut else self.good + 1
            back = self.settings.escalate_back
            if back and self.good >= back and self.escalations < self.settings.escalate_max:
                return Takeover("calm", f"{self.good} good round{'s' if self.good > 1 else ''} in a row by"
                                        f" {self.model('second')}")
            return None
        return trouble if trouble and self.may_escalate(trouble.trigger) else None

    def trouble(self, record: Round, ending: Optional[RunEnded]) -> Optional[Takeover]:
        """The first model's trouble this round shows, if any."""
        if isinstance(ending, Stuck) and ending.call is not None:
            call = ending.call
            return Takeover("stuck", "it repeated the same call until the watchdog stopped it",
                            f"It made the call {call.tool} {shortened(to_json(call.args), 200)} again and again.")
        if isinstance(ending, Stuck):
            return Takeover("format", "its replies held no usable action, again and again",
                            f"What was wrong with its last reply: {record.problem or 'no usable action'}.")
        rejected = [call for call in record.calls if call.check and call.check.get("exit_code") != 0]
        if rejected and not isinstance(ending, CheckFailed):
            check = rejected[-1].check
            answer = rejected[-1].args.get("result") if isinstance(rejected[-1].args, dict) else None
            said = " ".join(str(check.get("output") or "").split()) or "(nothing)"
            return Takeover("check", "the check rejected its answer",
                            f"Its answer was {shortened(to_json(answer), 300)}; the check said:"
                            f" {shortened(said, LAST_WORDS_CHARS)}")
        if self.cut >= CUTS_IN_A_ROW:
            cap = self.clients["first"].settings.max_reply_tokens
            return Takeover("length", f"its last {self.cut} replies were cut at the reply cap",
                            f"The cap is {cap:,} tokens a reply: keep replies short.")
        return None

    def on_endpoint_error(self, error: EndpointError) -> Optional[Takeover]:
        """The first model's endpoint failed after its retries: the stronger model may get past it
        (not found, overloaded, down), unless the key or the request itself was refused."""
        status = getattr(error, "http_status", None)
        if not self.may_escalate("endpoint") or status is not None and status not in PASSING_STATUSES:
            return None
        first, second = (self.clients[which].settings.endpoint for which in ("first", "second"))
        if status is None and first == second:  # no answer at all: the same server would give none either
            return None
        return Takeover("endpoint", f"its endpoint failed: {' '.join(str(error).split())}",
                        told=f"its endpoint failed{f' (HTTP {status})' if status else ' (no usable answer)'}")

    def hand_over(self, takeover: Takeover, conversation: Any, trace: Any) -> str:
        """The other model takes the run over: the same conversation, built again for it, with the notice
        that says why after the last round (or with the task, before the first), and a record of it in
        the trace; the notice, redacted (it quotes the model and the check)."""
        rounds, before = conversation.rounds, self.client.settings.model
        notice = trace.redact(self.switch(takeover, rounds))
        conversation.hand_to(self.client)
        if rounds:
            rounds[-1].notice = notice if rounds[-1].notice is None else f"{rounds[-1].notice}\n\n{notice}"
        else:
            conversation.task += f"\n\n{notice}"
        trace.escalation(len(rounds), before, self.client.settings.model, takeover.trigger, takeover.reason, notice)
        return notice

    def switch(self, takeover: Takeover, rounds: List[Round]) -> str:
        """Hand the run over as takeover says; the notice the model that takes over is given."""
        before = self.in_charge
        self.in_charge = "first" if takeover.trigger == "calm" else "second"
        self.good = self.cut = 0
        if takeover.trigger == "calm":
            return prompts.render_handback(self.model("first"), self.model("second"), self.settings.escalate_back)
        self.escalations += 1
        return prompts.render_takeover(self.model("second"), self.model(before), takeover.told or takeover.reason,
                                       takeover.detail, tried(rounds))

    def restore(self, switches: List[dict], rounds: List[Round]) -> None:
        """Who is in charge of a resumed run, and how often it escalated, from its escalation records;
        the good rounds since the last switch are counted again."""
        last = 0
        for switch in switches:
            calm = switch.get("trigger") == "calm"
            self.in_charge = "first" if calm else "second"
            self.escalations += not calm
            last = switch.get("after_round") if isinstance(switch.get("after_round"), int) else last
        if self.in_charge == "second":
            for record in rounds[last:]:
                self.good = self.good + 1 if good_round(record) else 0


def shortened(text: str, most: int) -> str:
    """text cut to `most` characters with an ellipsis: the note is read by a model, not parsed."""
    return text if len(text) <= most else text[:most - 1] + "…"


def good_round(record: Round) -> bool:
    """A round without trouble: a usable action, none malformed, repeated or rejected by the check."""
    return not record.problem and bool(record.calls) and not any(
        call.format_error or call.watchdog in ("refused", "stuck")
        or call.check and call.check.get("exit_code") != 0 for call in record.calls)


def tried(rounds: List[Round]) -> List[str]:
    """The last calls of the run, each once, with how they went: what the receipt lists."""
    seen: Dict[str, str] = {}
    for record in rounds:
        for call in record.calls:
            label = f"{call.tool} {shortened(to_json(call.args), 80)}"
            result = call.result
            seen.pop(label, None)
            error = " ".join(str(result.get("error")).split())  # one line
            seen[label] = "ok" if result.get("ok") else f"failed ({shortened(error, 80)})"
    return [f"{label}: {outcome}" for label, outcome in list(seen.items())[-TRIED_SHOWN:]]
