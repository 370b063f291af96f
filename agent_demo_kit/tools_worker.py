"""--tools-file: the user's own functions as tools, run by a worker process. Each public function
of a tools file becomes a tool, described like the built-in ones and run apart, since such a
function may hang, print, fork, exit or even crash. The worker is a new interpreter (started like
multiprocessing's spawn, so it inherits no lock, thread or open trace file, but without re-running
agent-demo's own main script), in a session of its own and without any key, and it imports the
files itself: a file that exits or forks while it loads harms the worker alone. It is started once
and reused. A call that hangs past --tool-timeout or ends the worker costs one error result: the
worker's whole process group is killed, and the next call starts a new worker. Nothing it started
outlives agent-demo, even one killed with kill -9.

It imports records, endings, checks, terminal and tools.
"""
import codecs
import contextlib
import dataclasses
import importlib.util
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from agent_demo_kit.environment import child_environment
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.tools import (Converted, Tool, ToolDefinitionError, ToolError, as_json, awaited, clash_message,
                                  registry_of)

_DESCRIBED = [field.name for field in dataclasses.fields(Tool) if field.name != "function"]
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where agent_demo_kit and tools are
_BOOT = ("import sys; sys.path[0] = sys.argv[1]; from agent_demo_kit.tools_worker import serve;"
         " serve(int(sys.argv[2]))")
LOADING_SECONDS = 60.0  # starting a worker and importing a file may take longer than a call may
Answer = Tuple[str, Any]  # ("tools", descriptions), ("ok", result as JSON), ("error", why) or ("lost", why)


class ToolWorker:
    """The process that imports the tools files and runs their functions, one call at a time."""

    def __init__(self, timeout: float, secrets: List[str] = ()):
        self.timeout, self.secrets = timeout, list(secrets)  # what the worker's prints must not show
        self.paths: List[str] = []  # the files loaded, loaded again by a new worker
        self.process: Any = None
        self.connection: Any = None
        self.copier: Optional[threading.Thread] = None
        self.shown: Optional[_Shown] = None  # how far the copier has shown the worker's prints
        self.answered = 0  # answers the worker gave: each follows its prints, which are shown first

    def load(self, path: str) -> Dict[str, Tool]:
        """The tools of one more file, described by the worker (importing a file runs its code);
        ToolDefinitionError says why a file cannot give tools."""
        kind, answer = self.ask(("load", path), max(self.timeout, LOADING_SECONDS))
        if kind == "lost":
            raise ToolDefinitionError(f"importing it {answer}")
        if kind != "tools":
            raise ToolDefinitionError(answer)
        self.paths.append(path)
        return {described["name"]: Tool(**described, function=self.caller(described["name"])) for described in answer}

    def caller(self, name: str) -> Any:
        """The function that stands for a tool in agent-demo's registry: it asks the worker."""
        def call(**args: Any) -> Any:
            kind, answer = self.ask(("call", name, args), self.timeout)
            if kind == "ok":
                made = json.loads(answer)
                return Converted(made["value"], made["converted"])
            raise ToolError(f"{name} {answer}" if kind == "lost" else answer)
        return call

    def ask(self, request: tuple, timeout: float) -> Answer:
        """The worker's answer; ("lost", why) when it hung or died, and it is then ended."""
        try:
            lost = self.start() if self.process is None else None
            if lost:
                return lost
            self.connection.send(request)
            if self.connection.poll(timeout):
                answer = self.connection.recv()
                self.answered += 1
                self.shown.wait_for(self.answered)  # the call's prints come before its result on the trace
                return answer
            why = (f"did not finish within {timeout:g} s{' (--tool-timeout)' if timeout == self.timeout else ''};"
                   " it was stopped, with anything it started")
        except (EOFError, OSError) as error:
            why = self.death(error)
        except BaseException:  # Ctrl-C or SIGTERM while waiting: the run ends, and so does the call
            self.stop(at_once=True)
            raise
        self.stop(at_once=True)  # it hung or died: nothing to wait for
        return "lost", why

    def death(self, error: BaseException) -> str:
        """How the worker ended, once the connection to it broke."""
        if self.process is None:
            return f"could not run: no worker process could be started ({error})"
        with contextlib.suppress(Exception):  # TimeoutExpired: it is killed next
            self.process.wait(1)
        code = self.process.returncode
        return (f"ended the worker process (signal {signal.Signals(-code).name})" if code and code < 0
                else f"ended the worker process (exit code {code})")

    def start(self) -> Optional[Answer]:
        """A new worker, with the files loaded so far loaded again; ("lost", why) if that fails."""
        import socket  # imported only when a tools file is used
        from multiprocessing.connection import Connection
        ours, theirs = socket.socketpair()
        read_end, write_end = os.pipe()  # what it and its children print: shown by us, inert
        with theirs:
            try:
                self.process = subprocess.Popen(  # -I: no PYTHON* variable and not the current folder
                    [sys.executable, "-I", "-c", _BOOT, _ROOT, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                    start_new_session=True, stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end,
                    env=child_environment(os.environ, self.secrets))
            finally:
                os.close(write_end)
        self.shown, self.answered = _Shown(), 0
        self.copier = threading.Thread(target=_show_prints, args=(read_end, sys.stderr, self.secrets, self.shown),
                                       daemon=True)
        self.copier.start()
        self.connection = Connection(ours.detach())
        self.connection.send((sys.path, self.secrets))
        paths, self.paths = self.paths, []
        for path in paths:
            try:
                self.load(path)
            except ToolDefinitionError as error:
                self.stop()
                self.paths = paths
                return "lost", f"could not run: a new worker process could not import {path} again: {error}"
        return None

    def stop(self, at_once: bool = False) -> None:
        """End the worker and everything it started (its process group): a worker that is well is
        given half a second to exit by itself (its atexit hooks run); one that hung, at_once."""
        process, self.process = self.process, None
        if process is None:
            return
        self.connection.close()  # the worker sees the end and exits by itself...
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0 if at_once else 0.5)
        with contextlib.suppress(OSError):  # ...and whatever it started ends with its group
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if self.copier:
            self.copier.join(0.5)  # its last prints are on their way


# Written by the worker after each answer's prints, before the answer: the copier counts them.
_SHOWN_MARK = b"\x00agent-demo:shown\x00"
SHOWN_WAIT_SECONDS = 0.5  # the longest a result waits for its call's prints to be shown


class _Shown:
    """How many answers' prints the copier has shown, and a wait for one of them."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = threading.Condition()

    def one_more(self) -> None:
        with self._changed:
            self.count += 1
            self._changed.notify_all()

    def wait_for(self, count: int) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.count >= count, SHOWN_WAIT_SECONDS)


def _show_prints(read_end: int, shown_on: Any, secrets: List[str], shown: _Shown) -> None:
    """Copy what the worker, its tools and their children print to `shown_on` (stderr) as it comes,
    through the writer model text goes through: redacted and inert, whatever bytes they wrote; each
    mark the worker writes after an answer's prints is counted in `shown` once they are out."""
    from agent_demo_kit.terminal import SafeStream
    from agent_demo_kit.redaction import Redactor
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    stream = SafeStream(shown_on or open(os.devnull, "w"), Redactor(*secrets), if_broken="drop", inert=True)
    held = b""  # the end of a chunk that may be the start of a mark
    ended_line = True  # what was shown so far ends with a newline
    with open(read_end, "rb", buffering=0) as prints:
        while True:
            chunk = prints.read(1 << 16)
            *parts, rest = (held + chunk).split(_SHOWN_MARK)
            keep = next((size for size in range(min(len(rest), len(_SHOWN_MARK) - 1), 0, -1)
                         if _SHOWN_MARK.startswith(rest[-size:])), 0) if chunk else 0
            held = rest[len(rest) - keep:] if keep else b""
            for part in parts:
                text = decoder.decode(part)
                stream.write(text)
                if text:
                    ended_line = text.endswith("\n")
                if not ended_line:  # an answer's prints without a last newline: the trace goes on a line of its own
                    stream.write("\n")
                    ended_line = True
                stream.flush()
                shown.one_more()
            text = decoder.decode(rest[:len(rest) - keep], final=not chunk)
            stream.write(text)
            if text:
                ended_line = text.endswith("\n")
            stream.flush()
            if not chunk:
                break
    stream.finish()


def load_tools_files(paths: List[str], timeout: float, secrets: List[str], taken: Iterable[str],
                     opened: contextlib.ExitStack, named: str = "--tools-file") -> Dict[str, Tool]:
    """The tools of each --tools-file, run by a worker process that is ended when `opened` closes;
    ConfigError if a file gives no usable tools or a name clashes with a tool in use (`taken`)."""
    found: Dict[str, Tool] = {}
    if not paths:
        return found
    worker = ToolWorker(timeout, secrets)
    opened.callback(worker.stop)
    for path in paths:
        try:
            tools = worker.load(path)
        except ToolDefinitionError as error:
            raise ConfigError(f"{named} {path}: {error}") from None
        clash = next((name for name in tools if name in taken or name in found), None)
        if clash:
            raise ConfigError(f"{named} {path}: {clash_message(clash)}")
        found.update(tools)
    return found


# --- in the worker ------------------------------------------------------------------------------

def serve(fd: int) -> None:
    """The worker: load a file or run a call, answer, until agent-demo closes the connection."""
    from multiprocessing.connection import Connection
    connection = Connection(fd)
    sys.path[:], secrets = connection.recv()  # where agent-demo finds modules, a tools file finds them
    prints = prints_to_stderr(secrets)
    worker = os.getpid()
    threading.Thread(target=end_with_parent, args=(os.getppid(),), daemon=True).start()
    tools: Dict[str, Tool] = {}
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):  # agent-demo is done, or gone
            return
        answer = load(request[1], tools) if request[0] == "load" else run(tools, *request[1:])
        if os.getpid() != worker:  # a copy the tool forked, back here: only the worker answers
            os._exit(0)
        with contextlib.suppress(Exception):
            prints.finish()  # what was held back in case it was the start of the key
        with contextlib.suppress(OSError):  # after the call's prints: agent-demo shows them before its result
            os.write(1, _SHOWN_MARK)
        try:
            connection.send(answer)
        except OSError:
            return


def prints_to_stderr(secrets: List[str]) -> Any:
    """A tool's prints go to stderr, without the key: stdout and stderr are both the pipe agent-demo shows them from."""
    from agent_demo_kit.terminal import SafeStream  # the worker needs them only here
    from agent_demo_kit.redaction import Redactor
    stream = sys.__stderr__ or open(os.devnull, "w")  # None when stderr is closed (2>&-)
    sys.stdout = sys.stderr = SafeStream(stream, Redactor(*secrets), if_broken="drop")
    return sys.stdout


def end_with_parent(parent: int) -> None:
    """If agent-demo dies (kill -9), end the worker's process group, a call still running included."""
    while os.getppid() == parent:
        time.sleep(0.2)
    os.killpg(0, signal.SIGKILL)


def load(path: str, tools: Dict[str, Tool]) -> Answer:
    """("tools", the file's tools described as JSON) or ("error", why it gives none)."""
    try:
        found = import_tools(path)
    except ToolDefinitionError as error:
        return "error", str(error)
    tools.update(found)
    described = [{name: getattr(tool, name) for name in _DESCRIBED} for tool in found.values()]
    return "tools", json.loads(json.dumps(described, default=repr))  # a default of any type: shown, not sent


def run(tools: Dict[str, Tool], name: str, args: dict) -> Answer:
    """("ok", the result as JSON) or ("error", what went wrong): whatever the tool raises, even
    SystemExit or KeyboardInterrupt, is its own failure."""
    try:
        converted: List[str] = []
        value = as_json(awaited(tools[name].function(**args)), converted)
        return "ok", json.dumps({"value": value, "converted": converted}, allow_nan=False)
    except ToolError as error:
        return "error", str(error)
    except BaseException as error:
        return "error", f"{name} failed: {type(error).__name__}: {error}"


def import_tools(path: str) -> Dict[str, Tool]:
    """Each public function defined in a Python file, as a tool; ToolDefinitionError says why a
    file cannot give tools."""
    module_name = "agent_demo_tools_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ToolDefinitionError("it is not a Python file (.py)")
    if not os.path.isfile(path):
        raise ToolDefinitionError("no such file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and type hints in the file look themselves up here
    try:
        spec.loader.exec_module(module)
    except BaseException as error:  # a syntax error, a missing import, even sys.exit(): a usage error
        del sys.modules[module_name]
        raise ToolDefinitionError(f"it does not import: {type(error).__name__}: {error}") from None
    functions = [value for name, value in vars(module).items() if not name.startswith("_")
                 and inspect.isfunction(value) and value.__module__ == module_name and value.__name__.isidentifier()]
    if not functions:
        raise ToolDefinitionError("it defines no public function")
    return registry_of(*functions)


# --- the answer check (--check) -------------------------------------------------------------


