"""What is re-sent each round: the pinned goal, recent rounds verbatim, older rounds as a digest.

The conversation is rebuilt for every request from the round records (the same
records the trace file holds), so a resumed run with the same settings sends what
the original would have.
"""
import json
import re
from typing import Any, List

import prompts

_THINK_TAG = re.compile(r"<(/?)think(?:ing)?>", re.I)


def strip_think(text: str) -> str:
    """Drop reasoning blocks, an unclosed one, and all before a lone closing tag (linear time)."""
    kept, position, inside = [], 0, False
    for tag in _THINK_TAG.finditer(text):
        closing = tag.group(1) == "/"
        if closing and not inside:  # the server ate the opening tag: all so far was reasoning
            kept, position = [], tag.end()
        elif closing:
            inside, position = False, tag.end()
        elif not inside:
            kept.append(text[position:tag.start()])
            inside = True
    if not inside:  # a block never closed was cut off mid-thought: drop it
        kept.append(text[position:])
    return "".join(kept)


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


def assistant_message(record: dict, native_tools: bool = False) -> dict:
    """The model's turn as it is re-sent: without think blocks, never empty."""
    text = strip_think(record.get("model_output") or "").strip()
    if native_tools and record.get("tool_calls"):
        return {"role": "assistant", "content": text, "tool_calls": record["tool_calls"]}
    if not text and record.get("calls"):
        actions = [{"tool": call["tool"], "args": call["args"]} for call in record["calls"]]
        text = prompts.to_json(actions[0] if len(actions) == 1 else actions)
    return {"role": "assistant", "content": text or "(empty reply)"}


def round_messages(record: dict, native_tools: bool = False) -> List[dict]:
    """The messages one completed round adds to the conversation."""
    feedback = record["feedback"]
    if not native_tools and any(message["role"] == "tool" for message in feedback):
        # A tools-mode round re-sent without function calling (after a fallback or a resume).
        feedback = [{"role": "user", "content": prompts.render_results([m["content"] for m in feedback])}]
    return [assistant_message(record, native_tools), *feedback]


def digest_line(record: dict, result_chars: int) -> str:
    """One folded round: each call and its result, without the model's prose; bounded in length."""
    calls = record.get("calls") or []
    if not calls:
        return f"round {record['round']}: no valid action ({_cut(str(record['result'].get('error')), result_chars)})"
    return f"round {record['round']}: " + "; ".join(_call_summary(call, result_chars) for call in calls)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else prompts.to_json(value)


def _call_summary(call: dict, result_chars: int) -> str:
    args = call["args"]
    shown_args = _as_text(next(iter(args.values()))) if isinstance(args, dict) and len(args) == 1 else _as_text(args)
    result = call["result"]
    shown = _as_text(result.get("data")) if result.get("ok") else "error: " + _as_text(result.get("error"))
    return f"{_cut(call['tool'], 60)}({_cut(shown_args, 120)}) -> {_cut(shown, result_chars)}"


def build_messages(pinned: List[dict], records: List[dict], max_chars: int, keep_recent: int = 4,
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
