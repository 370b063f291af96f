"""JSON Schemas, as tools and typed output use them: one made safe for grammar engines (what they
compile, taking at least what the original takes), a value checked against one, with where it
goes wrong, and a local $ref followed.

The check covers the keywords structured outputs use: type, enum, const, anyOf and oneOf,
properties, required, additionalProperties, items, prefixItems, the lengths and bounds, pattern and
local $ref.
Other keywords are not checked.

It imports limits, prompts, records and tools.
"""
import copy
import re
from typing import Any, Dict, Optional, Tuple
from urllib.parse import unquote

from agent_demo_kit.limits import MESSAGE_CHARS
from agent_demo_kit.prompts import clip
from agent_demo_kit.records import to_json
from agent_demo_kit.tools import ANY_JSON

_PYTHON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
                 "array": list, "null": type(None)}
DEEPEST = 32  # a value nested deeper than this is not checked further


# --- made safe for grammar engines -----------------------------------------------------------------

_TYPES = ("string", "integer", "number", "boolean", "object", "array", "null")


MAX_SCHEMA_DEPTH = 12  # a schema nested deeper (or recursive) takes any value below this


_KEPT = {"integer": ("minimum", "maximum"), "number": ("minimum", "maximum"),
         "string": ("minLength", "maxLength"), "array": ("minItems", "maxItems")}  # grammar engines take these


def simplify_schema(schema: Any, root: Any = None, seen: frozenset = frozenset(), depth: int = 0) -> dict:
    """A schema grammar engines compile that takes at least what `schema` takes: every value typed
    (untyped: tools.ANY_JSON), $ref and allOf resolved, oneOf as anyOf, what they reject dropped
    (not, if/then, patternProperties, format, unanchored patterns, ...)."""
    flat, seen = flatten(schema, schema if root is None else root, seen)
    root = schema if root is None else root
    simple: Dict[str, Any] = {"description": flat["description"]} if isinstance(flat.get("description"), str) else {}
    branches, kind = flat.get("anyOf") or flat.get("oneOf"), flat.get("type")
    if isinstance(branches, list) and branches and kind is None and depth < MAX_SCHEMA_DEPTH:
        return {"anyOf": [simplify_schema(branch, root, seen, depth + 1) for branch in branches], **simple}
    if isinstance(kind, list) and len([name for name in kind if name in _TYPES]) > 1 and depth < MAX_SCHEMA_DEPTH:
        flat = {key: value for key, value in flat.items() if key != "description"}
        return {"anyOf": [simplify_schema({**flat, "type": name}, root, seen, depth + 1)
                          for name in kind if name in _TYPES], **simple}
    kind = next((name for name in kind if name in _TYPES), None) if isinstance(kind, list) else kind
    values = [flat["const"]] if "const" in flat else flat.get("enum") if isinstance(flat.get("enum"), list) else None
    kind = kind if kind in _TYPES else _implied_type(flat, values)
    simple.update({"enum": values} if values else {})
    if kind is None or depth >= MAX_SCHEMA_DEPTH:  # deeper than that: any value
        return {**copy.deepcopy(ANY_JSON), **simple}
    simple["type"] = kind
    simple.update((key, flat[key]) for key in _KEPT.get(kind, ())
                  if isinstance(flat.get(key), (int, float)) and not isinstance(flat[key], bool))
    if kind == "string" and _anchored_pattern(flat.get("pattern")):
        simple["pattern"] = flat["pattern"]
    if kind == "array" and isinstance(flat.get("items"), dict):
        simple["items"] = simplify_schema(flat["items"], root, seen, depth + 1)
    properties = flat.get("properties") if kind == "object" and isinstance(flat.get("properties"), dict) else {}
    if properties:
        simple["properties"] = {name: simplify_schema(value, root, seen, depth + 1)
                                for name, value in properties.items()}
        simple["required"] = [name for name in flat.get("required") or [] if name in properties]
    extra = flat.get("additionalProperties") if kind == "object" else None
    if isinstance(extra, dict):
        simple["additionalProperties"] = simplify_schema(extra, root, seen, depth + 1)
    elif extra is False and "patternProperties" not in flat:  # with it, the dropped patterns allowed more
        simple["additionalProperties"] = False
    return simple


def flatten(schema: Any, root: Any, seen: frozenset) -> Tuple[dict, frozenset]:
    """schema with its $ref followed and its allOf merged in; a $ref met again on the way is any value."""
    if not isinstance(schema, dict):
        return {}, seen
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = schema_pointer(root, ref) if ref not in seen else None
        found, seen = flatten(target, root, seen | {ref})
        schema = {**found, **{key: value for key, value in schema.items() if key != "$ref"}}
    if isinstance(schema.get("allOf"), list):
        merged = {key: value for key, value in schema.items() if key != "allOf"}
        for part in schema["allOf"]:
            part, _ = flatten(part, root, seen)
            if isinstance(part.get("properties"), dict):
                merged["properties"] = {**part["properties"], **merged.get("properties", {})}
            if isinstance(part.get("required"), list):
                merged["required"] = [*merged.get("required", []), *part["required"]]
            for key, value in part.items():
                merged.setdefault(key, value)
        schema = merged
    return schema, seen


def _implied_type(schema: dict, values: Optional[list]) -> Optional[str]:
    """The type a schema without one implies by its values or keywords, or None."""
    if values:
        kinds = {"boolean" if isinstance(value, bool) else {int: "integer", float: "number", str: "string",
                 list: "array", dict: "object"}.get(type(value), "null") for value in values}
        kinds = {"number"} if kinds == {"integer", "number"} else kinds
        return kinds.pop() if len(kinds) == 1 else None
    if "properties" in schema or "additionalProperties" in schema:
        return "object"
    return "array" if "items" in schema else None


def _anchored_pattern(pattern: Any) -> bool:
    """Grammar engines take a pattern anchored at both ends; tools.check_args, one Python compiles."""
    try:
        return isinstance(pattern, str) and pattern[:1] == "^" and pattern[-1:] == "$" and bool(re.compile(pattern))
    except re.error:
        return False


# --- a value checked against a schema ------------------------------------------------------------------

def schema_problem(schema: Any, value: Any, where: str = "result", root: Any = None, depth: int = 0) -> Optional[str]:
    """What is wrong with value against schema, naming where (result.items[2].name), or None."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > DEEPEST:
        return None
    if isinstance(schema.get("$ref"), str):
        return schema_problem(schema_pointer(root, schema["$ref"]), value, where, root, depth + 1)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list) and branches and all(schema_problem(branch, value, where, root, depth + 1)
                                                       for branch in branches):
        return f"{where} fits none of the {len(branches)} forms it may take"
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
    if kinds and not any(_is(kind, value) for kind in kinds):
        return f"{where} must be {' or '.join(kinds)}, got {json_kind(value)}"
    if "const" in schema and not _same(value, schema["const"]):
        return f"{where} must be {to_json(schema['const'])}"
    if isinstance(schema.get("enum"), list) and not any(_same(value, each) for each in schema["enum"]):
        return f"{where} must be one of {clip(to_json(schema['enum']), MESSAGE_CHARS)}"
    return _bounds(schema, value, where) or _parts(schema, value, where, root, depth)


def _bounds(schema: dict, value: Any, where: str) -> Optional[str]:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    for key, holds, said in (("minimum", lambda limit: value >= limit, "at least"),
                             ("maximum", lambda limit: value <= limit, "at most")):
        if number and isinstance(schema.get(key), (int, float)) and not holds(schema[key]):
            return f"{where} must be {said} {schema[key]}"
    for key, kind, measure in (("minLength", str, "characters"), ("maxLength", str, "characters"),
                               ("minItems", list, "items"), ("maxItems", list, "items")):
        limit = schema.get(key)
        if isinstance(value, kind) and isinstance(limit, int) and (len(value) < limit if key.startswith("min")
                                                                   else len(value) > limit):
            return f"{where} must have {'at least' if key.startswith('min') else 'at most'} {limit} {measure}"
    if isinstance(value, str) and isinstance(schema.get("pattern"), str):
        try:
            if not re.search(schema["pattern"], value):
                return f"{where} must match the pattern {schema['pattern']}"
        except re.error:
            return None
    return None


def _parts(schema: dict, value: Any, where: str, root: Any, depth: int) -> Optional[str]:
    if isinstance(value, dict):
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        missing = [name for name in schema.get("required") or [] if name not in value]
        if missing:
            return f"{where} lacks {', '.join(map(str, missing))}"
        extra = schema.get("additionalProperties")
        for name, item in value.items():
            if name in properties:
                problem = schema_problem(properties[name], item, f"{where}.{name}", root, depth + 1)
            elif extra is False:
                problem = f"{where} has {name}, which is not one of {', '.join(properties) or 'no names'}"
            else:
                problem = schema_problem(extra, item, f"{where}.{name}", root, depth + 1)
            if problem:
                return problem
    if isinstance(value, list) and isinstance(schema.get("prefixItems"), list):
        for index, (each, item) in enumerate(zip(schema["prefixItems"], value)):
            problem = schema_problem(each, item, f"{where}[{index}]", root, depth + 1)
            if problem:
                return problem
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            problem = schema_problem(schema["items"], item, f"{where}[{index}]", root, depth + 1)
            if problem:
                return problem
    return None


def _same(value: Any, other: Any) -> bool:
    """Equal as JSON values: true is not 1, nor false 0 (as Python has them)."""
    return value == other and isinstance(value, bool) == isinstance(other, bool)


def _is(kind: str, value: Any) -> bool:
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    python = _PYTHON_TYPES.get(kind)
    return python is None or isinstance(value, python) and not (isinstance(value, bool) and kind != "boolean")


def json_kind(value: Any) -> str:
    return next((kind for kind in ("boolean", "integer", "number", "string", "object", "array", "null")
                 if _is(kind, value)), type(value).__name__)


def schema_pointer(root: Any, ref: str) -> Any:
    """What a local reference ("#/$defs/Point") points to in the schema, or None."""
    node = root if ref.startswith("#") else None
    for part in ref[1:].split("/")[1:]:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(part)] if part.isdigit() and int(part) < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
    return node
