"""Typed output (`output_type=`, `--output-schema`): the JSON Schema a finish's result must fit, from
a schema, a dataclass, a TypedDict or a pydantic model; what is wrong with a result, in a line the
model can act on; and the fitting result as the caller's type.

A pydantic model is checked by pydantic; the rest against their schema (schemas.py).

It imports endings, limits, prompts, tools and schemas.
"""
import dataclasses
import json
import types
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple

from agent_demo_kit.endings import ConfigError
from agent_demo_kit.limits import MESSAGE_CHARS
from agent_demo_kit.prompts import OUTPUT_TYPE_CHECK, clip
from agent_demo_kit.schemas import json_kind, schema_problem, simplify_schema
from agent_demo_kit.tools import FINISH, Tool, placeholder

_HINTS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null", dict: "object",
          list: "array"}
_UNIONS = (typing.Union, getattr(types, "UnionType", typing.Union))


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

    def checked(self, value: Any) -> Tuple[Any, List[dict]]:
        """(the value as read, [] when it fits, else the check that rejected it, as --check's are recorded)."""
        value, problem = self.check(value)
        if not problem:
            try:  # what the schema cannot say: a dataclass's own __post_init__, a pydantic validator
                self.typed(value)
            except Exception as error:
                problem = clip(f"result does not make the type: {type(error).__name__}: {error}", MESSAGE_CHARS)
        return value, [{"command": OUTPUT_TYPE_CHECK, "exit_code": 1, "output": problem, "ms": 0}] if problem else []

    def value_of(self, result: Any) -> Any:
        """The finished run's result (redacted, so it may no longer fit) as the caller's type, or None."""
        try:
            return self.typed(result)
        except Exception:
            return None

    def finish(self) -> Tool:
        """finish with its result held to the schema: the prompt shows it, schema mode's response_format
        and tools mode's function carry it (in the form grammar engines compile)."""
        result = {**simplify_schema(self.schema), "description": FINISH.parameters["result"]["description"]}
        return dataclasses.replace(FINISH, parameters={"result": result},
                                   example_args={"result": placeholder(result)})


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


def schema_of_hint(hint: Any, where: str = "output_type", within: Tuple[type, ...] = ()) -> dict:
    """The JSON Schema of a type hint: the JSON types, Optional, Union, Literal, List[X], Tuple[X, Y],
    Dict[str, X], dataclasses and TypedDicts (each field required unless it has a default, or the
    TypedDict says so; a dataclass within itself is any object)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return {}
    if origin in _UNIONS:
        return {"anyOf": [schema_of_hint(member, where, within) for member in args]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is tuple and args and args[-1] is not Ellipsis:
        return {"type": "array", "prefixItems": [schema_of_hint(member, where, within) for member in args],
                "minItems": len(args), "maxItems": len(args)}
    if origin in (list, tuple, set, frozenset):
        return {"type": "array", **({"items": schema_of_hint(args[0], where, within)} if args else {})}
    if origin is dict:
        return {"type": "object", **({"additionalProperties": schema_of_hint(args[1], where, within)} if args else {})}
    if hint in _HINTS:
        return {"type": _HINTS[hint]}
    if isinstance(hint, type) and hint in within:
        return {"type": "object"}
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or _is_typeddict(hint)):
        hints = fields_of(hint, where)
        if dataclasses.is_dataclass(hint):
            required = [field.name for field in dataclasses.fields(hint) if field.init and field.default is
                        dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
        else:
            required = [name for name in hints if name in getattr(hint, "__required_keys__", hints)]
        return {"type": "object", "properties": {name: schema_of_hint(value, f"{where}.{name}", (*within, hint))
                                                 for name, value in hints.items()},
                "required": required, "additionalProperties": False}
    raise OutputTypeError(f"{where}: {hint!r} has no JSON form")


def fields_of(kind: type, where: str = "output_type") -> Dict[str, Any]:
    """The fields a value of a dataclass (those its __init__ takes) or a TypedDict holds, with their types."""
    try:
        hints = typing.get_type_hints(kind)
    except Exception as error:  # a name in a hint that cannot be found (a local class under `from __future__ ...`)
        raise OutputTypeError(f"{where}: the type hints of {kind.__name__} cannot be read ({error})") from None
    if dataclasses.is_dataclass(kind):
        return {field.name: hints[field.name] for field in dataclasses.fields(kind) if field.init}
    return hints


def typed_as(hint: Any, value: Any) -> Any:
    """A value that fits hint's schema, as hint: dataclasses made, the rest as JSON holds it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
        hints = fields_of(hint)
        return hint(**{name: typed_as(hints[name], item) for name, item in value.items()})
    if isinstance(hint, type) and _is_typeddict(hint) and isinstance(value, dict):
        hints = fields_of(hint)
        return {name: typed_as(hints[name], item) if name in hints else item for name, item in value.items()}
    if origin is tuple and args and args[-1] is not Ellipsis and isinstance(value, list):
        return tuple(typed_as(member, item) for member, item in zip(args, value))
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


def schema_file(text: str, named: str) -> Dict[str, Any]:
    """The JSON Schema a --output-schema file holds; ValueError says what is wrong with it."""
    try:
        schema = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{named}: not JSON ({error})") from None
    if not isinstance(schema, dict):
        raise ValueError(f"{named}: a JSON Schema is an object, got {json_kind(schema)}")
    return schema
