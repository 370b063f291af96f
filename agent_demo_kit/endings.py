"""How a run ends: one exception per reason, each carrying its status and exit code,
and the small result object the command line formats.

An ending is raised where it is detected (the endpoint client, the settings, the
loop) and caught once, in `Agent.run` (agent_demo.py).
"""
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


class RunEnded(Exception):
    """Ends the run. Subclasses name the reason; `status` goes into the trace and --json."""

    status = "error"
    exit_code = 3

    def __init__(self, message: str = "", result: Any = None):
        super().__init__(message)
        self.result = result


class Finished(RunEnded):
    """The model called finish; `result` is its answer."""

    status, exit_code = "finished", 0


class GaveUp(RunEnded):
    """The model called fail; `result` is its reason."""

    status, exit_code = "failed", 1


class CheckFailed(GaveUp):
    """--check rejected the answer --check-attempts times; `result` is its last output."""


class Stuck(RunEnded):
    """The model repeats a call, or sends no usable action, again and again."""

    status, exit_code = "stuck", 1


class BudgetSpent(RunEnded):
    """The run has used its --max-tokens."""

    status, exit_code = "budget", 1


class RoundLimit(RunEnded):
    """The run has made its --max-rounds requests."""

    status, exit_code = "max_rounds", 1


class Interrupted(RunEnded):
    """The user pressed Ctrl-C."""

    status, exit_code = "interrupted", 130


class Terminated(Interrupted):
    """The process got SIGTERM (docker stop, timeout, a CI runner)."""

    exit_code = 143


class SigTerm(BaseException):
    """Raised by the SIGTERM handler. Not an Exception, like KeyboardInterrupt, so that no
    `except Exception` on the way (a tool's, a library's) can swallow it; the loop ends the run."""


class OutputClosed(RunEnded):
    """stdout cannot be written (its reader went away, a full disk): the answer is lost, nothing else."""


class InternalError(RunEnded):
    """A bug in agent-demo itself; --debug shows its traceback."""

    exit_code = 1


class ConfigError(RunEnded):
    """The command line or the settings are wrong; nothing was sent."""

    exit_code = 2


class EndpointError(RunEnded):
    """The endpoint refused, failed or answered with something unusable (exit 3)."""

    def __init__(self, message: str, http_status: Optional[int] = None, server_said: str = ""):
        super().__init__(message)
        self.http_status, self.server_said = http_status, server_said


@dataclass
class RunResult:
    """How a run ended; the command line only formats this."""

    ending: RunEnded
    rounds: int = 0
    usage: Dict[str, Any] = field(default_factory=dict)
    calls: List[dict] = field(default_factory=list)  # every call of the run, with its round and result
    progress: List[str] = field(default_factory=list)  # --check's last output, when it ended the run
    checks: List[dict] = field(default_factory=list)  # every run of --check, with its round

    @property
    def status(self) -> str:
        return self.ending.status

    @property
    def result(self) -> Any:
        return self.ending.result

    @property
    def error(self) -> Optional[str]:
        return str(self.ending) if self.status == "error" else None

    @property
    def exit_code(self) -> int:
        return self.ending.exit_code

    @property
    def key_refused(self) -> bool:
        """Did the endpoint refuse the key (HTTP 401 or 403)?"""
        return isinstance(self.ending, EndpointError) and self.ending.http_status in (401, 403)

    def summary(self) -> str:
        """One line on how the run ended, for people."""
        tokens = f", {self.usage['total_tokens']} tokens" if "total_tokens" in self.usage else ""
        if "cached_tokens" in self.usage:
            tokens += f" ({self.usage['cached_tokens']} cached)"
        if self.usage.get("estimated"):
            tokens += " (partly estimated)"
        return {
            "finished": f"finished after {self.rounds} round(s){tokens}",
            "failed": f"not completed: {self.ending} after {self.rounds} round(s); its last output:"
                      if isinstance(self.ending, CheckFailed)
                      else f"not completed: the model gave up after {self.rounds} round(s): {self.result}",
            "max_rounds": f"not completed: round limit reached after {self.rounds} round(s){tokens}",
            "budget": f"not completed: token budget spent after {self.rounds} round(s){tokens}",
            "stuck": f"not completed: the model is stuck, repeating a call or sending no usable action"
                     f" (round {self.rounds})",
            "interrupted": f"interrupted after {self.rounds} completed round(s)",
        }.get(self.status, f"error after {self.rounds} round(s): {self.error}")

    def to_json(self) -> dict:
        extra = {"error": self.error} if self.error else {}
        checks = {"checks": self.checks} if self.checks else {}
        return {"status": self.status, "result": self.result, "rounds": self.rounds,
                "usage": self.usage, **extra, "calls": self.calls, **checks}


def answer_text(value: Any) -> str:
    """An answer as people (and --check) read it: text as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)
