"""The tool registry: every tool the agent can call, and the one way to call it.

A tool is one entry in REGISTRY. The system prompt, the JSON schemas sent to
the endpoint and the argument checks are all rendered from that entry, so
adding a tool is one edit here (see README, "Adding a tool").
"""
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional


@dataclass(frozen=True)
class Arg:
    """One argument of a tool: its JSON type, what it means, and an example."""

    type: str  # a JSON schema type name: "string", "number", ...; "any" for any JSON
    description: str
    example: Any


@dataclass(frozen=True)
class Tool:
    """A callable the model may ask for, described once for prompt, schema and checks."""

    name: str
    description: str
    args: Dict[str, Arg]
    function: Optional[Callable[..., Any]] = None  # None for the control actions
    side_effects: bool = False  # such tools ask before running unless --yes

    def example(self) -> dict:
        """The action the prompt shows for this tool."""
        return {"tool": self.name, "args": {n: a.example for n, a in self.args.items()}}


class ToolError(Exception):
    """A tool's way of saying the input is wrong; the message goes back to the model."""


def success(data: Any) -> dict:
    """The result shape of a call that worked."""
    return {"ok": True, "data": data}


def failure(error: str, **details: Any) -> dict:
    """The result shape of a call that did not work; details help the model fix it."""
    return {"ok": False, "error": error, **details}


# --- calculator ---------------------------------------------------------------

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_EXPRESSION = re.compile(rf"\s*({_NUMBER})\s*([-+*/])\s*({_NUMBER})\s*", re.ASCII)
_MAX_EXPRESSION_CHARS = 200
_CALCULATOR_HINT = "write exactly: number operator number, e.g. 12 + 500 (operators: + - * /)"


def _to_number(text: str):
    if re.fullmatch(r"[+-]?\d+", text, re.ASCII):
        return int(text)
    value = float(text)
    if not math.isfinite(value):
        raise ToolError(f"{text} is not a finite number")
    return value


def calculate(expression: str):
    """Compute `number operator number` (+ - * /); never evaluates code."""
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression is longer than {_MAX_EXPRESSION_CHARS} characters")
    match = _EXPRESSION.fullmatch(expression)
    if not match:
        raise ToolError(f"cannot read {expression!r}: {_CALCULATOR_HINT}")
    left, operator, right = _to_number(match[1]), match[2], _to_number(match[3])
    if operator == "/" and right == 0:
        raise ToolError("division by zero; check the divisor")
    if operator == "/" and isinstance(left, int) and isinstance(right, int) and left % right == 0:
        return left // right  # exact, even beyond float precision
    value = {"+": lambda: left + right, "-": lambda: left - right,
             "*": lambda: left * right, "/": lambda: left / right}[operator]()
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ToolError("the result is too large to represent; use smaller numbers")
        if value.is_integer() and abs(value) < 2 ** 53:  # beyond that an int would claim false precision
            return int(value)
    return value


# --- order lookup ---------------------------------------------------------------

_ORDERS = {"A1001": "已发货", "A1002": "待支付", "A1003": "已完成"}


def get_order_status(order_id: str) -> dict:
    """Look up a mock order by id (trimmed, case-insensitive)."""
    normalized = order_id.strip().upper()
    if normalized not in _ORDERS:
        raise ToolError(f"order {order_id!r} not found; known ids look like A1001")
    return {"order_id": normalized, "status": _ORDERS[normalized]}


REGISTRY: Dict[str, Tool] = {
    tool.name: tool
    for tool in [
        Tool(
            name="calculator",
            description="Compute one arithmetic step: number operator number, with + - * /.",
            args={"expression": Arg("string", "e.g. '12 + 500' or '-3 * 4'", "12 + 500")},
            function=calculate,
        ),
        Tool(
            name="get_order_status",
            description="Look up the status of an order by its id.",
            args={"order_id": Arg("string", "the order id, e.g. A1001", "A1001")},
            function=get_order_status,
        ),
    ]
}

# The two ways to end a run. The loop handles them; they are listed here so the
# prompt and the schemas describe them the same way as the tools.
FINISH = Tool("finish", "End the run with the final answer.",
              {"result": Arg("any", "the answer: text or any JSON value", "The answer is 512.")})
FAIL = Tool("fail", "Give up honestly when the task cannot be done.",
            {"reason": Arg("string", "why the task cannot be done", "Order A9999 does not exist.")})
CONTROL_ACTIONS: Dict[str, Tool] = {FINISH.name: FINISH, FAIL.name: FAIL}

_JSON_TYPES = {"string": str, "number": (int, float), "integer": int,
               "boolean": bool, "object": dict, "array": list}


def parameters_schema(tool: Tool) -> dict:
    """The JSON schema of a tool's arguments, for constrained decoding and function calling."""
    properties = {name: {"description": arg.description, **({} if arg.type == "any" else {"type": arg.type})}
                  for name, arg in tool.args.items()}
    return {"type": "object", "properties": properties, "required": list(tool.args),
            "additionalProperties": False}


def check_args(tool: Tool, args: dict) -> Optional[str]:
    """Say what is wrong with args for tool, or None when they fit its spec."""
    missing = [name for name in tool.args if name not in args]
    unexpected = [name for name in args if name not in tool.args]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if unexpected:
            parts.append("unexpected " + ", ".join(unexpected))
        return f"{'; '.join(parts)}; {tool.name} takes {sorted(tool.args)}"
    for name, spec in tool.args.items():
        expected = _JSON_TYPES.get(spec.type)
        value = args[name]
        if expected and (not isinstance(value, expected) or isinstance(value, bool) and spec.type != "boolean"):
            return f"{name} must be a {spec.type}, got {type(value).__name__}"
    return None


def call_tool(name: str, args: dict, registry: Dict[str, Tool]) -> dict:
    """Run one tool call and always return the result shape; never raises."""
    tool = registry.get(name)
    if tool is None:
        return failure(f"unknown tool {name!r}", available_tools=sorted(registry) + sorted(CONTROL_ACTIONS))
    problem = check_args(tool, args)
    if problem:
        return failure(f"bad arguments for {name}: {problem}", example=tool.example())
    try:
        data = tool.function(**args)
        json.dumps(data, allow_nan=False)  # the result goes back to the model as JSON
        return success(data)
    except ToolError as error:
        return failure(str(error))
    except Exception as error:  # a tool bug must not end the run: the model can work around it
        return failure(f"{name} failed: {type(error).__name__}: {error}")
