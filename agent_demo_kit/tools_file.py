"""Your own tools: each public function of a --tools-file, described like the built-in ones and
run with a time limit, since such a function may hang, print, or even exit."""
import contextlib
import dataclasses
import importlib.util
import inspect
import os
import queue
import re
import sys
import threading
from typing import Any, Callable, Dict, Optional

from agent_demo_kit.endings import SigTerm
from tools import Tool, ToolDefinitionError, ToolError, registry_of


def load_tools_file(path: str, timeout: float) -> Dict[str, Tool]:
    """Each public function defined in a Python file, as a tool whose calls end after `timeout`
    seconds; ToolDefinitionError says why a file cannot give tools."""
    module_name = "agent_demo_tools_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ToolDefinitionError("it is not a Python file (.py)")
    if not os.path.isfile(path):
        raise ToolDefinitionError("no such file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and type hints in the file look themselves up here
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what it prints while loading is not the answer
            spec.loader.exec_module(module)
    except (KeyboardInterrupt, SigTerm):
        raise
    except BaseException as error:  # a syntax error, a missing import, even sys.exit(): a usage error
        del sys.modules[module_name]
        raise ToolDefinitionError(f"it does not import: {type(error).__name__}: {error}") from None
    functions = [value for name, value in vars(module).items() if not name.startswith("_")
                 and inspect.isfunction(value) and value.__module__ == module_name and value.__name__.isidentifier()]
    if not functions:
        raise ToolDefinitionError("it defines no public function")
    return {name: dataclasses.replace(described, function=time_limited(name, described.function, timeout))
            for name, described in registry_of(*functions).items()}


def time_limited(name: str, function: Callable[..., Any], timeout: float) -> Callable[..., Any]:
    """function, run on a worker thread: a call still running after `timeout` seconds raises ToolError
    (the call is left to finish on its own), and one that exits is a ToolError too."""
    def call(**args: Any) -> Any:
        outcome = _WORKER.run(lambda: function(**args), timeout)
        if outcome is None:
            raise ToolError(f"{name} did not finish within {timeout:g} s (--tool-timeout); it may still be running")
        value, error = outcome
        if isinstance(error, (SystemExit, KeyboardInterrupt)):
            raise ToolError(f"{name} failed: it raised {type(error).__name__}")
        if error is not None:
            raise error
        return value
    return call


class _Worker:
    """One daemon thread that runs tool calls, so a call that hangs can be given up on; a new
    thread takes over from one that is stuck, and a stuck one never holds the process open."""

    def __init__(self) -> None:
        self.jobs: Optional[queue.Queue] = None

    def run(self, job: Callable[[], Any], timeout: float) -> Optional[tuple]:
        """(job's value, None) or (None, what it raised); None if it is still running after timeout seconds."""
        if self.jobs is None:
            self.jobs = queue.Queue()
            threading.Thread(target=self._serve, args=(self.jobs,), daemon=True, name="tool-call").start()
        answer: queue.Queue = queue.Queue(maxsize=1)
        self.jobs.put((job, answer))
        try:
            return answer.get(timeout=timeout)
        except queue.Empty:
            self.jobs = None  # that thread is stuck in the call: the next call gets a new one
            return None

    @staticmethod
    def _serve(jobs: queue.Queue) -> None:
        while True:
            job, answer = jobs.get()
            try:
                answer.put((job(), None))
            except BaseException as error:  # handed to the caller, whatever it is
                answer.put((None, error))


_WORKER = _Worker()
