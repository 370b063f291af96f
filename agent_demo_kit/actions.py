"""Finding the actions in a model's reply: JSON in its text, or its native tool calls.

Models wrap JSON in fences and <think> blocks, repeat it, and add prose around
it; `json.JSONDecoder.raw_decode` is tried from each place an object or an
array of objects may start, so none of that matters.
"""
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Tuple

from agent_demo_kit import prompts
from agent_demo_kit.records import Reply, printable, to_json
from agent_demo_kit.limits import MAX_PARSED_CHARS

_THINK_TAG = re.compile(r"<(/?)(think|thinking)>", re.I)


def think_pieces(text: str) -> List[Tuple[str, str, str]]:
    """text as (opening tag, piece, closing tag): a thought has at least one tag, plain text none.
    A thought is a reasoning block, one never closed (cut off mid-thought), or everything before
    a lone closing tag (the server ate the opening one). A tag inside a JSON string is text (an
    argument may say "<think>"). Linear time."""
    return [(opening, text[start:end], closing) for opening, start, end, closing in _pieces(text, json_spans(text))]


def strip_think(text: str) -> str:
    """text without its thoughts."""
    return "".join(piece for opening, piece, closing in think_pieces(text) if not (opening or closing))


def _pieces(text: str, spans: List[Tuple[int, int, Any]]) -> List[Tuple[str, int, int, str]]:
    """think_pieces as (opening tag, start, end, closing tag), given the JSON values in text."""
    pieces: List[Tuple[str, int, int, str]] = []
    position, opening = 0, None  # opening: the tag of the block we are inside
    for tag in _tags_outside(text, spans):
        if tag.group(1) and opening is None:
            pieces = [("", 0, tag.start(), tag.group(0))]  # all so far was reasoning
            position = tag.end()
        elif tag.group(1) and opening is not None:
            pieces.append((opening, position, tag.start(), tag.group(0)))
            opening, position = None, tag.end()
        elif not tag.group(1) and opening is None:
            pieces.append(("", position, tag.start(), ""))
            opening, position = tag.group(0), tag.end()
    pieces.append((opening or "", position, len(text), ""))
    return [piece for piece in pieces if piece[0] or piece[3] or piece[1] < piece[2]]


def _tags_outside(text: str, spans: List[Tuple[int, int, Any]]) -> Iterator["re.Match"]:
    """The think tags of text that are not inside a JSON value (so inside one of its strings:
    JSON has no "<" elsewhere)."""
    index = 0
    for tag in _THINK_TAG.finditer(text):
        while index < len(spans) and spans[index][1] <= tag.start():
            index += 1
        if index == len(spans) or tag.start() < spans[index][0]:
            yield tag


# Where an object or an array of objects may start; "{{{{" and "[[[[" in prose are not tried.
_JSON_START = re.compile(r"\{\s*[\"}]|\[\s*\{")
# Each failed decode costs up to the length of the text read (json counts the lines before the
# error), so a reply made of thousands of almost-JSON starts is given up on after this many.
MAX_FAILED_STARTS = 1_000


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range")
    return value


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


# strict=False: models (and constrained decoders) put raw newlines inside strings.
DECODER = json.JSONDecoder(strict=False, parse_float=_finite_float, parse_constant=_no_constants)


def json_spans(text: str) -> List[Tuple[int, int, Any]]:
    """Each top-level JSON object or array in text, left to right, as (start, end, value).

    A reply longer than MAX_PARSED_CHARS is read at its beginning and at its end (where an
    action after long reasoning stands), so the scan stays linear in what is read.
    """
    if len(text) <= MAX_PARSED_CHARS:
        return list(_decoded(text, 0, 0))
    spans = list(_decoded(text[:MAX_PARSED_CHARS], 0, 0))
    offset = len(text) - MAX_PARSED_CHARS
    after = spans[-1][1] if spans else 0  # a value both readings find is taken once
    return spans + list(_decoded(text[offset:], offset, max(0, after - offset)))


def _decoded(window: str, offset: int, position: int) -> Iterator[Tuple[int, int, Any]]:
    """The JSON values of window from position on, placed in the whole text by offset."""
    failed = 0
    while failed < MAX_FAILED_STARTS:
        match = _JSON_START.search(window, position)
        if not match:
            return
        try:
            value, position = DECODER.raw_decode(window, match.start())
            yield offset + match.start(), offset + position, _printable(value)
        except (ValueError, RecursionError):  # not JSON, too deep, NaN, or a 5,000-digit number
            position, failed = match.start() + 1, failed + 1


def _printable(value: Any) -> Any:
    """value with every lone surrogate (a "\\ud83d" escape) in its strings made "?": it goes to the
    trace, the terminal and the next request, which all need valid text."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable(item) for item in value]
    if isinstance(value, dict):
        return {printable(key): _printable(item) for key, item in value.items()}
    return value


def is_action(value: Any) -> bool:
    """An action is an object with a string "tool"."""
    return isinstance(value, dict) and isinstance(value.get("tool"), str)


def as_actions(value: Any, known: Iterable[str] = ()) -> Optional[Tuple[List[dict], List[str]]]:
    """The actions a JSON value stands for, as {"tool", "args"} objects, and how it was reshaped to
    read it (nothing when it was written so), or None. Besides actions, arrays of them and
    {"actions": [...]}: what function calling looks like when written out, {"name", "arguments"}
    (or "parameters") and {"function": {...}}, and {"<a known tool>": {args}}."""
    if isinstance(value, dict) and isinstance(value.get("actions"), list):
        value = value["actions"]  # schema mode's envelope
    if isinstance(value, list):
        read = [as_actions(item, known) for item in value if isinstance(item, dict)]
        if not value or len(read) != len(value) or any(each is None for each in read):
            return None
        return [action for actions, _ in read for action in actions], [how for _, hows in read for how in hows]
    if not isinstance(value, dict):
        return None
    if is_action(value):
        return [value], []
    called = value.get("function") if isinstance(value.get("function"), dict) else value
    arguments = next((called[key] for key in ("arguments", "parameters", "args") if key in called), None)
    if isinstance(called.get("name"), str) and "tool" not in value and arguments is not None:
        if isinstance(arguments, str):  # as the API sends them: JSON in a string
            try:
                arguments = DECODER.decode(arguments)
            except (ValueError, RecursionError):
                pass
        return [{"tool": called["name"], "args": arguments}], ['the function-call shape {"name", "arguments"}']
    if len(value) == 1:
        (name, arguments), = value.items()
        if name in known and isinstance(arguments, dict):
            return [{"tool": name, "args": arguments}], ['the shape {"<tool>": {args}}']
    return None


# What a reply that tries to be an action looks like, readable or not: an object or a fenced block
# first; a key only actions have, in an object; an object that names a known tool; a line that
# calls one, or says `tool: ...` as YAML would.
_ACTION_KEY = re.compile(r"""[{,]\s*(["']?)(?:tool|args|arguments|actions|function)\1\s*:""")
_FENCED_OBJECT = re.compile(r"```[A-Za-z0-9_-]*\s*[\[{]")
_YAML_ACTION = re.compile(r"^\s*(?:-\s*)?tool\s*:\s*\S", re.M)
MAX_LENIENT_STARTS = 20  # places an almost-JSON action is looked for, in a reply with no JSON one


def looks_like_action(text: str, known: Iterable[str] = ()) -> bool:
    """Does text (a reply without its thoughts) try to be an action, whether or not it can be read?
    Words that hold JSON, or braces, that is no action (`{}`, `{"name": "Bob"}`) are words."""
    said = text.strip()
    if said.startswith("{") or re.match(r"\[\s*\{", said) or said.startswith("```") and _FENCED_OBJECT.match(said) \
            or _YAML_ACTION.search(said):
        return True
    brace = said.find("{")
    if brace >= 0 and _ACTION_KEY.search(said, brace):
        return True
    names = "|".join(re.escape(name) for name in known)
    if not names:
        return False
    return re.search(r"""\{[^{}]{0,200}?(["']?)\b(?:%s)\b\1\s*[:,}]""" % names, said) is not None \
        or re.search(r"^\s*\[?\s*(?:%s)\s*\(" % names, said, re.M) is not None


def _lenient_actions(text: str, plain: List[Tuple[int, int]], spans: List[Tuple[int, int, Any]],
                     known: Iterable[str]) -> Tuple[List[dict], List[Tuple[int, int]], List[str]]:
    """The actions of a reply that holds no JSON one, written as Python or with unquoted keys (outside
    its thoughts and not inside JSON already read): the actions, where they stand, what was repaired."""
    from agent_demo_kit.lenient_json import NotClosed, NotLenientJson, lenient_decode  # only for such a reply
    found: List[dict] = []
    where: List[Tuple[int, int]] = []
    repairs: List[str] = []
    tries, reached = 0, 0
    names = "".join(f"|{re.escape(name)}" for name in known)
    starts = re.compile(r"""(?:\[\s*)?\{\s*(["']?)(?:tool|args|name|arguments|actions|function%s)\1\s*:""" % names)
    for begin, finish in plain:
        for match in starts.finditer(text, begin, finish):
            start = begin + match.start() - begin
            if start < reached or any(left < start < right for left, right, _ in spans):
                continue
            tries += 1
            if tries > MAX_LENIENT_STARTS:
                return found, where, repairs
            try:
                value, end, repaired = lenient_decode(text, start)
            except NotClosed:  # nor is anything that starts inside it: the rest is not tried
                return found, where, list(dict.fromkeys(repairs))
            except NotLenientJson:
                continue
            read = as_actions(value, known)
            if read is None:
                continue
            found += read[0]
            repairs += repaired + read[1]
            where.append((start, end))
            reached = end
    return found, where, list(dict.fromkeys(repairs))


@dataclass
class Action:
    """One tool call the model asked for."""

    tool: str
    args: Any  # a dict when well-formed
    id: Optional[str] = None  # a native call's tool_call id
    arguments: Any = None  # a native call's arguments as the model wrote them
    problem: Optional[str] = None  # why the arguments could not be read


@dataclass
class Parsed:
    """The actions found in a reply, or the problem to tell the model."""

    actions: List[Action]
    problem: Optional[str] = None
    native: bool = False  # the actions came from the reply's tool_calls
    cut_off: bool = False  # the reply hit the length limit (finish_reason "length")
    prose: str = ""  # what the reply said besides its actions (all of it, when it held none)
    words: str = ""  # a reply of plain words, no action and nothing like one: what it said, thoughts left out
    answered_in_words: bool = False  # the actions are the finish its words stand for
    repaired: str = ""  # how actions not written as JSON actions were read ("single quotes", ...)

    def answers_by_id(self, mode: str) -> bool:
        """In tools mode, native calls are answered one role-tool message per tool_call id."""
        return self.native and mode == "tools"


def parse_actions(text: str, known: Iterable[str] = ()) -> Parsed:
    """Find the actions in a model's text: action objects, arrays of them, or {"actions": [...]},
    outside its thoughts (known: the tools the run offers). The JSON is found first, so a think tag
    inside one of its strings is text and reaches the tool unchanged. A reply without JSON actions
    is read leniently (Python quoting, unquoted keys, trailing commas: `repaired` says what); one
    that tries to be an action and cannot be read is a problem, never words to keep."""
    whole = _whole_value(text)
    read = as_actions(whole[2], known) if whole else None
    if read and isinstance(read[0][0].get("args", {}), dict):  # most replies: one action, and nothing else
        return Parsed([Action(value["tool"], value.get("args", {})) for value in read[0]],
                      prose=text[:whole[0]] + text[whole[1]:], repaired=", ".join(dict.fromkeys(read[1])))
    spans = json_spans(text)
    plain = [(start, end) for opening, start, end, closing in _pieces(text, spans) if not (opening or closing)]
    found, saw_json, index, action_spans, reshaped = [], False, 0, [], []
    for start, end, value in spans:
        while index < len(plain) and plain[index][1] <= start:
            index += 1
        if index == len(plain) or start < plain[index][0]:
            continue  # in a thought
        saw_json = True
        read = as_actions(value, known)
        if read is None:
            continue
        found += read[0]
        reshaped += read[1]
        action_spans.append((start, end))
    if not found:
        found, action_spans, reshaped = _lenient_actions(text, plain, spans, known)
    said = "".join(text[start:end] for start, end in plain).strip()
    if not found:
        unfenced = re.sub(r"^```[A-Za-z0-9_-]*\s*\n?|\n?```\s*$", "", said)  # one fenced block
        from agent_demo_kit.lenient_json import lenient_calls
        found = lenient_calls(unfenced, known) or []
        reshaped = ["a Python call"] if found else reshaped
    if not found:
        attempted = saw_json and said.startswith(("{", "[", "```")) or looks_like_action(said, known)
        problem = "found JSON, but no action object with a string \"tool\"" if saw_json else \
            "it looks like an action but is not JSON that can be read: keys and texts go in double quotes" \
            if attempted else "no JSON object found"
        if len(text) > MAX_PARSED_CHARS:
            problem += (f" (your reply is {len(text):,} characters long; only its first and last"
                        f" {MAX_PARSED_CHARS:,} were read: keep replies short)")
        return Parsed([], problem, prose=text, words="" if attempted else said)
    actions = [Action(value["tool"], value.get("args", {})) for value in found]  # copies: the loop answers once
    if not isinstance(actions[0].args, dict):
        return Parsed([], f"\"args\" of {actions[0].tool} must be a JSON object")
    return Parsed(actions, prose=_without(text, action_spans), repaired=", ".join(dict.fromkeys(reshaped)))


def _whole_value(text: str) -> Optional[Tuple[int, int, Any]]:
    """A reply that is one JSON object or array of objects and nothing but whitespace around it, with no
    think tag and no fence: (start, end, value), as json_spans finds it; else None."""
    start = len(text) - len(text.lstrip())
    if len(text) > MAX_PARSED_CHARS or "<" in text or "`" in text or not _JSON_START.match(text, start):
        return None
    try:
        value, end = DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return (start, end, _printable(value)) if end == len(text) or text[end:].isspace() else None


def said_besides_actions(text: str) -> str:
    """What a reply said besides its thoughts and its actions (the model's last words, when a run
    ends without an answer)."""
    return strip_think(parse_actions(text).prose).strip()


def _without(text: str, spans: List[Tuple[int, int]]) -> str:
    """text without these spans (the actions, in order) and without code fences: what else the model said."""
    kept, position = [], 0
    for start, end in spans:
        kept.append(text[position:start])
        position = end
    kept.append(text[position:])
    return re.sub(r"```[a-z]*", "", "".join(kept))


def parse_tool_calls(tool_calls: List[dict]) -> Parsed:
    """Read native tool_calls as actions; arguments arrive as a JSON string, ids are kept."""
    actions, repairs = [], []
    for number, call in enumerate(tool_calls, 1):
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments") or "{}"
        action = Action(str(function.get("name") or ""), {}, str(call.get("id") or f"call_{number}"), arguments)
        try:
            action.args = _printable(DECODER.decode(arguments) if isinstance(arguments, str) else arguments)
        except (ValueError, RecursionError):
            action.args, how = _lenient_arguments(arguments)
            if how is None:
                action.problem = f"the arguments of {action.tool} are not valid JSON"
            repairs += how or []
        actions.append(action)
    return Parsed(actions, native=True, repaired=", ".join(dict.fromkeys(repairs)))


def _lenient_arguments(arguments: str) -> Tuple[Any, Optional[List[str]]]:
    """A native call's arguments written as a Python dict: the object and what was repaired, or
    ({}, None) when they cannot be read so either."""
    from agent_demo_kit.lenient_json import NotLenientJson, lenient_decode
    text = arguments.strip()
    try:
        value, end, repairs = lenient_decode(text, 0)
    except NotLenientJson:
        return {}, None
    return (_printable(value), repairs) if end == len(text) and isinstance(value, dict) else ({}, None)


def parse_reply(reply: Reply, mode: str, known: Iterable[str] = ()) -> Parsed:
    """The actions of a reply (its .content and .tool_calls): native tool calls first in tools mode,
    else the text, else its tool calls (known: the names of the tools the run offers). A reply cut
    off at the length limit says so."""
    if reply.tool_calls and mode == "tools":
        parsed = parse_tool_calls(reply.tool_calls)
        parsed.prose = reply.content
    elif not reply.content.strip() and not reply.tool_calls:
        parsed = Parsed([], prompts.render_empty_reply(reply.finish_reason, bool(reply.reasoning.strip())))
    else:
        parsed = parse_actions(reply.content, known)
        if not parsed.actions and reply.tool_calls:
            parsed = parse_tool_calls(reply.tool_calls)
            parsed.prose = reply.content
    if reply.finish_reason == "length":
        parsed.cut_off, parsed.words = True, ""  # words cut off are no answer
        if parsed.problem and reply.content.strip():  # an empty reply's problem says so already
            parsed.problem = prompts.CUT_OFF.format(problem=parsed.problem)
    return parsed


def native_calls(parsed: Parsed, mode: str) -> Optional[List[dict]]:
    """A tools-mode reply's calls, to re-send as the model wrote them (broken arguments too)."""
    if not parsed.answers_by_id(mode):
        return None
    return [{"id": action.id, "type": "function", "function": {
        "name": action.tool, "arguments": action.arguments if isinstance(action.arguments, str)
        else to_json(action.arguments)}} for action in parsed.actions]


def refusal_of(tool: str, position: int, count: int, before: List[Any], max_calls: int) -> Optional[str]:
    """Why the action at this position among a reply's distinct actions is not run (past --max-calls;
    finish or fail before other actions, or after a call that failed), or None."""
    if position >= max_calls:
        return prompts.OVER_CAP.format(cap=max_calls)
    failed = [(n, done.tool) for n, done in enumerate(before, 1) if not done.result.get("ok")]
    if tool in prompts.ENDINGS and position < count - 1:
        return prompts.NOT_LAST.format(tool=tool)
    if tool in prompts.ENDINGS and failed:
        return prompts.render_after_failure(failed)
    return None
