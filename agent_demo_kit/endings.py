"""How a run ends: one exception a reason, each with its status and exit code, raised where the
reason is found and caught once, in the loop; the statuses named once, here; and the result every
caller gets and the command line formats.

It imports records.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from agent_demo_kit.records import Call


class RunEnded(Exception):
    """Ends the run. Subclasses name the reason; `status` goes into the trace and --json."""

    status = "error"
    exit_code = 3
    call: Optional[Call] = None  # the call that reached this ending, when one did

    def __init__(self, message: str = "", result: Any = None):
        super().__init__(message)
        self.result = result

    def by(self, call: Call) -> "RunEnded":
        """This ending, reached by `call` (whose record says so)."""
        self.call, call.ends_run = call, self.status
        return self


class Finished(RunEnded):
    """The model called finish (or answered in words where that counts); `result` is its answer."""

    status, exit_code = "finished", 0


class GaveUp(RunEnded):
    """The model called fail; `result` is its reason."""

    status, exit_code = "failed", 1


class CheckFailed(GaveUp):
    """--check rejected the answer --check-attempts times; `result` is its last output, `call`
    the finish it rejected last."""


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


class CallerError(BaseException):
    """A function the caller gave the run (approve=, on_round=) raised: the run ends, and the caller gets
    its exception back as `__cause__`. Not an Exception, so nothing on the way takes it for a bug of ours."""


class OutputClosed(RunEnded):
    """stdout cannot be written (its reader went away, a full disk): the answer is lost, nothing else."""


class InternalError(RunEnded):
    """A bug in agent-demo itself; --debug shows its traceback."""

    exit_code = 1


class ConfigError(RunEnded):
    """A setting, a flag, a tool or a file is wrong, and the user can fix it; nothing was sent
    (but for a trace file that fails mid-run). The Python API raises it; the command line says it
    in one line and exits 2."""

    exit_code = 2


class EndpointError(RunEnded):
    """The endpoint refused, failed or answered with something unusable (exit 3); `unreachable`:
    there was no connection at all (a wrong URL, or a server that is down)."""

    def __init__(self, message: str, http_status: Optional[int] = None, server_said: str = "",
                 unreachable: bool = False, set_up_wrong: bool = False):
        super().__init__(message)
        self.http_status, self.server_said, self.unreachable = http_status, server_said, unreachable
        self.set_up_wrong = set_up_wrong  # a proxy that is not set up for these requests (no key, no database)


def ending_of(status: str, message: str = "", result: Any = None) -> RunEnded:
    """An ending with this status, as a trace's end record names it (an unknown one is an error)."""
    kinds = {kind.status: kind for kind in (Finished, GaveUp, Stuck, BudgetSpent, RoundLimit, Interrupted)}
    return kinds.get(status, RunEnded)(message, result=result)


# The work's own outcomes: a batch does not redo a task that ended so.
ENDED = tuple(kind.status for kind in (Finished, GaveUp, RoundLimit, BudgetSpent, Stuck))
# Not finished, not failed: a run that ended so can be taken further with --resume.
RESUMABLE = {RoundLimit.status, BudgetSpent.status, Stuck.status, RunEnded.status, Interrupted.status}
UNFINISHED = "unfinished"  # how a recorded run stands that was cut short before its end record
RUN_STATUSES = (*ENDED, RunEnded.status, Interrupted.status, UNFINISHED)


@dataclass
class RunResult:
    """How a run ended: what `agent_demo.run` returns, and all the command line formats."""

    ending: RunEnded
    rounds: int = 0
    usage: Dict[str, Any] = field(default_factory=dict)
    calls: List[dict] = field(default_factory=list)  # every call of the run, with its round and result
    progress: List[str] = field(default_factory=list)  # the lines said after the outcome (the model's last words)
    checks: List[dict] = field(default_factory=list)  # every run of --check, with its round
    trace: Optional[str] = None  # the trace file the run was recorded in, if any
    last_words: str = ""  # what the model last said besides actions, when the run ended without an answer
    material: Optional[dict] = None  # material read a page at a time: its chars, bytes and read_chars
    models: Optional[Dict[str, dict]] = None  # with --escalate: each model's rounds and tokens
    answered_in_words: bool = False  # finished by a reply of words, not by a finish action
    cost: Optional[float] = None  # dollars, with --price
    output: Any = None  # with output_type: the result as that type (finished runs only)

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
        """Did the endpoint refuse the key (HTTP 401 or 403), or say it cannot take one (a proxy's set-up)?"""
        return isinstance(self.ending, EndpointError) and (self.ending.http_status in (401, 403)
                                                           or self.ending.set_up_wrong)

    @property
    def resumable(self) -> bool:
        """Can --resume take the run further? Not once it finished or failed, not after a usage or
        configuration error (nothing was sent, or the flags must change first), and not when a refused
        key stopped it before its first round: going on would only start it again."""
        return (self.status in RESUMABLE and self.exit_code != ConfigError.exit_code
                and not (self.key_refused and self.rounds == 0))

    def summary(self) -> str:
        """One line on how the run ended, for people."""
        tokens = f", {self.usage['total_tokens']} tokens" if "total_tokens" in self.usage else ""
        if "cached_tokens" in self.usage:
            tokens += f" ({self.usage['cached_tokens']} cached)"
        if self.usage.get("estimated"):
            tokens += " (partly estimated)"
        return {
            "finished": f"finished after {self.rounds} round(s){tokens}",
            "failed": f"not completed: {self.ending} after {self.rounds} round(s)"
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
        said = {"last_words": self.last_words} if self.last_words else {}
        read = {"material": self.material} if self.material else {}
        models = {"models": self.models} if self.models is not None else {}
        cost = {"cost": self.cost} if self.cost is not None else {}
        return {"status": self.status, "result": self.result, "answered_in_words": self.answered_in_words,
                "rounds": self.rounds, "usage": self.usage, **cost, **models, **extra, **said, **read,
                "calls": self.calls, **checks}
