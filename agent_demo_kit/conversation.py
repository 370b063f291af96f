"""What is re-sent each round: the pinned goal, the newest rounds verbatim, older rounds in a digest.

A request only appends to the one before it: the system prompt, the tool schemas,
the task, the digest and the earlier turns go out byte-identical, so an endpoint's
prompt cache can serve them. When the next request would pass --max-context, one
compaction folds enough of the oldest rounds into the digest that the request
falls to about half the budget, and the new beginning holds for many rounds
again. Compactions are recorded with the rounds, so a resumed run rebuilds the
same bytes. Sizes are running totals and each round's messages and digest lines
are written once, so round 1,000 costs what round 10 did. What the digest no
longer shows, `recall` answers from the run's records. The model's working notes
(`note`) go back in the round that took them, like any result, and a compaction
pins those of the folded rounds after the digest: taking a note costs the prompt
cache nothing, and the notes survive every fold.
"""
import bisect
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from agent_demo_kit import prompts
from agent_demo_kit.actions import strip_think
from agent_demo_kit.records import Call, Compaction, Round, failure, json_size, success, to_json, wire_size
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.settings import Settings
from agent_demo_kit.limits import (ARGS_LABEL_CHARS, DIGEST_ARGS_CHARS, DIGEST_RESULT_WIDTHS, NOTES_CHARS,
                                   PINNED_SHARE, RECALL_NOTE_CHARS, RESULT_MARKER_CHARS, VALUE_SHOWN_CHARS)
from agent_demo_kit.tools import NOTE, RECALL, Tool, in_use


def truncate_result(result: dict, max_chars: int) -> dict:
    """A result whose JSON is longer than max_chars, cut to head and tail and marked truncated."""
    if len(to_json(result)) <= max_chars:
        return result
    key = "data" if "data" in result else "error"
    value = result.get(key)
    text = value if isinstance(value, str) else to_json(value)
    rest = {name: shorten_args(v) for name, v in result.items() if name != key}  # the details beside it
    room = max(RESULT_MARKER_CHARS, max_chars - len(to_json(rest)) - RESULT_MARKER_CHARS)
    return {**rest, key: prompts.clip(text, room), "truncated": True, "original_chars": len(text)}


def shorten_args(args: Any, max_chars: int = ARGS_LABEL_CHARS) -> Any:
    """Arguments (or any value) as a label: unchanged when short, else their JSON cut to head and tail."""
    text = to_json(args)
    return args if len(text) <= max_chars else prompts.clip(text, max_chars)


def assistant_message(record: Round, native_tools: bool = False) -> dict:
    """The model's turn as it is re-sent: without think blocks, never empty."""
    text = strip_think(record.model_output).strip()
    if native_tools and record.tool_calls:
        return {"role": "assistant", "content": text, "tool_calls": record.tool_calls}
    if not text and record.calls:
        actions = [call.action for call in record.calls]
        text = to_json(actions[0] if len(actions) == 1 else actions)
    return {"role": "assistant", "content": text or "(empty reply)"}


def round_messages(record: Round, native_tools: bool = False) -> List[dict]:
    """The messages one completed round adds to the conversation."""
    feedback = record.feedback
    if not native_tools and any(message["role"] == "tool" for message in feedback):
        # A tools-mode round re-sent without function calling (after a fallback or a resume).
        feedback = [{"role": "user", "content": prompts.render_results([m["content"] for m in feedback])}]
    messages = [assistant_message(record, native_tools), *feedback]
    if record.notice is not None:  # another model took over after this round, and is told why
        messages = with_said(messages, record.notice)
    return messages if record.follow_up is None else with_said(messages, prompts.render_follow_up(record.follow_up))


def with_said(messages: List[dict], said: str) -> List[dict]:
    """A round's messages with what the user (or the loop) says after them, in the last user message
    when there is one, so user and assistant turns still alternate."""
    last = messages[-1]
    if last["role"] == "user":
        return [*messages[:-1], {**last, "content": f"{last['content']}\n\n{said}"}]
    return [*messages, {"role": "user", "content": said}]


def digest_line(record: Round, result_chars: int) -> str:
    """One folded round: each call and its result, without the model's prose; bounded in length."""
    if not record.calls:
        return f"round {record.number}: no valid action ({prompts.clip(str(record.result.get('error')), result_chars)})"
    return f"round {record.number}: " + "; ".join(_call_summary(call, result_chars) for call in record.calls)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else to_json(value)


def _call_summary(call: Call, result_chars: int) -> str:
    args = call.args
    shown_args = _as_text(next(iter(args.values()))) if isinstance(args, dict) and len(args) == 1 else _as_text(args)
    result = call.result
    shown = _as_text(result.get("data")) if result.get("ok") else "error: " + _as_text(result.get("error"))
    if call.tool == RECALL.name and result.get("ok"):  # a copy of older rounds: folding it again would only repeat them
        shown = "(recalled; recall again if needed)"
    return (f"{prompts.clip(call.tool, VALUE_SHOWN_CHARS)}({prompts.clip(shown_args, DIGEST_ARGS_CHARS)})"
            f" -> {prompts.clip(shown, result_chars)}")


# --- recall ------------------------------------------------------------------------------

def recall_rounds(rounds: Sequence[Round], max_chars: int, first_round: int, last_round: int = 0) -> dict:
    """What recall answers: earlier rounds' calls and whole results from the run's records, as many as fit."""
    done, last = len(rounds), last_round or first_round
    if first_round < 1:
        return failure("first_round must be at least 1")
    if first_round > done:
        known = f"; rounds 1-{done} can be recalled" if done > 1 else "; round 1 can be recalled" if done else ""
        return failure(f"round {first_round} has not happened yet: this is round {done + 1}{known}")
    if last < first_round:
        return failure(f"last_round {last_round} comes before first_round {first_round}; give 0 or a later round")
    data: Dict[str, Any] = {"rounds": []}
    if last > done:
        data["not_yet"] = f"rounds after {done} have not happened yet"
        last = done
    room = max_chars - RECALL_NOTE_CHARS  # for the note saying what did not fit
    used = len(to_json(success(data)))
    for record in rounds[first_round - 1:last]:
        entry = _recalled(record)
        if used + len(to_json(entry)) + 2 > room:
            if data["rounds"]:
                data["not_shown"] = (f"rounds {record.number}-{last} did not fit; recall them with first_round"
                                     f" {record.number}" if record.number < last
                                     else f"round {last} did not fit; recall it alone")
                break
            share = (room - used) // max(1, len(record.calls))
            entry = _recalled(record, max(RESULT_MARKER_CHARS, share - RESULT_MARKER_CHARS))
        data["rounds"].append(entry)
        used += len(to_json(entry)) + 2
    return success(data)


def _recalled(record: Round, result_chars: Optional[int] = None) -> dict:
    """One round as recall gives it back: each call with its arguments and result, whole or cut to result_chars."""
    if not record.calls:
        return {"round": record.number, "no_action": record.problem or "no usable action"}
    if result_chars is None:
        return {"round": record.number, "calls": [{"tool": c.tool, "args": c.args, "result": c.result}
                                                  for c in record.calls]}
    return {"round": record.number, "calls": [{"tool": c.tool, "args": shorten_args(c.args),
                                               "result": truncate_result(c.result, result_chars)}
                                              for c in record.calls]}


# --- the digest ----------------------------------------------------------------------------

_DIGEST_SEPARATOR = "\n\n"  # between the task and the digest, in one user message


def _header_size(omitted: int) -> int:
    """What a digest without lines adds to the task's message on the wire."""
    return wire_size(_DIGEST_SEPARATOR + prompts.render_digest([], omitted))


class DigestLines:
    """Each folded round's digest line at each width a result may take, written and measured once."""

    def __init__(self, rounds: List[Round], result_chars: int, limit: Callable[[], int]):
        self.rounds = rounds  # the run's own list, growing
        # Folded results keep their full length while the digest has room, then 400, then 100 characters.
        self.widths = sorted({result_chars, *(min(width, result_chars) for width in DIGEST_RESULT_WIDTHS)},
                             reverse=True)
        self.limit = limit  # wider lines stop being written once they add up to more than this
        self.lines: Dict[int, List[str]] = {width: [] for width in self.widths}
        self.totals: Dict[int, List[int]] = {width: [0] for width in self.widths}  # [k]: what lines 1..k add

    def total(self, width: int, count: int) -> Optional[int]:
        """What the lines of rounds 1..count add at this width; None if they add up to more than the limit."""
        lines, totals, narrowest = self.lines[width], self.totals[width], width == self.widths[-1]
        while len(lines) < count and (narrowest or totals[-1] <= self.limit()):
            line = digest_line(self.rounds[len(lines)], width)
            lines.append(line)
            totals.append(totals[-1] + 2 + wire_size(line))  # 2: the escaped newline before it
        return totals[count] if count < len(totals) else None

    def fit(self, count: int, room: int, omitted_before: int = 0) -> Tuple[int, int, int]:
        """The digest of rounds 1..count in room characters, as (width, oldest rounds left out, size):
        every line at the widest width that fits, else the newest lines at the narrowest."""
        if count == 0:
            return self.widths[0], 0, 0
        for width in self.widths:
            total = self.total(width, count)
            if total is not None and _header_size(0) + total <= room:
                return width, 0, _header_size(0) + total
        totals = self.totals[self.widths[-1]]
        size = _header_size(omitted_before) + totals[count] - totals[omitted_before]
        if omitted_before and size <= room:  # leaving out no more than last time, the digest only grows at its end
            return self.widths[-1], omitted_before, size
        # Leave out enough of the oldest that the digest takes about half its room: it can then grow
        # at its end, keeping its beginning, through the next compactions too.
        omitted = bisect.bisect_left(totals, totals[count] - room // 2 + _header_size(count), 0, count)
        while omitted < count and _header_size(omitted) + totals[count] - totals[omitted] > room // 2:
            omitted += 1
        return self.widths[-1], omitted, _header_size(omitted) + totals[count] - totals[omitted]

    def render(self, count: int, width: int, omitted: int) -> str:
        return prompts.render_digest(self.lines[width][omitted:count], omitted)


# --- the working notes ------------------------------------------------------------------------

class Notes:
    """The run's working notes, (round, text) oldest first: the newest that fit in `limit` characters.
    Each note is taken as the model writes it, or from the rounds on a resume: either way the same."""

    def __init__(self, limit: int):
        self.limit = limit
        self.kept: List[Tuple[int, str]] = []

    def add(self, number: int, text: str) -> dict:
        """Take a note written in round `number`: the result the model gets. The oldest notes make room."""
        if not text.strip():
            return failure(prompts.NOTE_EMPTY)
        if _note_size(number, text) > self.limit:
            return failure(prompts.render_note_too_long(_note_size(number, text), self.limit))
        if any(kept == text for _, kept in self.kept):
            return success(prompts.NOTE_KNOWN)
        self.kept.append((number, text))
        dropped: List[int] = []
        while self.used() > self.limit:
            dropped.append(self.kept.pop(0)[0])
        return success(prompts.render_note_taken(self.used(), self.limit, sorted(set(dropped))))

    def used(self) -> int:
        """What the notes take on the wire, each on its line."""
        return sum(_note_size(number, text) for number, text in self.kept)

    def take_in(self, record: Round) -> None:
        """The notes a recorded round took, taken again (a resumed run)."""
        for call in record.calls:
            text = call.args.get("text") if isinstance(call.args, dict) else None
            if call.tool == NOTE.name and call.result.get("ok") and isinstance(text, str):
                self.add(record.number, text)

    def pinned(self, through_round: int) -> str:
        """The notes taken up to this round, as sent after the digest; "" when there are none."""
        notes = [(number, text) for number, text in self.kept if number <= through_round]
        return prompts.render_notes(notes) if notes else ""


def _note_size(number: int, text: str) -> int:
    return 2 + wire_size(prompts.render_note_line(number, text))  # 2: the escaped newline before it


# --- the conversation ------------------------------------------------------------------------

class Conversation:
    """The messages of every request, kept from one request to the next: a round appends its
    messages; a compaction, when the next request would pass --max-context, folds the oldest."""

    def __init__(self, task: str, settings: Settings, registry: Dict[str, Tool], client: Any,
                 on_compaction: Callable[[Compaction], None] = lambda compaction: None, finish: Optional[Tool] = None):
        self.task, self.settings = task, settings
        self.tools = in_use(registry, answer_only=settings.tool_names == [])  # every tool offered
        if finish:  # its result held to an output type: in the prompt, and where the endpoint constrains replies
            self.tools["finish"] = finish
        self.client = client  # owns the request's form (mode, schema variant, ...) and builds its body
        self.rounds: List[Round] = []
        self.on_compaction = on_compaction  # told before the first request that carries the new digest
        self.lines = DigestLines(self.rounds, settings.max_result_chars, lambda: self.budget)
        self._built_for: Optional[tuple] = None  # the form the messages were built for
        self._messages: List[dict] = []
        self._turns: List[Tuple[int, List[dict], int]] = []  # the verbatim rounds: number, messages, size
        self._folded, self._omitted, self._digest = 0, 0, ""  # rounds 1..folded are in the digest, 1..omitted not shown
        self._notes = ""  # the notes of the folded rounds, pinned after the digest
        self.notes = Notes(NOTES_CHARS)  # every note taken so far that still fits
        self._added = 0  # rounds taken in so far, folded or verbatim
        self._bare = self.size = 0  # the request's size on the wire: without any round, and as it stands

    @property
    def mode(self) -> str:
        return self.client.form.mode

    def pinned(self) -> List[dict]:
        """The system prompt and the task: sent first in every request, never folded."""
        return [{"role": "system", "content": prompts.render_system_prompt(
                    self.tools, self.mode, self.settings.max_calls)},
                {"role": "user", "content": prompts.render_task(self.task)}]

    def hand_to(self, client: Any) -> None:
        """Another model (its client) answers from now on: the messages are built again for it from the
        rounds, with what it is told after the last one."""
        self.client, self._built_for = client, None

    def messages(self) -> List[dict]:
        """The next request's messages: the last request's and the rounds since, compacted if over --max-context."""
        if self._built_for != self.client.form.shape():
            self._rebuild()
        for record in self.rounds[self._added:]:
            self._append(record)
        if self.size > self.budget and self._added:
            self._compact()
        return list(self._messages)

    def _rebuild(self) -> None:
        """Build the messages afresh (the first request, a resumed run, another mode), from the last compaction."""
        self._built_for, self._bare = self.client.form.shape(), self.body_size(self.pinned())
        self._folded, self._omitted, self._digest, self._turns, self._added = 0, 0, "", [], 0
        self.notes, self._notes = Notes(min(NOTES_CHARS, max(0, self.budget - self._bare) // 4)), ""
        for record in self.rounds:
            self.notes.take_in(record)
        last = next((index for index in range(len(self.rounds) - 1, -1, -1) if self.rounds[index].compaction), None)
        if last is not None:
            compaction = self.rounds[last].compaction
            self._folded, self._omitted = min(compaction.folded, last + 1), compaction.omitted
            self._digest, self._notes = compaction.digest, compaction.notes
            self._turns = [self._turn(record) for record in self.rounds[self._folded:last + 1]]
            self._added = last + 1
        self._assemble()

    def _turn(self, record: Round) -> Tuple[int, List[dict], int]:
        messages = round_messages(record, self.mode == "tools")
        return record.number, messages, sum(json_size(message) + 2 for message in messages)  # 2: ", "

    def _append(self, record: Round) -> None:
        turn = self._turn(record)
        self._turns.append(turn)
        self._messages.extend(turn[1])
        self.size += turn[2]
        self._added += 1
        if record.compaction:  # rounds handed over with their compactions already made
            self._apply(record.compaction)

    def _apply(self, compaction: Compaction) -> None:
        self._folded, self._omitted, self._digest = compaction.folded, compaction.omitted, compaction.digest
        self._notes = compaction.notes
        self._turns = [turn for turn in self._turns if turn[0] > compaction.folded]
        self._assemble()

    def _assemble(self) -> None:
        """The messages and their size from the pinned goal, the digest and the verbatim rounds."""
        system, task = self.pinned()
        # The follow-ups of folded rounds (--continue), the digest and the notes join the task's message,
        # so user and assistant turns still alternate (some chat templates refuse two user messages in a
        # row). The notes come last: a compaction mostly appends to the digest, so what changes in the
        # notes does not break the prefix sooner.
        parts = (self._pinned_follow_ups(self._folded), self._digest, self._notes)
        added = "".join(_DIGEST_SEPARATOR + part for part in parts if part)
        task = {**task, "content": task["content"] + added} if added else task
        self._messages = [system, task, *(message for _, messages, _ in self._turns for message in messages)]
        self.size = self._bare + wire_size(added) + sum(size for _, _, size in self._turns)

    def _pinned_follow_ups(self, folded: int) -> str:
        """The user's follow-ups (--continue) and the notes of who took the run over (--escalate) after
        rounds 1..folded: once their rounds are folded they stay beside the task, like it, never folded
        or left out."""
        said = []
        for record in self.rounds[:folded]:
            if record.notice is not None:
                said.append(record.notice)
            if record.follow_up is not None:
                said.append(prompts.render_pinned_follow_ups([(record.number, record.follow_up)]))
        return "\n".join(said)

    def _compact(self) -> None:
        """Fold the oldest verbatim rounds into the digest, enough that the request falls to about half the budget;
        the notes of the folded rounds are pinned after it."""
        first, count = self._folded, self._added  # verbatim now: rounds first+1..count
        notes = self.notes.pinned(count)  # the most the notes of the folded rounds can take
        notes_room = wire_size(_DIGEST_SEPARATOR + notes) if notes else 0
        pinned = wire_size(self._pinned_follow_ups(count))  # at most what the follow-ups will take
        half = (self.budget - self._bare - notes_room - pinned) // 2  # the digest and verbatim rounds
        after = [0] * (count - first + 1)  # after[k - first]: what the verbatim rounds after round k take
        for index in range(count - first - 1, -1, -1):
            after[index] = after[index + 1] + self._turns[index][2]
        # The newest keep_recent rounds stay verbatim, unless they alone take more than half.
        keep = max(first, count - self.settings.keep_recent)
        while keep < count and after[keep - first] + _header_size(count) > half:
            keep += 1
        room = half - after[keep - first]  # what the digest may take beside them
        folded = first
        while folded < keep and self.lines.fit(folded, room, self._omitted)[2] + after[folded - first] > half:
            folded += 1
        width, omitted, _ = self.lines.fit(folded, room, self._omitted)
        compaction = Compaction(before_round=count + 1, folded=folded, omitted=omitted,
                                digest=self.lines.render(folded, width, omitted), chars_before=self.size,
                                notes=self.notes.pinned(folded))
        self._apply(compaction)
        compaction.chars_after = self.size
        self.rounds[count - 1].compaction = compaction  # so that the rounds alone rebuild these messages
        getattr(self.client, "folding", lambda: None)()  # a window the server never said: the client says so
        self.on_compaction(compaction)

    def body_size(self, messages: List[dict]) -> int:
        """Characters of the whole request body as it goes on the wire (body() writes it once)."""
        body = self.client.body(messages, self.tools)
        made, text = getattr(self.client, "encoded", (None, ""))
        return len(text) if made is body else json_size(body)

    @property
    def budget(self) -> int:
        """The characters a request may take: --max-context when given, else what the model's window
        holds beside the reply, and never more than the window holds (at CHARS_A_TOKEN a token)."""
        return self.client.request_budget()

    def fits(self) -> bool:
        """Do the system prompt, the task and the schemas, sent with every request, leave room for rounds?"""
        return self.body_size(self.pinned()) <= self.budget * PINNED_SHARE

    def check_fits(self) -> None:
        """ConfigError if the system prompt, task and schemas alone leave too little room for rounds."""
        if not self.fits():
            bare, budget, named = self.body_size(self.pinned()), self.budget, self.settings.named("max_context")
            enough = -(-bare * 4 // 3)
            window = (f" (all the model's window of {self.client.window():,} tokens holds)"
                      if self.settings.max_context is None or budget < self.settings.max_context else "")
            raise ConfigError(f"{named} {budget} is too small{window}: the system prompt, the task and the"
                              f" tool schemas, sent with every request, take {bare:,} characters, and they may"
                              f" take at most {PINNED_SHARE:.0%} of it (the rest is for the rounds); use {named}"
                              f" {enough} or more")

    def feedback(self, parsed: Any, calls: List[Call]) -> List[dict]:
        """The messages that answer a round's reply (an actions.Parsed): each result, cut to size, labelled
        with its call; or how to answer, when it held no usable action."""
        mode = self.mode
        if parsed.words:  # told once how to answer; words again will be the answer
            return [{"role": "user", "content": prompts.render_words_without_action(self.tools, mode)}]
        if parsed.problem:
            return [{"role": "user", "content": prompts.render_format_error(parsed.problem, self.tools, mode)}]
        lines = [prompts.render_call_result(n, {"tool": call.tool, "args": shorten_args(call.args), "note": call.note},
                                            truncate_result(call.result, self.settings.max_result_chars))
                 for n, call in enumerate(calls, 1)]
        if parsed.answers_by_id(mode):  # every tool_call id gets its own answer
            return [{"role": "tool", "tool_call_id": call.id, "content": line} for call, line in zip(calls, lines)]
        return [{"role": "user", "content": prompts.render_results(lines, parsed.cut_off)}]
