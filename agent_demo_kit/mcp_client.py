"""Tools from MCP servers (--mcp, --mcp-config), through the official `mcp` SDK: the servers
themselves, as processes or connections, their tools in the registry, their calls, a restart, and
stopping them. What their specs, schemas and results look like is mcp_schemas.py's.

The SDK is imported only once a server is named. Its async client runs on a background
event-loop thread, so a tool's function is synchronous like every other tool's.

It imports limits, urls, terminal, prompts, tools and mcp_schemas.
"""
import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import functools
import hashlib
import json
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, TextIO

from agent_demo_kit.urls import display_url
from agent_demo_kit.terminal import inert
from agent_demo_kit.mcp_schemas import (INSTALL_HINT, McpError, ServerSpec, argument_checker, parameters_of,
                                         result_data, safe_name)
from agent_demo_kit.tools import Tool, ToolError, placeholder



# --- naming servers ---------------------------------------------------------------------------


# --- schemas every mode can use ----------------------------------------------------------------


# --- results ---------------------------------------------------------------------------------


# --- the servers' tools in the registry --------------------------------------------------------

DESTRUCTIVE = "the server marks this tool destructive: it may delete or overwrite data"


# --- the servers -------------------------------------------------------------------------------

_CONNECTION_CLOSED = -32000  # the SDK's error code for a connection that ended
_STOP_SECONDS = 8.0  # the SDK's shutdown (close stdin, SIGTERM, SIGKILL) waits at most 2 s a step


class _Server:
    """One server: what the user named, its session on the event loop, the tools it listed, its stderr."""

    def __init__(self, spec: ServerSpec, sink: TextIO) -> None:
        self.spec, self.sink = spec, sink
        self.session: Any = None  # while connected
        self.listing: List[dict] = []  # its tools/list answer at the start, as JSON
        self.names: Dict[str, str] = {}  # registry name -> the server's name for the tool
        self.stopping = asyncio.Event()
        self.task: Optional[concurrent.futures.Future] = None
        self.stderr_tail: collections.deque = collections.deque(maxlen=3)
        self.stderr_copier: Optional[threading.Thread] = None
        self.restarted = False
        self.held: Optional[List[str]] = []  # its stderr until it has started (None from then on): said once
        self.lock = threading.Lock()

    async def serve(self, ready: concurrent.futures.Future, timeout: float) -> None:
        """Connect and list the tools within `timeout` seconds, then hold the connection until told to stop."""
        import anyio
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(_checked_session()(read, write))
                with anyio.fail_after(timeout):
                    await session.initialize()
                    listing = await _list_tools(session)
                self.session = session
                self.show_stderr()
                ready.set_result(listing)
                await self.stopping.wait()
        except BaseException as error:  # once started, a broken connection shows in the next call
            if not ready.done():
                ready.set_exception(error)
        finally:
            self.session = None

    def _transport(self) -> Any:
        if self.spec.url:
            from mcp.client.streamable_http import streamable_http_client
            return streamable_http_client(self.spec.url)
        return self._stdio()

    @contextlib.asynccontextmanager
    async def _stdio(self) -> Any:
        from mcp import StdioServerParameters, stdio_client
        parameters = StdioServerParameters(command=self.spec.command[0], args=list(self.spec.command[1:]),
                                           env={"PYTHONSAFEPATH": "1", **self.spec.env})
        read_end, write_end = os.pipe()  # the server's stderr goes to the sink, never to stdout
        self.stderr_copier = threading.Thread(target=self._copy_stderr, args=(read_end,), daemon=True)
        self.stderr_copier.start()
        with os.fdopen(write_end, "w") as errlog:
            async with stdio_client(parameters, errlog=errlog) as streams:
                errlog.close()  # the server has its own copy: the copier ends when the server does
                yield streams

    def _copy_stderr(self, read_end: int) -> None:
        """The server's stderr, a line at a time: held until it has started (a server that does not start
        has its last lines said in the error, once), then copied to the sink as it comes."""
        with open(read_end, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                shown = inert(line.rstrip("\r\n"))
                with self.lock:
                    self.stderr_tail.append(shown)
                    if self.held is not None:
                        self.held.append(shown)
                        continue
                self._say(shown)

    def show_stderr(self) -> None:
        """The server has started: what it said so far, then the rest as it comes."""
        with self.lock:
            held, self.held = self.held or [], None
        for line in held:
            self._say(line)

    def _say(self, line: str) -> None:
        with contextlib.suppress(Exception):  # keep reading: a server with a full pipe would block
            self.sink.write(f"mcp {self.spec.name}: {line}\n")
            self.sink.flush()

    def failure(self, error: BaseException, timeout: float) -> McpError:
        """Why the server did not start, in one line ending with the last lines of its stderr."""
        while getattr(error, "exceptions", None):  # an ExceptionGroup from the SDK's task groups
            error = error.exceptions[0]
        if isinstance(error, (TimeoutError, concurrent.futures.TimeoutError)):
            reason = f"no answer to the handshake within {timeout:g} s"
        elif getattr(error, "code", None) == _CONNECTION_CLOSED:
            reason = "the connection closed"
        elif isinstance(error, OSError) and error.strerror:
            reason = f"cannot run it: {error.strerror}"
        else:
            reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if self.stderr_copier:
            self.stderr_copier.join(0.5)  # the server is gone: its last lines are on their way
        said = f"; its stderr ended with: {' | '.join(self.stderr_tail)}" if self.stderr_tail else ""
        return McpError(reason + said)


@functools.lru_cache(maxsize=None)
def _checked_session() -> type:
    """The SDK's client session, with a result's structuredContent checked against its tool's
    outputSchema the way arguments are (mcp_schemas.argument_checker: no pattern of the server's
    matched, no $ref fetched). The SDK's own check matches the server's patterns on the event loop,
    where a pattern such as ^(a+)+$ holds the whole process: the call's --tool-timeout, Ctrl-C and
    every other task of a batch with it."""
    from mcp import ClientSession

    class CheckedSession(ClientSession):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.output_checks: Dict[str, Callable[[Any], Optional[str]]] = {}  # tool -> its outputSchema's check

        async def list_tools(self, *args: Any, **kwargs: Any) -> Any:
            listed = await super().list_tools(*args, **kwargs)
            for tool in listed.tools:
                if isinstance(tool.output_schema, dict):
                    self.output_checks[tool.name] = argument_checker(tool.output_schema)
            return listed

        async def validate_tool_result(self, name: str, result: Any) -> None:
            check = self.output_checks.get(name)
            if check is None:
                return
            if result.structured_content is None:
                raise RuntimeError(f"Tool {name} has an output schema but did not return structured content")
            problem = check(result.structured_content)
            if problem:
                raise RuntimeError(f"Invalid structured content returned by tool {name}: {problem}")
    return CheckedSession


async def _list_tools(session: Any) -> List[dict]:
    from mcp import types
    listing: List[dict] = []
    cursor = None
    for _ in range(100):  # a server whose pages never end cannot hang the start
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        page = page.model_dump(by_alias=True, mode="json", exclude_none=True)
        listing += [tool for tool in page.get("tools", []) if isinstance(tool.get("name"), str)]
        cursor = page.get("nextCursor")
        if not cursor:
            break
    return listing


async def _call_tool(session: Any, name: str, args: dict, timeout: float) -> dict:
    import anyio
    with anyio.fail_after(timeout):
        result = await session.call_tool(name, args)
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


class McpTools:
    """The tools of a run's MCP servers, and the servers' lifetime: start, call, describe, close."""

    def __init__(self) -> None:
        self.tools: Dict[str, Tool] = {}
        self.notes: List[str] = []  # one line per renamed tool, for the user
        self._servers: List[_Server] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="mcp")
        self._closed = False
        self._tool_timeout = self._startup_timeout = 0.0

    def __enter__(self) -> "McpTools":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def start(self, specs: List[ServerSpec], tool_timeout: float, taken_names: Iterable[str] = (),
              stderr: Optional[TextIO] = None, startup_timeout: float = 10.0) -> Dict[str, Tool]:
        """Connect to every server (their stderr goes to `stderr`) and return their tools; a name that is
        in taken_names or that two tools have gets the server's name in front. McpError names a server
        that does not start; all are closed then."""
        if not specs:
            return {}
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise McpError(INSTALL_HINT) from None
        self._tool_timeout, self._startup_timeout = tool_timeout, startup_timeout
        self._thread.start()
        atexit.register(self.close)  # for an exit that skips the caller's finally
        self._servers = [_Server(spec, stderr or sys.stderr) for spec in specs]
        try:
            connecting = [(server, self._connect(server)) for server in self._servers]  # all at once
            for server, ready in connecting:
                try:
                    server.listing = self._wait(server, ready)
                except McpError as error:
                    raise McpError(f"MCP server {server.spec.name} ({server.spec.shown()}): {error}") from None
            self.tools = self._name_tools(set(taken_names))
        except BaseException:
            self.close()
            raise
        return self.tools

    def _connect(self, server: _Server) -> concurrent.futures.Future:
        """Start connecting; the future gets the server's tool listing, or what went wrong."""
        ready: concurrent.futures.Future = concurrent.futures.Future()
        server.stopping = asyncio.Event()
        server.task = asyncio.run_coroutine_threadsafe(server.serve(ready, self._startup_timeout), self._loop)
        return ready

    def _wait(self, server: _Server, ready: concurrent.futures.Future) -> List[dict]:
        """The tools of a server that started; McpError says why it did not."""
        try:
            return ready.result(timeout=self._startup_timeout + 5)  # the handshake has its own limit
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:
            problem = error
        self._stop([server])
        raise server.failure(problem, self._startup_timeout)

    def _stop(self, servers: List[_Server]) -> None:
        """End these servers' connections and processes, and wait until they are gone (or time is up)."""
        for server in servers:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(server.stopping.set)
        for server in servers:
            with contextlib.suppress(Exception):
                server.task.result(timeout=_STOP_SECONDS)

    def close(self) -> None:
        """End every server process and the event loop; safe to call again, in a finally block, at exit."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._thread.is_alive():
            self._stop(self._servers)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(1)
        if not self._loop.is_running():
            self._loop.close()

    def _name_tools(self, taken: set) -> Dict[str, Tool]:
        """Each server's tools under names endpoints take; a name that is taken, or that two tools have,
        gets the server's name in front (said in self.notes), so no tool hides another; a tool whose
        name clashes even so is left out, and said (a server, a URL one above all, ends no run by its names)."""
        wanted = [(server, entry, safe_name(entry["name"])) for server in self._servers for entry in server.listing]
        counts = collections.Counter(name for _, _, name in wanted)
        tools: Dict[str, Tool] = {}
        for server, entry, name in wanted:
            if name in taken or counts[name] > 1:
                renamed = safe_name(f"{server.spec.name}_{name}")
                self.notes.append(f"MCP server {server.spec.name}: its tool {inert(entry['name'])} is called"
                                  f" {renamed} here, since another tool is named {name}")
                name = renamed
            if name in taken or name in tools:  # even with its server's name in front: this one is left out
                self.notes.append(f"MCP server {server.spec.name}: its tool {inert(entry['name'])} is left out,"
                                  f" since another tool is named {name} even with the server's name in front")
                continue
            tools[name] = self._tool(server, entry, name)
            server.names[name] = entry["name"]
        return tools

    def _tool(self, server: _Server, entry: dict, name: str) -> Tool:
        schema = entry.get("inputSchema") if isinstance(entry.get("inputSchema"), dict) else {"type": "object"}
        parameters, required = parameters_of(schema)
        hints = entry.get("annotations") if isinstance(entry.get("annotations"), dict) else {}
        destructive = hints.get("destructiveHint") is True
        # A hint is a server's word about itself: taken only from a command the user runs here, never
        # from a URL (someone else's server), and never when the same server also says destructive.
        read_only = hints.get("readOnlyHint") is True and not destructive and server.spec.url is None
        check = argument_checker(schema)

        def call(**args: Any) -> Any:
            problem = check(args)
            if problem:
                raise ToolError(f"bad arguments for {name}: {problem}")
            return result_data(self._call(server, entry["name"], name, args))
        text = entry.get("description") or entry.get("title") or hints.get("title") or name
        return Tool(name=name, description=" ".join(str(text).split()), parameters=parameters, required=required,
                    example_args={arg: placeholder(parameters[arg]) for arg in required}, function=call,
                    side_effects=not read_only,
                    warning=DESTRUCTIVE if destructive else None)

    def _call(self, server: _Server, remote_name: str, name: str, args: dict) -> dict:
        """The server's answer to one call; ToolError when there is none (a timeout, a server that stopped)."""
        session = server.session
        if self._closed or session is None:
            raise ToolError(f"{name} failed: MCP server {server.spec.name} is not running")
        call = _call_tool(session, remote_name, args, self._tool_timeout)
        future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            return future.result(timeout=self._tool_timeout + 5)  # the call has its own limit
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            raise ToolError(f"{name} did not finish within {self._tool_timeout:g} s (--tool-timeout);"
                            " it may still be running") from None
        except Exception as error:
            code = getattr(error, "code", None)
            if isinstance(code, int) and code != _CONNECTION_CLOSED:  # the server answered with an error
                raise ToolError(f"{name} failed: {error}") from None
            if code is None and not server.task.done():  # the connection is fine: a result the SDK refused
                raise ToolError(f"{name} failed: {type(error).__name__}: {error}") from None
            raise ToolError(f"{name} failed: {self._restart(server)}") from None

    def _restart(self, server: _Server) -> str:
        """Restart a server that stopped, once a run; say what happened, for the failed call's error."""
        self._stop([server])
        stopped = f"MCP server {server.spec.name} stopped"
        if server.restarted:
            return f"{stopped} again; its tools cannot be used for the rest of the run"
        server.restarted = True
        try:
            self._wait(server, self._connect(server))
        except McpError as error:
            return f"{stopped}, and restarting it failed: {error}"
        return f"{stopped} and was restarted; the call may not have run: try it again if needed"

    # --- records ------------------------------------------------------------------------------

    def describe(self) -> List[dict]:
        """The servers and their tools as JSON data for the trace, enough to tell at a resume what changed."""
        return [{"name": server.spec.name,
                 **({"url": display_url(server.spec.url)} if server.spec.url
                    else {"command": list(server.spec.command)}),
                 "tools": dict(server.names), "digest": _digest(server.listing)} for server in self._servers]

    def changes_since(self, recorded: Any) -> List[str]:
        """One line per difference from a recorded describe(): a server gone, new, run differently,
        or with a tool list that changed."""
        now = {entry["name"]: entry for entry in self.describe()}
        then = {entry["name"]: entry for entry in (recorded if isinstance(recorded, list) else [])
                if isinstance(entry, dict) and isinstance(entry.get("name"), str)}
        changes = []
        for name, old in then.items():
            new, shown = now.get(name), inert(name)
            if new is None:
                changes.append(f"MCP server {shown} is not connected now")
                continue
            if (old.get("url"), old.get("command")) != (new.get("url"), new.get("command")):
                changes.append(f"MCP server {shown} now runs {inert(_how(new))}, not {inert(_how(old))}")
            if old.get("digest") != new["digest"] or old.get("tools") != new["tools"]:  # or named differently
                before = set(old["tools"]) if isinstance(old.get("tools"), dict) else set()
                added, gone = sorted(set(new["tools"]) - before), sorted(before - set(new["tools"]))
                detail = "; ".join([*(["new: " + ", ".join(added)] if added else []),
                                    *(["gone: " + ", ".join(gone)] if gone else [])])
                changes.append(f"MCP server {shown}'s tool list changed" + (f" ({inert(detail)})" if detail else ""))
        return changes + [f"MCP server {name} is new" for name in now if name not in then]


def _how(described: dict) -> str:
    return str(described.get("url") or " ".join(map(str, described.get("command") or [])))


def _digest(listing: List[dict]) -> str:
    """A fingerprint of what the model is told about a server's tools."""
    essentials = sorted(json.dumps({key: tool.get(key) for key in ("name", "description", "inputSchema",
                                                                    "annotations")}, sort_keys=True)
                        for tool in listing)
    return "sha256:" + hashlib.sha256("\n".join(essentials).encode()).hexdigest()[:16]
