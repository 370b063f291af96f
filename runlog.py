"""The run log: the trace people read, the JSON Lines trace file, and reading it back to resume."""
import contextlib
import json
import os
import sys
import time
from typing import Any, ContextManager, List, Optional, TextIO, Tuple

import prompts
from display import Screen, Status, shorten_reasoning, shorten_think
from endings import ConfigError
from output import Redactor, SafeStream
from records import Compaction, Round, compaction_from_line, compaction_to_line, round_from_line, round_to_line
import runs
from runs import RESUMABLE


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
            if not runs.lock(raw):
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
        self.say(f"task: {_first_words(task)}\nmodel: {model} at {url} ({limits.get('mode', 'json')} mode)")
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

    def note(self, text: str) -> None:
        self.say(f"note: {text}", "note")
        self.record("note", text=text, ts=time.time())

    def compaction(self, compaction: Compaction) -> None:
        """Record the digest the requests carry from now on, before the first of them is sent (--resume needs it)."""
        self.say(f"context: rounds 1-{compaction.folded} folded into the digest"
                 f" ({compaction.chars_before:,} -> {compaction.chars_after:,} chars)")
        self.record("compaction", **compaction_to_line(compaction), ts=time.time())

    def resume(self, task: str, model: str, url: str, done_rounds: int, limits: dict) -> None:
        self.say(f"resuming after round {done_rounds}: {_first_words(task)}\nmodel: {model} at {url}"
                 f" ({limits.get('mode', 'json')} mode)")
        self.record("resume", model=model, url=url, after_round=done_rounds, **limits, ts=time.time())

    def reply(self, number: int, max_rounds: int, reply: Any, usage: Optional[dict] = None,
              estimated: bool = False) -> None:
        """Show what the model said, with the round's time and tokens (~ when estimated), before its
        calls run (and before --approve asks about them); think blocks are shortened here, not in
        the trace file."""
        tokens = (usage or {}).get("total_tokens")
        counted = f", {'~' if estimated else ''}{tokens:,} tokens" if isinstance(tokens, int) else ""
        self.say(f"\n--- round {number}/{max_rounds} --- {reply.latency_ms / 1000:.1f} s{counted}", "header")
        if reply.reasoning.strip():
            self.say(f"thinking: {shorten_reasoning(reply.reasoning)}", "dim")
        shown = shorten_think(reply.content.strip()) or (prompts.to_json(reply.tool_calls) if reply.tool_calls
                                                         else f"(empty reply, finish_reason {reply.finish_reason})")
        self.say("model: " + shown)

    def round(self, record: Round) -> None:
        """Show the round's calls and results, and append the round to the trace file."""
        for number, call in enumerate(record.calls, 1):
            label = f"action {number}/{len(record.calls)}" if len(record.calls) > 1 else "action"
            self.say(f"{label}: {call.tool} {prompts.to_json(call.args)}", "action")
            if call.watchdog:
                self.say(f"watchdog: {call.watchdog}", "note")
            if not call.ends_run:
                self.say(f"result: {prompts.to_json(call.result)}", "ok" if call.result.get("ok") else "error")
        if not record.calls:
            self.say(f"result: {prompts.to_json(record.result)}", "error")
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


def _first_words(task: str, limit: int = 300) -> str:
    """The task as the trace shows it: piped-in material can be long."""
    return task if len(task) <= limit else task[:limit] + f"… ({len(task):,} chars)"


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
