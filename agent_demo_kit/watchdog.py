"""The watchdog: notices a model going in circles, the same call again and again or no usable
action at all, and rebuilds what it knew when a run is resumed.

It imports only records.
"""
import json
from typing import Any, Dict, List, Optional, Sequence

from agent_demo_kit.records import Call, Round

FORMAT_ERRORS_BEFORE_STUCK = 3  # replies in a row with no usable action that end a run as stuck


class Watchdog:
    """Notices a model going in circles: the same call again and again, or no action at all."""

    def __init__(self) -> None:
        self.calls: Dict[str, dict] = {}  # canonical call -> {"rounds": [...], "result": first result}
        self.format_errors_in_a_row = 0

    @staticmethod
    def key(action: Any) -> str:
        return json.dumps([action.tool, action.args], sort_keys=True, ensure_ascii=False)

    def earlier(self, action: Any) -> Optional[dict]:
        """What this run already knows about an identical call, or None."""
        return self.calls.get(self.key(action))

    def remember(self, number: int, call: Call) -> None:
        """Count the call; keep its first real result (a cancelled one can be redone)."""
        known = self.calls.setdefault(self.key(call), {"rounds": [], "result": call.result})
        known["rounds"].append(number)
        if known["result"].get("cancelled") and not call.result.get("cancelled"):
            known["result"] = call.result

    def count_reply(self, calls: List[Call]) -> int:
        """A reply with no usable call (no action, or only calls with broken arguments) adds to the
        streak; returns the streak."""
        usable = any(not call.format_error for call in calls)
        self.format_errors_in_a_row = 0 if usable else self.format_errors_in_a_row + 1
        return self.format_errors_in_a_row

    def stuck_on_format(self, calls: List[Call]) -> bool:
        """Counted this reply in: FORMAT_ERRORS_BEFORE_STUCK replies in a row without a usable call."""
        return self.count_reply(calls) >= FORMAT_ERRORS_BEFORE_STUCK

    def hand_over(self) -> None:
        """Another model takes the run over: it starts its own count. Each call made so far counts as made
        once, in the first round it was, so the new model's first repeat of one is answered with its
        recorded result and a note (not run again, not a stuck ending); only its own repeats go on."""
        for known in self.calls.values():
            known["rounds"] = known["rounds"][:1]
        self.format_errors_in_a_row = 0

    def replay(self, rounds: Sequence[Round]) -> None:
        """Rebuild the state of a resumed run from its rounds, as live execution left it (a hand-over
        after a round that told the model of one included)."""
        for record in rounds:
            self.count_reply(record.calls)
            for call in record.calls:
                if call.watched:
                    self.remember(record.number, call)
            if record.notice is not None:
                self.hand_over()
