"""What MCP servers and their tools look like to the loop, before any server runs: the servers a
user names (--mcp, --mcp-config) and their short names, each tool's input schema made safe for
every mode (grammar engines compile it) with its arguments checked against the server's own
schema, and a tool's result read as data.

It imports limits, prompts, tools, schemas and urls.
"""
import json
import os
import re
import shlex
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple
from urllib.parse import urlsplit

from agent_demo_kit.limits import FUNCTION_NAME_CHARS, MESSAGE_CHARS
from agent_demo_kit.schemas import flatten, schema_pointer, simplify_schema
from agent_demo_kit.prompts import clip
from agent_demo_kit.urls import display_url, is_http_url, url_problem
from agent_demo_kit.tools import ToolError

INSTALL_HINT = "MCP servers need the mcp package: pip install 'agent-demo[mcp]' (Python 3.10 or later)"


class McpError(Exception):
    """A server cannot be used: a bad --mcp or --mcp-config, or a server that does not start."""


@dataclass(frozen=True)
class ServerSpec:
    """One server: a command run over stdio, or a streamable-HTTP URL."""

    name: str
    command: Tuple[str, ...] = ()
    env: Dict[str, str] = field(default_factory=dict)
    url: Optional[str] = None

    def shown(self) -> str:
        """The server as the user gave it, for messages."""
        return display_url(self.url) if self.url else shlex.join(self.command)


def parse_server_specs(mcp_args: Iterable[str], config_path: Optional[str] = None, named: str = "--mcp",
                       config_named: str = "--mcp-config") -> List[ServerSpec]:
    """The servers of each --mcp SERVER, then of a --mcp-config file, each with a name of its own;
    McpError says in one line what is wrong."""
    specs = []
    for argument in mcp_args:
        if is_http_url(argument):
            specs.append(ServerSpec(_url_name(_checked(argument, f"{named}:")), url=argument))
            continue
        try:
            command = shlex.split(argument)
        except ValueError as error:
            raise McpError(f"{named} {argument}: {error}") from None
        if not command:
            raise McpError(f"{named}: the server command is empty")
        specs.append(ServerSpec(_command_name(command), command=tuple(command)))
    named: List[ServerSpec] = []
    for spec in specs + (_read_config(config_path, config_named) if config_path else []):
        name, number = safe_name(spec.name), 1  # the name goes in front of clashing tools: one per server
        while any(earlier.name == name for earlier in named):
            number += 1
            name = f"{safe_name(spec.name)}_{number}"
        named.append(ServerSpec(name, spec.command, spec.env, spec.url))
    return named


def _checked(url: str, where: str) -> str:
    """An MCP server's URL that requests can send to the host it shows; McpError says why not (not
    showing the URL, which may hold a password)."""
    problem = url_problem(url, basic_auth=False)  # the MCP SDK's httpx sends a login as UTF-8
    if problem:
        raise McpError(f"{where} the URL {problem}")
    return url


def _read_config(path: str, named: str) -> List[ServerSpec]:
    where = f"{named} {path}"
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    except FileNotFoundError:
        raise McpError(f"{where}: no such file") from None
    except OSError as error:
        raise McpError(f"{where}: cannot read it ({error.strerror})") from None
    except ValueError as error:
        raise McpError(f"{where}: not valid JSON ({error})") from None
    servers = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(servers, dict):
        raise McpError(f'{where}: expected {{"mcpServers": {{"NAME": {{"command": ...}} or {{"url": ...}}}}}}')
    specs = []
    for name, entry in servers.items():
        entry = entry if isinstance(entry, dict) else {}
        command, args, env, url = entry.get("command"), entry.get("args", []), entry.get("env", {}), entry.get("url")
        if url is not None and not is_http_url(str(url)):
            raise McpError(f'{where}: server {name}: "url" must be an http:// or https:// URL')
        if url is not None:
            specs.append(ServerSpec(name, url=_checked(url, f"{where}: server {name}:")))
        elif not (isinstance(command, str) and command.strip()):
            raise McpError(f'{where}: server {name} has neither "command" nor "url"')
        elif not (isinstance(args, list) and all(isinstance(arg, str) for arg in args)):
            raise McpError(f'{where}: server {name}: "args" must be a list of strings')
        elif not (isinstance(env, dict) and all(isinstance(value, str) for value in env.values())):
            raise McpError(f'{where}: server {name}: "env" must map names to strings')
        else:
            specs.append(ServerSpec(name, command=(command, *args), env=dict(env)))
    return specs


_LAUNCHERS = {"python", "python3", "py", "node", "npx", "uv", "uvx", "run", "pipx", "bun", "bunx", "deno",
              "docker", "podman", "sh", "bash"}


def _command_name(command: List[str]) -> str:
    """What a command runs (its module, script or package): "time" for python -m mcp_server_time."""
    if "-m" in command[:-1]:
        runs = command[command.index("-m") + 1]
    else:
        runs = next((word for word in command if not word.startswith("-") and _stem(word) not in _LAUNCHERS),
                    command[0])
    return _without_filler(_stem(runs))


def _url_name(url: str) -> str:
    """The host: "deepwiki" for https://mcp.deepwiki.com/mcp, "local_8000" for http://127.0.0.1:8000."""
    parts = urlsplit(url)
    if re.fullmatch(r"[0-9.]+|localhost|::1", parts.hostname or ""):
        return f"local_{parts.port}" if parts.port else "local"
    return _without_filler(".".join((parts.hostname or "http").split(".")[:-1]))


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path.rstrip("/")))[0].lower()


def _without_filler(text: str) -> str:
    words = [word for word in re.split(r"[^a-zA-Z0-9]+", text) if word and word.lower() not in ("mcp", "server", "www")]
    return "_".join(words) or "mcp"


def safe_name(name: str) -> str:
    """name as endpoints take a function name: ^[a-zA-Z0-9_-]{1,64}$."""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:FUNCTION_NAME_CHARS] or "mcp"


_VALUES = ("const", "enum", "default", "examples")  # what these hold are values, not schemas: kept as they are
_NAMED = ("properties", "$defs", "definitions", "dependentSchemas")  # names, each with a schema


def without_patterns(schema: Any, root: Any = None, memo: Optional[dict] = None) -> Any:
    """A server's schema without its regular expressions (`pattern`, `patternProperties`), which are
    neither compiled nor matched here: Python's re holds the whole process on a pattern such as
    ^(a+)+$ (no time limit, no Ctrl-C, every task of a batch waiting), and compiles a long one slowly,
    so the server judges them in its own calls. What takes less without them goes too, so the
    schema only ever takes more: `not` or `if` a pattern, maxContains of `contains` one, the
    additionalProperties beside patternProperties, unevaluatedProperties and unevaluatedItems over
    one; `oneOf` such branches is `anyOf` them."""
    root, memo = schema if root is None else root, {} if memo is None else memo
    if isinstance(schema, list):
        return [without_patterns(item, root, memo) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept = {key: value if key in _VALUES else
            {name: without_patterns(item, root, memo) for name, item in value.items()}
            if key in _NAMED and isinstance(value, dict) else without_patterns(value, root, memo)
            for key, value in schema.items() if not (key == "pattern" and isinstance(value, str))
            and key != "patternProperties"}
    narrower = [*(["additionalProperties"] if "patternProperties" in schema else []),
                *(["not"] if _has_pattern(schema.get("not"), root, memo) else []),
                *(["if", "then", "else"] if _has_pattern(schema.get("if"), root, memo) else []),
                *(["maxContains"] if _has_pattern(schema.get("contains"), root, memo) else []),
                *(["unevaluatedProperties", "unevaluatedItems"] if _has_pattern(schema, root, memo) else [])]
    for key in narrower:
        kept.pop(key, None)
    if _has_pattern(schema.get("oneOf"), root, memo):  # branches that may all match now
        either = {"anyOf": kept.pop("oneOf")}
        kept.update(either if "anyOf" not in kept else {"allOf": [*(kept.get("allOf") or []), either]})
    return kept


def _has_pattern(value: Any, root: Any, memo: dict) -> bool:
    """Is there a pattern in this part of a schema, or in what its local $refs point to?"""
    if isinstance(value, list):
        return any(_has_pattern(item, root, memo) for item in value)
    if not isinstance(value, dict):
        return False
    if isinstance(value.get("pattern"), str) or "patternProperties" in value:
        return True
    ref = value.get("$ref")
    if isinstance(ref, str) and ref not in memo:
        memo[ref] = False  # met again on the way there: the first meeting answers
        memo[ref] = _has_pattern(schema_pointer(root, ref), root, memo)
    return bool(isinstance(ref, str) and memo[ref]) or any(_has_pattern(item, root, memo)
                                                           for key, item in value.items() if key not in _VALUES)


def parameters_of(schema: Any) -> Tuple[Dict[str, dict], List[str]]:
    """A tool's parameters and required names from its inputSchema, each typed and described; its
    patterns are said in the description, and left to the server to check (without_patterns)."""
    patterns = {name: value["pattern"] for name, value in ((schema or {}).get("properties") or {}).items()
                if isinstance(value, dict) and isinstance(value.get("pattern"), str)} \
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict) else {}
    schema = without_patterns(schema)
    top, _ = flatten(schema, schema, frozenset())
    properties = dict(top["properties"]) if isinstance(top.get("properties"), dict) else {}
    for branch in top.get("anyOf") or top.get("oneOf") or []:  # alternative argument sets: any of their names
        branch, _ = flatten(branch, schema, frozenset())
        properties.update((name, value) for name, value in (branch.get("properties") or {}).items()
                          if name not in properties)
    required = list(dict.fromkeys(name for name in top.get("required") or [] if isinstance(name, str)))
    parameters = {}
    for name in [*properties, *(name for name in required if name not in properties)]:
        original, _ = flatten(properties.get(name), schema, frozenset())
        text = original.get("description") or original.get("title") or name.replace("_", " ")
        noted = f" (format: {original['format']})" if isinstance(original.get("format"), str) else ""
        noted += f" (pattern: {clip(patterns[name], MESSAGE_CHARS)})" if name in patterns else ""
        parameters[name] = {**simplify_schema(properties.get(name), schema),
                            "description": " ".join(str(text).split()) + noted}
    return parameters, required


CHECK_STEPS = 100_000  # keywords checked for one call at most (a second or two; an ordinary call takes hundreds)


class _TooLong(Exception):
    """The check took its CHECK_STEPS: what it says is left to the server."""


def argument_checker(schema: Any) -> Callable[[Any], Optional[str]]:
    """What the server's own schema says is wrong with a call's args (or a result's structured
    content), in a line the model can act on, or None. Its patterns are the server's to judge
    (without_patterns); its $ref is followed only inside it, never fetched (jsonschema would fetch an
    http:// one with no time limit); a schema jsonschema cannot use, or that takes more than
    CHECK_STEPS to check (one made of alternatives of alternatives: 2^40 ways to fail), is left to
    the server to judge."""
    import jsonschema
    from referencing import Registry
    schema = without_patterns(schema)
    steps = threading.local()  # what this check has left: a server's tool may be called from many threads

    def counted(keyword: Callable) -> Callable:
        def step(*args: Any) -> Any:
            steps.left -= 1
            if steps.left < 0:
                raise _TooLong()
            return keyword(*args)
        return step
    try:
        validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator_class.check_schema(schema)
        validator_class = jsonschema.validators.extend(validator_class, {
            name: counted(keyword) for name, keyword in validator_class.VALIDATORS.items()})
        validator = validator_class(schema, registry=Registry())  # nothing from elsewhere: no fetching
    except Exception:
        return lambda args: None

    def problem(args: Any) -> Optional[str]:
        steps.left = CHECK_STEPS
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(args))
        except Exception:  # a $ref it cannot follow, or out of steps
            return None
        if error is None:
            return None
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
        message = clip(error.message, MESSAGE_CHARS)
        return f"{where.lstrip('.')}: {message}" if where else message
    return problem


def result_data(result: dict) -> Any:
    """A tools/call result as a tool's data: structuredContent, else the content as text; an isError
    result raises ToolError with its message."""
    parts = [_content_text(block) for block in result.get("content") or [] if isinstance(block, dict)]
    if result.get("isError"):
        raise ToolError("\n".join(parts) or "the tool failed without saying why")
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    return "\n".join(parts) if parts else None


def _content_text(block: dict) -> str:
    """One content block as text; images, audio and binary resources as a short description."""
    kind = block.get("type")
    resource = block.get("resource") if isinstance(block.get("resource"), dict) else {}
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        return f"[{kind} {block.get('mimeType', '')}, {_decoded_size(block.get('data'))} bytes, not shown]"
    if kind == "resource_link":
        return f"[resource link: {block.get('uri')}]"
    if kind == "resource" and "text" in resource:
        return str(resource["text"])
    if kind == "resource":
        return (f"[resource {resource.get('uri')}: {resource.get('mimeType', 'binary')},"
                f" {_decoded_size(resource.get('blob'))} bytes, not shown]")
    return f"[{kind} content, not shown]"


def _decoded_size(base64_text: Any) -> int:
    return len(base64_text.rstrip("=")) * 3 // 4 if isinstance(base64_text, str) else 0
