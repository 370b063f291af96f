"""Reading what models write when they mean JSON and write Python: single quotes, True/False/None,
trailing commas, unquoted keys. Only what is unambiguous is read: literals, objects and arrays;
a bare word as a value, a call, a set or an expression is not.

Python's own tokenizer finds where the object ends (it knows both kinds of quotes) and its parser
reads it; nothing is evaluated. It imports nothing of agent-demo's.
"""
import ast
import io
import math
import re
import tokenize
from typing import Any, Iterable, List, Optional, Tuple

BARE_CONSTANTS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
MAX_LENIENT_CHARS = 20_000  # an almost-JSON object longer than this is not read
_OPENING, _CLOSING = "{[(", "}])"


class NotLenientJson(ValueError):
    """The text at that place is not an object or array this module reads."""


class NotClosed(NotLenientJson):
    """The bracket at that place is not closed within MAX_LENIENT_CHARS: nor is any after it inside it."""


def lenient_decode(text: str, start: int) -> Tuple[Any, int, List[str]]:
    """The object or array that starts at text[start] ("{" or "["), read leniently: (value, end, what
    had to be repaired, e.g. ["single quotes"]). NotLenientJson if there is none to read."""
    end = _closing(text, start)
    source = text[start:end]
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise NotLenientJson("not a literal") from None
    repairs: List[str] = []
    value = _literal(tree, repairs)
    if re.search(r",\s*[}\]]", source):
        repairs.append("trailing commas")
    if "'" in source and any(isinstance(node, ast.Constant) and isinstance(node.value, str)
                             and _quoted_with(source, node) == "'" for node in ast.walk(tree)):
        repairs.insert(0, "single quotes")
    return value, start + len(source), list(dict.fromkeys(repairs))


def lenient_calls(text: str, known: Iterable[str]) -> Optional[List[dict]]:
    """The actions a reply written as Python calls of known tools stands for (`calculator(expression=
    "2 + 1")`, or a list of such calls, as some models write tool calls), with keyword arguments that
    are literals; None for anything else."""
    names = set(known)
    said = text.strip()
    if not names or len(said) > MAX_LENIENT_CHARS or not re.match(r"\[?\s*[A-Za-z_][\w.-]*\s*\(", said):
        return None
    try:
        tree = ast.parse(said, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    calls = tree.elts if isinstance(tree, ast.List) else [tree]
    actions = []
    for call in calls:
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.func.id not in names \
                or call.args or any(keyword.arg is None for keyword in call.keywords):
            return None
        try:
            actions.append({"tool": call.func.id, "args": {keyword.arg: _literal(keyword.value, [])
                                                           for keyword in call.keywords}})
        except NotLenientJson:
            return None
    return actions or None


def _closing(text: str, start: int) -> int:
    """Where the bracket at text[start] is closed (just after it), by Python's tokens."""
    if text[start:start + 1] not in ("{", "["):
        raise NotLenientJson("no object starts here")
    depth, previous = 0, None
    lines = io.StringIO(text[start:start + MAX_LENIENT_CHARS]).readline
    offsets = _line_offsets(text[start:start + MAX_LENIENT_CHARS])
    try:
        for token in tokenize.generate_tokens(lines):
            if token.type == tokenize.ERRORTOKEN:
                break
            if token.type == tokenize.STRING and (previous == tokenize.STRING or not token.string[0] in "'\""):
                raise NotLenientJson("texts side by side, or a prefixed one")  # "a" "b" is one text to Python
            if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
                previous = token.type
            if token.type != tokenize.OP:
                continue
            if token.string in _OPENING:
                depth += 1
            elif token.string in _CLOSING:
                depth -= 1
                if depth == 0:
                    row, column = token.end
                    return start + offsets[row - 1] + column
    except (tokenize.TokenError, SyntaxError, RecursionError):
        pass
    raise NotClosed("not closed")


def _line_offsets(text: str) -> List[int]:
    offsets, position = [], 0
    for line in text.splitlines(keepends=True):
        offsets.append(position)
        position += len(line)
    return offsets or [0]


def _quoted_with(source: str, node: ast.AST) -> str:
    """The quote character a string literal was written with."""
    lines = source.splitlines(keepends=True)
    try:
        line = lines[node.lineno - 1]
        return line.encode("utf-8")[node.col_offset:node.col_offset + 1].decode("utf-8", "replace")
    except (IndexError, AttributeError):
        return ""


def _literal(node: ast.AST, repairs: List[str]) -> Any:
    """The JSON value a parsed literal stands for; NotLenientJson for anything that is not one."""
    if isinstance(node, ast.Dict):
        result = {}
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                name = key.value
            elif isinstance(key, ast.Name) and key.id not in BARE_CONSTANTS:
                name = key.id
                repairs.append("unquoted keys")
            else:  # {**x} or a key that is not text
                raise NotLenientJson("a key that is not text")
            result[name] = _literal(value, repairs)
        return result
    if isinstance(node, ast.List):
        return [_literal(item, repairs) for item in node.elts]
    if isinstance(node, ast.Name) and node.id in BARE_CONSTANTS:  # JSON's true, false and null
        return BARE_CONSTANTS[node.id]
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, bool)):
        repairs.append("Python's True, False or None")
        return node.value
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _finite(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) \
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float)) \
            and not isinstance(node.operand.value, bool):
        return _finite(-node.operand.value if isinstance(node.op, ast.USub) else node.operand.value)
    raise NotLenientJson("not a literal")


def _finite(number: Any) -> Any:
    if isinstance(number, float) and not math.isfinite(number) or isinstance(number, int) and abs(number) > 10 ** 300:
        raise NotLenientJson("a number out of range")
    return number
