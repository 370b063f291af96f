"""Typed output (`output_type=`, `--output-schema`): the JSON Schema a finish's result must fit, from
a schema, a dataclass, a TypedDict or a pydantic model; what is wrong with a result, in a line the
model can act on; and the fitting result as the caller's type.

Without pydantic, results are checked against the schema here, for the keywords structured outputs
use: type, enum, const, anyOf and oneOf, properties, required, additionalProperties, items, the
lengths and bounds, pattern and local $ref. Other keywords are not checked.

It imports endings, limits, prompts and records.
"""
import dataclasses
import json
import re
import types
import typing
from urllib.parse import unquote
from typing import Any, Callable, Dict, Optional, Tuple

from agent_demo_kit.endings import ConfigError
from agent_demo_kit.limits import MESSAGE_CHARS
from agent_demo_kit.prompts import clip
from agent_demo_kit.records import to_json

_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list,
          "null": type(None)}
_HINTS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null", dict: "object",
          list: "array"}
_UNIONS = (typing.Union, getattr(types, "UnionType", typing.Union))
DEEPEST = 32  # a result nested deeper than this is not checked further


class OutputTypeError(ConfigError):
    """output_type= is none of the four kinds, or holds a type with no JSON form."""


@dataclasses.dataclass
class OutputType:
    """What a finish's result must be: its JSON Schema, what is wrong with a value (None: it fits),
    and the fitting value as the caller's type."""

    schema: dict
    problem: Callable[[Any], Optional[str]]
    typed: Callable[[Any], Any]

    def check(self, value: Any) -> Tuple[Any, Optional[str]]:
        """(the value, or what it reads as when it is JSON text, and what is wrong with it or None)."""
        problem = self.problem(value)
        if problem and isinstance(value, str) and self.schema.get("type") != "string":
            try:  # the model wrote the object as text
                parsed = json.loads(value)
            except ValueError:
                return value, problem
            if not self.problem(parsed):
                return parsed, None
        return value, problem


def output_type_of(given: Any) -> OutputType:
    """The OutputType of a JSON Schema (a dict), a dataclass, a TypedDict or a pydantic model class."""
    if isinstance(given, dict):
        return OutputType(given, lambda value: schema_problem(given, value), lambda value: value)
    if isinstance(given, type) and hasattr(given, "model_json_schema") and hasattr(given, "model_validate"):
        return _pydantic(given)
    if isinstance(given, type) and (dataclasses.is_dataclass(given) or _is_typeddict(given)):
        schema = schema_of_hint(given)
        return OutputType(schema, lambda value: schema_problem(schema, value), lambda value: typed_as(given, value))
    raise OutputTypeError(f"output_type must be a JSON Schema (a dict), a dataclass, a TypedDict or a pydantic"
                          f" model, got {given!r}")


def _pydantic(model: Any) -> OutputType:
    def problem(value: Any) -> Optional[str]:
        try:
            model.model_validate(value)
        except Exception as error:  # pydantic's ValidationError says what and where
            return clip(" ".join(str(error).split()), MESSAGE_CHARS)
        return None
    return OutputType(model.model_json_schema(), problem, model.model_validate)


def _is_typeddict(kind: type) -> bool:
    return issubclass(kind, dict) and hasattr(kind, "__annotations__") and hasattr(kind, "__total__")


def schema_of_hint(hint: Any, where: str = "output_type") -> dict:
    """The JSON Schema of a type hint: the JSON types, Optional, Union, Literal, List[X], Dict[str, X],
    dataclasses and TypedDicts (each field required unless it has a default, or the TypedDict says so)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return {}
    if origin in _UNIONS:
        return {"anyOf": [schema_of_hint(member, where) for member in args]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset):
        return {"type": "array", **({"items": schema_of_hint(args[0], where)} if args else {})}
    if origin is dict:
        return {"type": "object", **({"additionalProperties": schema_of_hint(args[1], where)} if args else {})}
    if hint in _HINTS:
        return {"type": _HINTS[hint]}
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or _is_typeddict(hint)):
        hints = typing.get_type_hints(hint)
        if dataclasses.is_dataclass(hint):
            required = [field.name for field in dataclasses.fields(hint) if field.default is dataclasses.MISSING
                        and field.default_factory is dataclasses.MISSING]
        else:
            required = [name for name in hints if name in getattr(hint, "__required_keys__", hints)]
        return {"type": "object", "properties": {name: schema_of_hint(value, f"{where}.{name}")
                                                 for name, value in hints.items()},
                "required": required, "additionalProperties": False}
    raise OutputTypeError(f"{where}: {hint!r} has no JSON form")


def typed_as(hint: Any, value: Any) -> Any:
    """A value that fits hint's schema, as hint: dataclasses made, the rest as JSON holds it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
        hints = typing.get_type_hints(hint)
        return hint(**{name: typed_as(hints[name], item) for name, item in value.items()})
    if origin in _UNIONS:
        fitting = [member for member in args if not schema_problem(schema_of_hint(member), value)]
        return typed_as(fitting[0], value) if fitting else value
    if origin in (list, tuple, set, frozenset) and args and isinstance(value, list):
        return origin(typed_as(args[0], item) for item in value)
    if origin is dict and args and isinstance(value, dict):
        return {key: typed_as(args[1], item) for key, item in value.items()}
    if hint is float and isinstance(value, int):
        return float(value)
    return value


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
        return f"{where} must be {' or '.join(kinds)}, got {_json_kind(value)}"
    if "const" in schema and value != schema["const"]:
        return f"{where} must be {to_json(schema['const'])}"
    if isinstance(schema.get("enum"), list) and value not in schema["enum"]:
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
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            problem = schema_problem(schema["items"], item, f"{where}[{index}]", root, depth + 1)
            if problem:
                return problem
    return None


def _is(kind: str, value: Any) -> bool:
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    python = _TYPES.get(kind)
    return python is None or isinstance(value, python) and not (isinstance(value, bool) and kind != "boolean")


def _json_kind(value: Any) -> str:
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


def schema_file(text: str, named: str) -> Dict[str, Any]:
    """The JSON Schema a --output-schema file holds; ValueError says what is wrong with it."""
    try:
        schema = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{named}: not JSON ({error})") from None
    if not isinstance(schema, dict):
        raise ValueError(f"{named}: a JSON Schema is an object, got {_json_kind(schema)}")
    return schema
