import json
import math
from typing import Literal, Union

import pytest
from hypothesis import given, strategies as st

from agent_demo_kit.tools import (CONTROL_ACTIONS, REGISTRY, ToolDefinitionError, call_tool, calculator, check_args, describe,
                   material_reader,
                   registry_of, tool)


@pytest.mark.parametrize("expression, expected", [
    ("12 + 500", 512),
    ("12+500", 512),
    ("-3 * 4", -12),
    ("1.5e3 / 2", 750),
    ("7 / 2", 3.5),
    ("10 - -2", 12),
    ("  2*  3 ", 6),
    ("0.1 + 0.2", 0.1 + 0.2),
    ("12345678901234567890 * 10", 123456789012345678900),
    ("12345678901234567890 / 10", 1234567890123456789),
    ("1e20 / 4", 2.5e19),
])
def test_calculator_computes_three_tokens(expression, expected):
    result = call_tool("calculator", {"expression": expression}, REGISTRY)
    assert result == {"ok": True, "data": expected}
    assert type(result["data"]) is type(expected)


@pytest.mark.parametrize("expression, hint", [
    ("1 / 0", "division by zero"),
    ("1 / 0.0", "division by zero"),
    ("1e999 + 1", "not a finite number"),
    ("1e308 * 10", "too large"),
    ("nan + 1", "number operator number"),
    ("inf - 1", "number operator number"),
    ("2 ** 3", "number operator number"),
    ("1 + 2 + 3", "number operator number"),
    ("__import__('os').system('id')", "number operator number"),
    ("", "number operator number"),
    ("(12 + 500)", "number operator number"),
    ("1" * 300 + " + 1", "longer than"),
    ("١٢ + ٥", "number operator number"),
    ("１２+５００", "number operator number"),
])
def test_calculator_rejects_anything_else_with_a_hint(expression, hint):
    result = call_tool("calculator", {"expression": expression}, REGISTRY)
    assert result["ok"] is False
    assert hint in result["error"]


@given(st.integers(-10**6, 10**6), st.sampled_from("+-*"), st.integers(-10**6, 10**6))
def test_calculator_matches_integer_arithmetic(left, operator, right):
    expected = {"+": left + right, "-": left - right, "*": left * right}[operator]
    assert calculator(f"{left} {operator} {right}") == expected


@given(st.text(max_size=40))
def test_calculator_never_raises_into_the_loop(text):
    result = call_tool("calculator", {"expression": text}, REGISTRY)
    if result["ok"] is True:
        assert math.isfinite(result["data"]) and set(result) == {"ok", "data"}
    else:
        assert result["ok"] is False and isinstance(result["error"], str) and result["error"]


@pytest.mark.parametrize("order_id, status", [
    ("A1001", "已发货"), ("A1002", "待支付"), ("A1003", "已完成"), ("  a1002 ", "待支付"),
])
def test_order_status_is_found_trimmed_and_case_insensitive(order_id, status):
    result = call_tool("get_order_status", {"order_id": order_id}, REGISTRY)
    assert result == {"ok": True, "data": {"order_id": order_id.strip().upper(), "status": status}}


def test_unknown_order_is_not_found():
    result = call_tool("get_order_status", {"order_id": "A9999"}, REGISTRY)
    assert result["ok"] is False and "not found" in result["error"]


def test_unknown_tool_is_reported_with_the_tool_list():
    result = call_tool("weather", {}, REGISTRY)
    assert result["ok"] is False
    assert result["available_tools"] == [*REGISTRY, *CONTROL_ACTIONS]
    assert {"calculator", "get_order_status"} <= set(result["available_tools"])


@pytest.mark.parametrize("args, problem", [
    ({}, "missing expression"),
    ({"expression": "1+1", "x": 1}, "unexpected x"),
    ({"expression": 12}, "expression must be a string"),
    ({"expression": True}, "expression must be a string"),
])
def test_bad_arguments_are_explained_with_an_example(args, problem):
    result = call_tool("calculator", args, REGISTRY)
    assert result["ok"] is False and problem in result["error"]
    assert result["example"] == {"tool": "calculator", "args": {"expression": "12 + 500"}}


def test_an_exception_inside_a_tool_becomes_an_error_result():
    def broken(x: str):
        """Always fails."""
        raise RuntimeError("disk on fire")
    registry = registry_of(broken)
    assert call_tool("broken", {"x": "a"}, registry) == {
        "ok": False, "error": "broken failed: RuntimeError: disk on fire"}


# --- tools described from plain functions ---------------------------------------------------

def test_a_tool_is_described_from_its_signature_and_docstring():
    @tool(example={"city": "Paris", "days": 3}, constraints={"days": {"minimum": 1, "maximum": 7}})
    def get_weather(city: str, days: int, unit: Literal["C", "F"] = "C") -> dict:
        """Look up the weather in a city.

        Args:
            city: the city name,
                in English
            days: how many days ahead
        """
    described = describe(get_weather)
    assert (described.name, described.description) == ("get_weather", "Look up the weather in a city.")
    assert described.parameters == {
        "city": {"type": "string", "description": "the city name, in English"},
        "days": {"type": "integer", "description": "how many days ahead", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["C", "F"], "description": "unit"}}
    assert described.required == ["city", "days"]
    assert described.example() == {"tool": "get_weather", "args": {"city": "Paris", "days": 3}}
    assert check_args(described, {"city": "Oslo", "days": 9}) == "days must be at most 7"
    assert check_args(described, {"city": "Oslo", "days": 2, "unit": "K"}) == 'unit must be one of ["C", "F"]'
    assert check_args(described, {"city": "Oslo", "days": 2}) is None


def test_without_an_example_one_is_made_from_the_types_and_defaults():
    def search(query: str, limit: int = 5, exact: bool = False) -> list:
        """Search."""
    assert describe(search).example() == {"tool": "search", "args": {"query": "...", "limit": 5, "exact": False}}


def _no_doc(x: str):
    pass


def _no_hint(x):
    """Has no hint."""


def _star(*values: str):
    """Takes any number."""


def _odd_type(x: complex):
    """A type JSON does not have."""


def _unknown_hint(x: "NoSuchType"):  # noqa: F821
    """A hint naming nothing."""


@pytest.mark.parametrize("function, problem", [
    (_no_doc, "has no docstring"),
    (_no_hint, "argument x has no type hint"),
    (_star, "*values cannot be described"),
    (_odd_type, "has no JSON type"),
    (_unknown_hint, "its type hints cannot be read"),
])
def test_a_function_that_cannot_be_described_says_why(function, problem):
    with pytest.raises(ToolDefinitionError, match=problem.replace("*", r"\*")):
        describe(function)


def test_the_built_in_tools_and_finish_fail_come_from_functions():
    assert REGISTRY["calculator"].parameters["expression"]["type"] == "string"
    assert REGISTRY["calculator"].description.startswith("Compute one arithmetic step")
    assert CONTROL_ACTIONS["fail"].parameters["reason"] == {"type": "string",
                                                             "description": "why the task cannot be done"}
    assert CONTROL_ACTIONS["finish"].example() == {"tool": "finish", "args": {"result": "The answer is 512."}}


# --- schemas every grammar engine compiles ---------------------------------------------------

def _leaves(schema):
    """Every value schema inside an argument schema: anyOf branches, items, properties."""
    yield schema
    for branch in schema.get("anyOf", []):
        yield from _leaves(branch)
    for inner in schema.get("properties", {}).values():
        yield from _leaves(inner)
    if isinstance(schema.get("items"), dict):
        yield from _leaves(schema["items"])


@pytest.mark.parametrize("described", [*REGISTRY.values(), *CONTROL_ACTIONS.values()], ids=lambda t: t.name)
def test_every_argument_of_every_tool_has_a_type(described):
    for name, spec in described.parameters.items():
        for leaf in _leaves(spec):
            assert "type" in leaf or "anyOf" in leaf, f"{described.name}.{name}: {leaf}"


def test_any_becomes_a_union_of_every_json_type():
    result = CONTROL_ACTIONS["finish"].parameters["result"]
    assert [branch["type"] for branch in result["anyOf"]] == ["string", "number", "boolean", "object", "array",
                                                               "null"]
    for value in ["text", 1536, 2.5, True, {"total": 1536}, [1, 2], None]:
        assert check_args(CONTROL_ACTIONS["finish"], {"result": value}) is None


def test_a_union_argument_is_checked_against_each_branch():
    def pick(value: Literal["a", "b"], amount: Union[int, str]):
        """Pick."""
    described = describe(pick)
    assert described.parameters["amount"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert check_args(described, {"value": "a", "amount": 3}) is None
    assert check_args(described, {"value": "a", "amount": "3"}) is None
    assert check_args(described, {"value": "a", "amount": 2.5}) == "amount must be one of: integer, string"


@pytest.mark.parametrize("described", [*REGISTRY.values(), *CONTROL_ACTIONS.values()], ids=lambda t: t.name)
def test_the_example_the_prompt_shows_fits_the_schema(described):
    assert check_args(described, described.example_args) is None


@pytest.mark.parametrize("tool_name, arg", [("calculator", "expression"), ("get_order_status", "order_id")])
def test_the_built_in_tools_declare_a_pattern_grammar_engines_compile(tool_name, arg):
    pattern = REGISTRY[tool_name].parameters[arg]["pattern"]
    # llama.cpp's converter wants ^...$ and passes escapes such as \d or \. to a grammar that refuses them;
    # (?:...) groups it does not know at all.
    assert pattern.startswith("^") and pattern.endswith("$")
    assert "\\" not in pattern and "(?" not in pattern


@pytest.mark.parametrize("expression", ["(12 + 500) * 3", "12 + 500 * 3", "twelve plus 500", "512*3=1536", "1,000 + 1"])
def test_the_calculator_pattern_refuses_what_the_calculator_cannot_read(expression):
    result = call_tool("calculator", {"expression": expression}, REGISTRY)
    assert result["ok"] is False
    assert "must match the pattern" in result["error"] and "number operator number" in result["error"]


@pytest.mark.parametrize("order_id", ["order A1002", "#A1002", "A 1002", ""])
def test_an_order_id_of_the_wrong_shape_is_refused_with_the_pattern(order_id):
    result = call_tool("get_order_status", {"order_id": order_id}, REGISTRY)
    assert result["ok"] is False and "must match the pattern" in result["error"]


def test_a_result_json_cannot_hold_is_converted_and_the_conversion_noted():
    import datetime
    import decimal
    import pathlib

    def look(kind: str):
        """Return something JSON has no form for."""
        return {"when": datetime.datetime(2026, 12, 1, 9, 30), "price": decimal.Decimal("1.10"),
                "where": pathlib.Path("/tmp/x"), "tags": {"b", "a"}, "pair": (1, 2), "ratio": float("nan")}
    result = call_tool("look", {"kind": "x"}, registry_of(look))
    assert result["ok"] is True
    assert result["data"] == {"when": "2026-12-01T09:30:00", "price": "1.10", "where": "/tmp/x", "tags": ["a", "b"],
                              "pair": [1, 2], "ratio": "nan"}
    assert result["converted"] == ["Decimal to text", "PosixPath to text", "datetime to ISO 8601 text",
                                   "float to text", "set to a list", "tuple to a list"]
    assert json.loads(json.dumps(result, allow_nan=False)) == result


def test_read_material_pages_through_the_text_and_says_where_the_end_is():
    reader = material_reader("line one\nline two\n" * 50, page_chars=500)
    first = call_tool("read_material", {"offset": 0}, {"read_material": reader})["data"]
    assert first["offset"] == 0 and first["text"].endswith("\n") and first["lines"].startswith("1-")
    assert len(json.dumps(first, ensure_ascii=False)) <= 500
    last = call_tool("read_material", {"offset": 890}, {"read_material": reader})["data"]
    assert last["next_offset"] is None and last["total_chars"] == 900
    assert call_tool("read_material", {"offset": 900}, {"read_material": reader}) == {
        "ok": False, "error": "offset 900 is past the end: the material has 900 characters"}
    assert "offset must be at least 0" in call_tool("read_material", {"offset": -1}, {"read_material": reader})["error"]


def test_the_headline_task_s_expression_is_refused_with_words_not_the_regular_expression():
    result = call_tool("calculator", {"expression": "(12 + 500) * 3"}, REGISTRY)
    assert result["ok"] is False and REGISTRY["calculator"].parameters["expression"]["pattern"] not in result["error"]
    assert "number operator number, e.g. '12 + 500'" in result["error"] and '"(12 + 500) * 3"' in result["error"]
