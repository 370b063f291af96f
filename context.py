"""What is re-sent each round: the pinned goal, recent rounds verbatim, older rounds as a digest.

The conversation is rebuilt for every request from the round records (the same
records the trace file holds), so a resumed run with the same settings sends what
the original would have.
"""
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List

import prompts
from actions import strip_think
from endings import ConfigError
from records import Call, Round
from settings import Settings
from tools import Tool

def request_size(messages: List[dict]) -> int:
    """Characters the messages take on the wire (JSON, non-ASCII escaped as requests sends it)."""
    return len(json.dumps(messages))


def _cut(text: str, keep: int) -> str:
    """Head and tail of text with a marker saying how much was dropped in between."""
    if len(text) <= keep:
        return text
    head, tail = keep * 2 // 3, keep // 3
    return f"{text[:head]} ...{prompts.TRUNCATED.format(count=len(text) - head - tail)}... {text[len(text) - tail:]}"


def truncate_result(result: dict, max_chars: int) -> dict:
    """A result whose JSON is longer than max_chars, cut to head and tail and marked truncated."""
    if len(prompts.to_json(result)) <= max_chars:
        return result
    key = "data" if "data" in result else "error"
    value = result.get(key)
    text = value if isinstance(value, str) else prompts.to_json(value)
    rest = {name: _cut(prompts.to_json(v), 200) if len(prompts.to_json(v)) > 200 else v
            for name, v in result.items() if name != key}
    room = max(100, max_chars - len(prompts.to_json(rest)) - 100)  # 100: the marker and the two new fields
    return {**rest, key: _cut(text, room), "truncated": True, "original_chars": len(text)}


def shorten_args(args: Any, max_chars: int = 200) -> Any:
    """Arguments as a label: unchanged when short, else their JSON cut to head and tail."""
    text = prompts.to_json(args)
    return args if len(text) <= max_chars else _cut(text, max_chars)


def assistant_message(record: Round, native_tools: bool = False) -> dict:
    """The model's turn as it is re-sent: without think blocks, never empty."""
    text = strip_think(record.model_output).strip()
    if native_tools and record.tool_calls:
        return {"role": "assistant", "content": text, "tool_calls": record.tool_calls}
    if not text and record.calls:
        actions = [call.action for call in record.calls]
        text = prompts.to_json(actions[0] if len(actions) == 1 else actions)
    return {"role": "assistant", "content": text or "(empty reply)"}


def round_messages(record: Round, native_tools: bool = False) -> List[dict]:
    """The messages one completed round adds to the conversation."""
    feedback = record.feedback
    if not native_tools and any(message["role"] == "tool" for message in feedback):
        # A tools-mode round re-sent without function calling (after a fallback or a resume).
        feedback = [{"role": "user", "content": prompts.render_results([m["content"] for m in feedback])}]
    return [assistant_message(record, native_tools), *feedback]


def digest_line(record: Round, result_chars: int) -> str:
    """One folded round: each call and its result, without the model's prose; bounded in length."""
    if not record.calls:
        return f"round {record.number}: no valid action ({_cut(str(record.result.get('error')), result_chars)})"
    return f"round {record.number}: " + "; ".join(_call_summary(call, result_chars) for call in record.calls)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else prompts.to_json(value)


def _call_summary(call: Call, result_chars: int) -> str:
    args = call.args
    shown_args = _as_text(next(iter(args.values()))) if isinstance(args, dict) and len(args) == 1 else _as_text(args)
    result = call.result
    shown = _as_text(result.get("data")) if result.get("ok") else "error: " + _as_text(result.get("error"))
    return f"{_cut(call.tool, 60)}({_cut(shown_args, 120)}) -> {_cut(shown, result_chars)}"


def build_messages(pinned: List[dict], records: List[Round], max_chars: int, keep_recent: int = 4,
                   result_chars: int = 4000, native_tools: bool = False) -> List[dict]:
    """The messages for the next request, folding the oldest rounds until they fit max_chars."""
    turns = [round_messages(record, native_tools) for record in records]
    turn_sizes = [request_size(turn) for turn in turns]
    base = request_size(pinned)
    if base + sum(turn_sizes) <= max_chars:
        return [*pinned, *(m for turn in turns for m in turn)]
    # Over budget: fold all but the last keep_recent rounds, and more only if even that is too big.
    # Folded results keep their full length while they fit, and are shortened only as far as needed.
    for digest_chars in (result_chars, 400, 100):
        lines = [digest_line(record, digest_chars) for record in records]
        folded = max(1, len(turns) - keep_recent)
        while folded < len(turns) and base + _digest_size(lines[:folded]) + sum(turn_sizes[folded:]) > max_chars:
            folded += 1
        room = max_chars - base - sum(turn_sizes[folded:])
        if _digest_size(lines[:folded]) <= room:
            break
    # Last resort for a budget too small for the whole digest: drop its oldest lines, saying so.
    kept, dropped = lines[:folded], 0
    while kept and _digest_size(kept, dropped) > room:
        kept, dropped = kept[1:], dropped + 1
    # The digest joins the task's message, so user and assistant turns still alternate
    # (some chat templates refuse two user messages in a row).
    task = pinned[-1]
    with_digest = {**task, "content": task["content"] + _DIGEST_SEPARATOR + prompts.render_digest(kept, dropped)}
    return [*pinned[:-1], with_digest, *(m for turn in turns[folded:] for m in turn)]


_DIGEST_SEPARATOR = "\n\n"


def _digest_size(lines: List[str], dropped: int = 0) -> int:
    """What the digest adds to the request: its text, escaped as JSON, inside the task's message."""
    return len(json.dumps(_DIGEST_SEPARATOR + prompts.render_digest(lines, dropped))) - 2


@dataclass
class Conversation:
    """What every request is built from: the pinned goal, the mode, the rounds so far."""

    task: str
    registry: Dict[str, Tool]
    settings: Settings
    rounds: List[Round] = field(default_factory=list)
    mode: str = "json"
    mode_worked: bool = False  # the endpoint has answered a request in this mode
    schema_variant: str = ""  # schema mode's response_format form; starts as the settings say

    def __post_init__(self) -> None:
        self.schema_variant = self.schema_variant or self.settings.schema_variant

    def pinned(self) -> List[dict]:
        """The system prompt and the task: sent first in every request, never folded."""
        return [{"role": "system", "content": prompts.render_system_prompt(
                    self.registry, self.mode, self.settings.max_calls)},
                {"role": "user", "content": prompts.render_task(self.task)}]

    def messages(self) -> List[dict]:
        """The messages for the next request; with the rest of the body they fit --max-context."""
        return build_messages(self.pinned(), self.rounds, self.settings.max_context - self.body_size([]),
                              self.settings.keep_recent, self.settings.max_result_chars,
                              native_tools=self.mode == "tools")

    def body_size(self, messages: List[dict]) -> int:
        """Characters of the whole request body as it goes on the wire (the client adds the reply cap)."""
        cap = {"max_completion_tokens": self.settings.max_reply_tokens} if self.settings.max_reply_tokens else {}
        return len(json.dumps({"model": self.settings.model, "messages": messages, **cap, **self.options()}))

    def options(self) -> dict:
        """What the request carries besides the model and the messages (schemas, tools)."""
        return prompts.request_options(self.mode, self.registry, self.settings.max_calls, self.schema_variant)

    def check_fits(self) -> None:
        """ConfigError if the system prompt, task and schemas alone leave too little room for rounds."""
        bare = self.body_size(self.pinned())
        if bare > self.settings.max_context // 2:
            raise ConfigError(f"--max-context {self.settings.max_context} is too small: the system prompt,"
                              f" task and tool schemas alone take {bare} characters")
