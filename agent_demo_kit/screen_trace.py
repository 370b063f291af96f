"""The listener that draws a run for a person: each report as it comes, on the screen that
terminal.py makes (stderr, live on a terminal), or nowhere when there is none (--quiet, a Python
caller), without loading the terminal's code then.

It imports records, limits and prompts.
"""
import contextlib
from typing import Any, ContextManager, List, Optional

from agent_demo_kit.records import compaction_said, fallback_said, retry_said
from agent_demo_kit.limits import TASK_SHOWN_CHARS
from agent_demo_kit.prompts import clip
from agent_demo_kit.records import Compaction, RunEvents, Working, to_json


class ScreenTrace(RunEvents):
    """What a person sees of a run: each report as it comes, on the screen (None: nowhere), and the
    live line while the model, a tool or a check works. The trace file (trace_file.py) is another
    listener beside it."""

    def __init__(self, screen: Any = None, url_note: str = "", header_said: bool = False):
        """url_note: said on the header line (where requests go was chosen by ./.env); header_said: the
        run's first lines were said before any request (header())."""
        self.screen, self.url_note, self.header_said = screen, url_note, header_said

    def say(self, text: str, kind: Optional[str] = None) -> None:
        if self.screen:
            self.screen.say(text, kind)

    def working(self, label: str = "model working") -> ContextManager[Working]:
        return self.screen.working(label) if self.screen else contextlib.nullcontext(Working())

    def header(self, task: str, model: str, url: str, mode: str) -> None:
        """The run's first lines, said before any request is made (a local server's window is asked
        before the start is recorded); start() does not say them again."""
        self.say(f"task: {clip(task, TASK_SHOWN_CHARS)}\nmodel: {model} at {url}{self.url_note} ({mode} mode)")
        self.header_said = True

    def start(self, task: str, model: str, url: str, kept: dict) -> None:
        if not self.header_said:
            self.header(task, model, url, str(kept.get("mode")))

    def resume(self, task: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self.say(f"resuming after round {done_rounds}: {clip(task, TASK_SHOWN_CHARS)}\nmodel: {model} at {url}"
                 f"{self.url_note} ({kept.get('mode')} mode)")

    def follow_up(self, text: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self.say(f"follow-up after round {done_rounds}: {clip(text, TASK_SHOWN_CHARS)}\nmodel: {model} at {url}"
                 f"{self.url_note} ({kept.get('mode')} mode)")

    def fallback(self, from_mode: str, to_mode: str, error: str, from_variant: Optional[str] = None,
                 to_variant: Optional[str] = None) -> None:
        self.say(f"note: {fallback_said(from_mode, to_mode, error, from_variant, to_variant)}", "note")

    def setting(self, name: str, value: Any, text: str) -> None:
        self.say(f"note: {text}", "note")

    def retry(self, cause: str, attempt: int, retries: int, wait: float) -> None:
        self.say(f"note: {retry_said(cause, attempt, retries, wait)}", "note")

    def note(self, text: str) -> None:
        self.say(f"note: {text}", "note")

    def escalation(self, after_round: int, from_model: str, to_model: str, trigger: str, reason: str,
                   notice: str) -> None:
        said = f"back to {to_model}: {reason}" if trigger == "calm" else f"escalated to {to_model}: {reason}"
        self.say(f"{said} (after round {after_round})", "note")

    def compaction(self, compaction: Compaction) -> None:
        self.say(f"context: {compaction_said(compaction)}")

    def reply(self, number: int, limit: int, reply: Any, prose: str, usage: dict, estimated: bool) -> None:
        """What the model said besides its actions, under the round's header, before its calls run; think
        blocks are shortened here, not in the trace file."""
        if self.screen:
            self.screen.show_reply(number, limit, reply, prose, usage, estimated)

    def action(self, index: int, count: int, tool: str, args: Any, in_words: bool = False) -> None:
        if self.screen:  # before it runs: a tool's own prints come after this line
            self.screen.show_action(index, count, tool, args, in_words)

    def result(self, call: Any, sent: dict) -> None:
        if self.screen:  # what the model is told of a call: its result as sent
            self.screen.show_result(call, sent)

    def round(self, record: Any) -> None:
        if not record.calls:  # its calls were shown as they ran
            self.say(f"result: {to_json(record.result)}", "error")

    def end(self, outcome: Any) -> None:
        self.ended(outcome.status, outcome.summary(), outcome.progress, outcome.models)

    def ended(self, status: str, summary: str, progress: List[str], models: Optional[dict] = None) -> None:
        """How the run ended, and the lines after it (an error is one line on stderr, said by the caller);
        with --escalate, each model's rounds and tokens."""
        if status != "error":
            self.say(f"\n=== {summary} ===", "finished" if status == "finished" else "stopped")
        if models:
            self.say("  " + "; ".join(f"{name}: {used.get('rounds', 0)} round(s), {used.get('tokens', 0):,} tokens"
                                      for name, used in models.items() if isinstance(used, dict)))
        for line in progress:
            self.say(f"  {line}")
