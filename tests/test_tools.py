import math

import pytest
from hypothesis import given, strategies as st

from tools import REGISTRY, Arg, Tool, call_tool, calculate


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
    assert calculate(f"{left} {operator} {right}") == expected


@given(st.text(max_size=40))
def test_calculator_never_raises_into_the_loop(text):
    result = call_tool("calculator", {"expression": text}, REGISTRY)
    assert result["ok"] in (True, False)
    if result["ok"]:
        assert math.isfinite(result["data"])


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
    assert result["available_tools"] == sorted(REGISTRY) + ["fail", "finish"]
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
    def broken(x):
        raise RuntimeError("disk on fire")
    registry = {"broken": Tool("broken", "Always fails.", {"x": Arg("string", "anything", "a")}, broken)}
    assert call_tool("broken", {"x": "a"}, registry) == {
        "ok": False, "error": "broken failed: RuntimeError: disk on fire"}


def test_a_tool_returning_something_that_is_not_json_is_an_error_result():
    registry = {"odd": Tool("odd", "Returns a set.", {"x": Arg("string", "anything", "a")}, lambda x: {1, 2})}
    result = call_tool("odd", {"x": "a"}, registry)
    assert result["ok"] is False and "not JSON serializable" in result["error"]
