"""The tool registry: every tool the agent can call, and the one way to call it.

A tool is a plain Python function with type hints and a docstring. Its name,
description, argument schema and example are read from the function, so the
system prompt, the JSON schemas sent to the endpoint and the argument checks
cannot drift apart. `@tool(...)` adds what a signature cannot say. Adding a
tool is writing one function and listing it in REGISTRY (docs/tools.md, "Adding a tool").
"""
import datetime
import inspect
import json
import math
import re
import threading
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from agent_demo_kit.records import failure, success, to_json
from agent_demo_kit.endings import SigTerm
from agent_demo_kit.limits import EXPRESSION_CHARS, MIN_PAGE_CHARS, PAGE_STEP_CHARS, VALUE_SHOWN_CHARS
from agent_demo_kit.prompts import ENDINGS, clip


class ToolError(Exception):
    """A tool's way of saying the input is wrong; the message goes back to the model."""


class ToolDefinitionError(ValueError):
    """A function cannot be described as a tool (no docstring, an argument without a type hint, ...)."""


# --- describing a function as a tool -------------------------------------------------

@dataclass(frozen=True)
class Tool:
    """A callable the model may ask for, described once for prompt, schemas and checks."""

    name: str
    description: str
    parameters: Dict[str, dict]  # argument name -> its JSON schema (type, description, constraints)
    required: List[str]
    example_args: Dict[str, Any]
    function: Optional[Callable[..., Any]] = field(default=None, compare=False)
    side_effects: bool = False  # such tools ask before running unless --yes
    warning: Optional[str] = None  # said in the approval question (an MCP server marks the tool destructive)

    def example(self) -> dict:
        """The action the prompt shows for this tool."""
        return {"tool": self.name, "args": dict(self.example_args)}


_SCHEMA_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean",
                 dict: "object", list: "array", type(None): "null"}
# Any, as a union every grammar engine compiles (an untyped field makes llama.cpp's converter
# give up on the whole schema and fall back to plain JSON).
ANY_JSON = {"anyOf": [{"type": name} for name in ("string", "number", "boolean", "object", "array", "null")]}
_UNIONS = (typing.Union, getattr(types, "UnionType", typing.Union))  # Union[a, b] and, from 3.10, a | b
_PLACEHOLDERS = {"string": "...", "integer": 1, "number": 1.5, "boolean": True, "object": {}, "array": []}


def placeholder(schema: dict) -> Any:
    """A value an example may show for an argument of this schema."""
    if schema.get("enum"):
        return schema["enum"][0]
    if schema.get("anyOf"):
        return placeholder(schema["anyOf"][0])
    return _PLACEHOLDERS.get(schema.get("type"), "...")


def tool(function: Optional[Callable] = None, *, example: Optional[dict] = None, side_effects: bool = False,
         constraints: Optional[Dict[str, dict]] = None):
    """Mark a function as a tool and add what its signature cannot say.

    example: the arguments the prompt shows; constraints: per argument, JSON schema
    keywords such as {"pattern": ...}, {"enum": [...]}, {"minimum": 0}.
    """
    def mark(target: Callable) -> Callable:
        target.tool_options = {"example": example, "side_effects": side_effects, "constraints": constraints or {}}
        return target
    return mark(function) if function is not None else mark


def _json_type(hint: Any, where: str) -> dict:
    """The JSON schema of one type hint."""
    if hint is Any:
        return json.loads(json.dumps(ANY_JSON))  # a copy: each argument gets its own
    origin = typing.get_origin(hint)
    if origin in _UNIONS:
        return {"anyOf": [_json_type(member, where) for member in typing.get_args(hint)]}
    if origin is typing.Literal:
        values = list(typing.get_args(hint))
        return {**_json_type(type(values[0]), where), "enum": values}
    if hint in _SCHEMA_TYPES or origin in _SCHEMA_TYPES:
        return {"type": _SCHEMA_TYPES.get(hint) or _SCHEMA_TYPES[origin]}
    raise ToolDefinitionError(f"{where}: type {hint!r} has no JSON type; use str, int, float, bool, dict,"
                              " list, None, Literal[...], Union[...] or Any")


def _docstring_parts(doc: str) -> tuple:
    """The description (the text before "Args:") and each argument's line from the "Args:" section."""
    description, _, args_section = doc.partition("\nArgs:")
    described: Dict[str, str] = {}
    current = None
    for line in args_section.splitlines():
        match = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?:\s*(.*)", line)
        if match and (current is None or len(line) - len(line.lstrip()) <= 4):
            current = match[1]
            described[current] = match[2].strip()
        elif current and line.strip():
            described[current] += " " + line.strip()
    return " ".join(description.split()), described


def describe(function: Callable, name: Optional[str] = None) -> Tool:
    """A Tool read from a function's name, type hints and docstring (and its @tool options)."""
    name = name or function.__name__
    doc = inspect.getdoc(function)
    if not doc:
        raise ToolDefinitionError(f"{name} has no docstring; its first line tells the model what it does")
    description, arg_lines = _docstring_parts(doc)
    options = getattr(function, "tool_options", {})
    try:
        hints = typing.get_type_hints(function)
    except Exception as error:  # a hint naming something that does not exist
        raise ToolDefinitionError(f"{name}: its type hints cannot be read ({error})") from None
    parameters, required, example = {}, [], {}
    for arg in inspect.signature(function).parameters.values():
        if arg.kind in (arg.VAR_POSITIONAL, arg.VAR_KEYWORD):
            raise ToolDefinitionError(f"{name}: *{arg.name} cannot be described; name every argument")
        if arg.name not in hints:
            raise ToolDefinitionError(f"{name}: argument {arg.name} has no type hint")
        schema = _json_type(hints[arg.name], f"{name}({arg.name})")
        schema["description"] = arg_lines.get(arg.name) or arg.name.replace("_", " ")
        schema.update((options.get("constraints") or {}).get(arg.name, {}))
        parameters[arg.name] = schema
        if arg.default is arg.empty:
            required.append(arg.name)
            example[arg.name] = placeholder(schema)
        else:
            example[arg.name] = arg.default
    return Tool(name=name, description=description, parameters=parameters, required=required,
                example_args=options.get("example") or example, function=function,
                side_effects=bool(options.get("side_effects")))


def registry_of(*functions: Callable) -> Dict[str, Tool]:
    """Name -> Tool for each function, in order."""
    tools = [describe(function) for function in functions]
    return {described.name: described for described in tools}


# --- calculator ------------------------------------------------------------------------

# One grammar serves the schema (constrained decoding writes only what matches it), the argument
# check and the parse. It is written in the regex subset grammar engines compile: anchored, no
# escapes ([0-9], [.] and spaces rather than \d, \. and \s), plain groups rather than (?:...).
_NUMBER = r"([+-]?([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][+-]?[0-9]+)?)"  # four groups
EXPRESSION_PATTERN = rf"^ *{_NUMBER} *([-+*/]) *{_NUMBER} *$"
_EXPRESSION = re.compile(EXPRESSION_PATTERN)
ORDER_ID_PATTERN = r"^ *[A-Za-z][0-9]{1,9} *$"
_CALCULATOR_HINT = "write exactly: number operator number, e.g. 12 + 500 (operators: + - * /)"


def _to_number(text: str):
    if re.fullmatch(r"[+-]?\d+", text, re.ASCII):
        return int(text)
    value = float(text)
    if not math.isfinite(value):
        raise ToolError(f"{text} is not a finite number")
    return value


@tool(example={"expression": "12 + 500"}, constraints={"expression": {"pattern": EXPRESSION_PATTERN}})
def calculator(expression: str):
    """Compute one arithmetic step: number operator number, with + - * /.

    Args:
        expression: number operator number, e.g. '12 + 500' or '-3 * 4'
    """
    if len(expression) > EXPRESSION_CHARS:
        raise ToolError(f"expression is longer than {EXPRESSION_CHARS} characters")
    match = _EXPRESSION.fullmatch(expression)
    if not match:
        raise ToolError(f"cannot read {expression!r}: {_CALCULATOR_HINT}")
    left, operator, right = _to_number(match[1]), match[5], _to_number(match[6])
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



# --- order lookup ------------------------------------------------------------------------

_ORDERS = {"A1001": "已发货", "A1002": "待支付", "A1003": "已完成"}


@tool(example={"order_id": "A1001"}, constraints={"order_id": {"pattern": ORDER_ID_PATTERN}})
def get_order_status(order_id: str) -> dict:
    """Look up the status of an order by its id.

    Args:
        order_id: the order id, e.g. A1001
    """
    normalized = order_id.strip().upper()
    if normalized not in _ORDERS:
        raise ToolError(f"order {order_id!r} not found; known ids look like A1001")
    return {"order_id": normalized, "status": _ORDERS[normalized]}


REGISTRY: Dict[str, Tool] = registry_of(calculator, get_order_status)


# --- material piped in with the task, a page at a time -------------------------------------

def material_reader(material: str, page_chars: int) -> Tool:
    """The read_material tool over this text: a page of at most page_chars characters (as JSON) a call."""
    line_count = material.count("\n") + 1

    @tool(example={"offset": 0}, constraints={"offset": {"minimum": 0}})
    def read_material(offset: int) -> dict:
        """Read the material piped in with the task, one page at a time.

        Args:
            offset: the character to start at (0 for the beginning); each page says where the next one starts
        """
        if offset >= len(material):
            raise ToolError(f"offset {offset} is past the end: the material has {len(material):,} characters")
        page = min(page_chars, len(material) - offset)
        while True:  # escapes (a newline is \n in JSON) make a page longer than its text: shrink until it fits
            text = material[offset:offset + page]
            newline = text.rfind("\n", page // 2)
            if offset + page < len(material) and newline != -1:
                text = text[:newline + 1]  # end the page at a line's end when one is near
            end = offset + len(text)
            first = material.count("\n", 0, offset) + 1
            data = {"offset": offset, "next_offset": end if end < len(material) else None,
                    "total_chars": len(material),
                    "lines": f"{first}-{first + text.count(chr(10), 0, max(0, len(text) - 1))} of {line_count}",
                    "text": text}
            size = len(to_json(data))
            if size <= page_chars or page <= MIN_PAGE_CHARS:
                return data
            page = max(MIN_PAGE_CHARS, page * page_chars // size - PAGE_STEP_CHARS)
    return describe(read_material)


# --- the two ways to end a run ------------------------------------------------------------
# The loop handles them; they are described like the tools so the prompt and the
# schemas show them the same way.

@tool(example={"result": "The answer is 512."})
def finish(result: Any):
    """End the run with the final answer.

    Args:
        result: the answer: text or any JSON value
    """


@tool(example={"reason": "Order A9999 does not exist."})
def fail(reason: str):
    """Give up honestly when the task cannot be done.

    Args:
        reason: why the task cannot be done
    """


# Answered by the loop too, from the run's own records: nothing folded away is out of reach.
@tool(example={"first_round": 1, "last_round": 3},
      constraints={"first_round": {"minimum": 1}, "last_round": {"minimum": 0}})
def recall(first_round: int, last_round: int = 0):
    """Get back the calls and results of earlier rounds.

    Args:
        first_round: the first round
        last_round: the last round (0: first_round alone)
    """


# Answered by the loop: the note is pinned in every request (agent_demo_kit/conversation.py, Notes).
@tool(example={"text": "A1002 is unpaid; 512 * 3 still to do"})
def note(text: str):
    """Add to your notes, which every request keeps: facts you established, your plan, what you ruled out.

    Args:
        text: a line to keep
    """


CONTROL_ACTIONS: Dict[str, Tool] = registry_of(finish, fail, recall, note)
FINISH, FAIL = (CONTROL_ACTIONS[name] for name in ENDINGS)
RECALL, NOTE = CONTROL_ACTIONS["recall"], CONTROL_ACTIONS["note"]


def clash_message(name: str) -> str:
    """Why a tool cannot join the registry: its name is taken."""
    return f"the tool {name} clashes with another tool of that name"


def in_use(registry: Dict[str, Tool], answer_only: bool = False) -> Dict[str, Tool]:
    """Every tool a run offers, by name: the registry's, then finish, fail, recall and note. The one
    list the prompt, the schemas, the format errors and every name-clash check go by. answer_only
    (--tools none): without recall and note, which a question that needs no tool has no use of."""
    if answer_only:  # but what the run itself offers (read_material, for what was piped in)
        return {**registry, **{name: CONTROL_ACTIONS[name] for name in ("finish", "fail")}}
    return {**registry, **CONTROL_ACTIONS}


# --- checking and calling -----------------------------------------------------------------

@dataclass
class Converted:
    """A result made JSON elsewhere (a tools file's worker process), and what was converted on the way."""

    value: Any
    notes: List[str]


def as_json(value: Any, converted: List[str]) -> Any:
    """value as JSON can hold it: dates and times as ISO text, sets and tuples as lists, anything
    else JSON has no form for (Decimal, Path, NaN, an object) as its str(); each kind converted is
    named in `converted`."""
    if isinstance(value, Converted):
        converted.extend(value.notes)
        return value.value
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
    elif isinstance(value, dict):
        return {key if isinstance(key, str) else str(as_json(key, converted)): as_json(item, converted)
                for key, item in value.items()}
    elif isinstance(value, list):
        return [as_json(item, converted) for item in value]
    elif isinstance(value, (tuple, set, frozenset)):
        converted.append(f"{type(value).__name__} to a list")
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [as_json(item, converted) for item in items]
    elif isinstance(value, (datetime.date, datetime.time)):
        converted.append(f"{type(value).__name__} to ISO 8601 text")
        return value.isoformat()
    converted.append(f"{type(value).__name__} to text")
    return str(value)



_PYTHON_TYPES = {"string": str, "number": (int, float), "integer": int,
                 "boolean": bool, "object": dict, "array": list, "null": type(None)}


def _check_value(name: str, spec: dict, value: Any) -> Optional[str]:
    """What is wrong with one argument's value, or None."""
    if "anyOf" in spec and all(_check_value(name, branch, value) for branch in spec["anyOf"]):
        return f"{name} must be one of: {', '.join(branch.get('type', '?') for branch in spec['anyOf'])}"
    expected = spec.get("type")
    python_type = _PYTHON_TYPES.get(expected)
    if python_type and (not isinstance(value, python_type) or isinstance(value, bool) and expected != "boolean"):
        return f"{name} must be a{'n' if expected[0] in 'aeiou' else ''} {expected}, got {type(value).__name__}"
    if "enum" in spec and value not in spec["enum"]:
        return f"{name} must be one of {to_json(spec['enum'])}"
    if "pattern" in spec and isinstance(value, str) and not re.search(spec["pattern"], value):
        shown = clip(value, VALUE_SHOWN_CHARS)
        if spec.get("description"):  # words a model acts on, not a regular expression it would have to read
            return f"{name} must match the pattern its description gives: {spec['description']}; got {to_json(shown)}"
        return f"{name} must match the pattern {spec['pattern']}, got {to_json(shown)}"
    if "minimum" in spec and isinstance(value, (int, float)) and value < spec["minimum"]:
        return f"{name} must be at least {spec['minimum']}"
    if "maximum" in spec and isinstance(value, (int, float)) and value > spec["maximum"]:
        return f"{name} must be at most {spec['maximum']}"
    return None


def check_args(described: Tool, args: dict) -> Optional[str]:
    """Say what is wrong with args for the tool, or None when they fit its description."""
    missing = [name for name in described.required if name not in args]
    unexpected = [name for name in args if name not in described.parameters]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if unexpected:
            parts.append("unexpected " + ", ".join(unexpected))
        return f"{'; '.join(parts)}; {described.name} takes {sorted(described.parameters)}"
    for name, value in args.items():
        problem = _check_value(name, described.parameters[name], value)
        if problem:
            return problem
    return None


_caller = threading.local()  # in a run started by arun(): the caller's event loop, and the run's stop
AWAIT_LOOK_SECONDS = 0.1  # how often a run that waits for an async tool looks whether it was stopped


def await_on(loop: Any, stop: Any = None) -> None:
    """An async def tool called in this thread is awaited on `loop` (the event loop arun() was called on),
    and cancelled once the run's `stop` is set."""
    _caller.loop, _caller.stop = loop, stop


def awaited(value: Any) -> Any:
    """A tool's return value, awaited when the tool is async def: on the caller's event loop under
    arun() (this thread waits, the loop goes on), else on a loop of its own."""
    if not inspect.isawaitable(value):
        return value
    import asyncio  # only for an async tool: importing it costs start-up time

    async def result() -> Any:
        return await value
    loop, stop = getattr(_caller, "loop", None), getattr(_caller, "stop", None)
    if loop is not None and loop.is_running():
        from concurrent.futures import TimeoutError as NotYet
        running = asyncio.run_coroutine_threadsafe(result(), loop)
        while True:  # a look now and then: the run may be told to stop, the loop may close
            try:
                return running.result(AWAIT_LOOK_SECONDS)
            except NotYet:
                if stop is not None and stop.is_set() or loop.is_closed() or not loop.is_running():
                    running.cancel()
                    raise ToolError("the run was stopped while the tool ran") from None
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop runs in this thread: the usual case
        return asyncio.run(result())
    from concurrent.futures import ThreadPoolExecutor  # run() called on a thread that runs a loop (a notebook)
    with ThreadPoolExecutor(1) as another:
        return another.submit(asyncio.run, result()).result()


def call_tool(name: str, args: dict, registry: Dict[str, Tool]) -> dict:
    """Run one tool call and always return the result shape; never raises."""
    described = registry.get(name)
    if described is None:
        return failure(f"unknown tool {name!r}", available_tools=list(in_use(registry)))
    problem = check_args(described, args)
    if problem:
        return failure(f"bad arguments for {name}: {problem}", example=described.example())
    try:
        converted: List[str] = []
        data = as_json(awaited(described.function(**args)), converted)  # back to the model as JSON
        return {**success(data), "converted": sorted(set(converted))} if converted else success(data)
    except ToolError as error:
        return failure(str(error))
    except (KeyboardInterrupt, SigTerm):  # the user's Ctrl-C, or SIGTERM: they end the run
        raise
    except BaseException as error:  # a tool bug (even SystemExit, CancelledError) must not end the run
        return failure(f"{name} failed: {type(error).__name__}: {error}")
