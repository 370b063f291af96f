"""--scorer FILE:FUNCTION: a Python function of the user's that scores each answer of a batch, after
its run, never seen by the model. The file is one the user named on the command line, so it is
imported and called in this process (as a --tools-file's functions are the user's). It is called
with task=, answer= and expected= (keywords), one task at a time, for each task that finished, and
gives True or False, a number from 0 to 1 (a partial score), or None (not scored); several --scorer
give several scores. A task that did not finish scores 0.

It imports endings.
"""
import importlib.util
import math
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from agent_demo_kit.endings import ConfigError

MESSAGE_CHARS = 200  # of a scorer's error, kept in the results line


class Scorers:
    """The user's scoring functions, by name, called one task at a time."""

    def __init__(self, functions: List[Tuple[str, Callable[..., Any]]]):
        self.functions = functions
        self.lock = threading.Lock()  # a user's function need not be safe across threads

    def names(self) -> List[str]:
        return [name for name, _ in self.functions]

    def graded(self, line: dict) -> bool:
        """Does the line hold each function's score already (a scorer grades a task once)?"""
        return all(name in (line.get("scores") or {}) for name in self.names())

    error_key = "scorer_error"  # what the results line calls what went wrong
    kept_keys = ()  # what else it puts in the line

    def score(self, task: str, answer: Any, expected: Any, finished: bool,
              asserts: Optional[tuple] = None) -> Tuple[Dict[str, float], Optional[str], dict]:
        """Each function's score of one answer (0 each when the task did not finish), what went wrong
        with one (None: nothing), and nothing else for the line; a function that raised or gave
        something else scores nothing."""
        scores: Dict[str, float] = {}
        for name, function in self.functions:
            if not finished:
                scores[name] = 0.0
                continue
            try:
                with self.lock:
                    given = score_of(function(task=task, answer=answer, expected=expected))
            except BaseException as error:  # the user's function: whatever it raises is the task's, the batch goes on
                if isinstance(error, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
                    raise  # Ctrl-C while it ran (a signal comes to the main thread only): the batch stops
                return scores, f"{name}: {type(error).__name__}{f': {error}' if str(error) else ''}"[:MESSAGE_CHARS], {}
            if given is not None:
                scores[name] = given
        return scores, None, {}


def score_of(given: Any) -> Optional[float]:
    """What a scorer gave, as a score from 0 to 1 (None: not scored); ValueError for anything else."""
    if given is None:
        return None
    value = float(given) if isinstance(given, bool) else given
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1:
        raise ValueError(f"gave {given!r}: a score is True, False, a number from 0 to 1, or None")
    return round(float(value), 6)


def load_scorers(specs: List[str]) -> Scorers:
    """The functions FILE:FUNCTION names, imported from their files; ConfigError naming what is wrong."""
    functions = []
    for spec in specs:
        path, _, name = spec.rpartition(":")
        if not path or not name.isidentifier():
            raise ConfigError(f"--scorer {spec}: give FILE:FUNCTION, such as --scorer score.py:exact")
        if not os.path.isfile(path):
            raise ConfigError(f"--scorer {spec}: no such file {path}")
        module_spec = importlib.util.spec_from_file_location(f"agent_demo_scorer_{len(functions)}", path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except (Exception, SystemExit) as error:
            raise ConfigError(f"--scorer {spec}: importing {path} failed: {type(error).__name__}: {error}") from None
        function = getattr(module, name, None)
        if not callable(function):
            raise ConfigError(f"--scorer {spec}: {path} has no function {name}")
        functions.append((name, function))
    return Scorers(functions)
