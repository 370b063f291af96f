"""The one seam between the loop and its layers. A run tells what happens to its listeners
(`Hooks`: each report, in order, to every listener: the screen, the trace file, OpenTelemetry, a
caller's events and rounds) and asks the few questions a layer answers, which its `Job` carries:
who approves a call, who judges an answer, who takes over after a round or an endpoint error.
A `Job` is the run's parts said once, made whole by setup.py from the settings and the layers
they choose; the loop reads it and never imports a layer.

It imports records and endings.
"""
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple

from agent_demo_kit.endings import CallerError
from agent_demo_kit.records import Call, Compaction, Reply, Round, RunEvents, Working

Approver = Callable[[dict], bool]  # decides about one call ({"tool", "args", ...}); True runs it


class Hooks(RunEvents):
    """Every listener told each report, in the order they were given; what goes to the model or
    into a record is redacted here, once, with the run's redactor."""

    def __init__(self, listeners: Sequence[RunEvents] = (), redactor: Any = None):
        self.listeners = list(listeners)
        self.redactor = redactor

    def redact(self, text: str) -> str:
        return self.redactor(text, placeholders=False) if self.redactor else text  # a short key may be a number

    def redact_values(self, value: Any) -> Any:
        return self.redactor.values(value) if self.redactor else value

    def working(self, label: str = "model working") -> ContextManager[Working]:
        if len(self.listeners) == 1:  # the usual case: around every request and call, and fed each piece
            return self.listeners[0].working(label)
        return self.all_working(label)

    @contextlib.contextmanager
    def all_working(self, label: str) -> Iterator[Working]:
        with contextlib.ExitStack() as stack:
            statuses = [stack.enter_context(listener.working(label)) for listener in self.listeners]
            fed = [status for status in statuses if type(status) is not Working]  # a listener that shows nothing
            yield fed[0] if len(fed) == 1 else FedToAll(fed)

    def start(self, task: str, model: str, url: str, kept: dict) -> None:
        for listener in self.listeners:
            listener.start(task, model, url, kept)

    def resume(self, task: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        for listener in self.listeners:
            listener.resume(task, model, url, done_rounds, kept)

    def follow_up(self, text: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        for listener in self.listeners:
            listener.follow_up(text, model, url, done_rounds, kept)

    def note(self, text: str) -> None:
        for listener in self.listeners:
            listener.note(text)

    def retry(self, cause: str, attempt: int, retries: int, wait: float) -> None:
        for listener in self.listeners:
            listener.retry(cause, attempt, retries, wait)

    def setting(self, name: str, value: Any, text: str) -> None:
        for listener in self.listeners:
            listener.setting(name, value, text)

    def fallback(self, from_mode: str, to_mode: str, error: str, from_variant: Optional[str] = None,
                 to_variant: Optional[str] = None) -> None:
        for listener in self.listeners:
            listener.fallback(from_mode, to_mode, error, from_variant, to_variant)

    def compaction(self, compaction: Compaction) -> None:
        for listener in self.listeners:
            listener.compaction(compaction)

    def escalation(self, after_round: int, from_model: str, to_model: str, trigger: str, reason: str,
                   notice: str) -> None:
        for listener in self.listeners:
            listener.escalation(after_round, from_model, to_model, trigger, reason, notice)

    def reply(self, number: int, limit: int, reply: Reply, prose: str, usage: dict, estimated: bool) -> None:
        for listener in self.listeners:
            listener.reply(number, limit, reply, prose, usage, estimated)

    def action(self, index: int, count: int, tool: str, args: Any, in_words: bool = False) -> None:
        for listener in self.listeners:
            listener.action(index, count, tool, args, in_words)

    def result(self, call: Call, sent: dict) -> None:
        for listener in self.listeners:
            listener.result(call, sent)

    def call_started(self, number: int, call: Call) -> None:
        for listener in self.listeners:
            listener.call_started(number, call)

    def round(self, record: Round) -> None:
        for listener in self.listeners:
            listener.round(record)

    def end(self, outcome: Any) -> None:
        for listener in self.listeners:
            listener.end(outcome)


class FedToAll(Working):
    """Each listener's status line, fed the same pieces."""

    def __init__(self, statuses: List[Working]):
        self.statuses = statuses

    def feed(self, piece: str) -> None:
        for status in self.statuses:
            status.feed(piece)


class EachRound(RunEvents):
    """A listener for a caller's on_round: told each round as it completes."""

    def __init__(self, told: Callable[[Round], None]):
        self.told = told

    def round(self, record: Round) -> None:
        self.told(record)


@dataclass
class Job:
    """A run made ready: the parts the loop runs with (settings, the model client, the tools, the
    hooks it reports to), the task, and when it is taken up again the rounds already done; the
    layers' answers (who approves, who judges an answer, the two models with --escalate, the type a
    result must fit). Closing it ends what it opened or started (the trace, the endpoint's session,
    the tools worker, the MCP servers)."""

    settings: Any
    client: Any
    registry: Dict[str, Any]
    hooks: Hooks
    task: str
    approver: Optional[Approver] = None
    judge: Any = None  # checks.Judge: whether a finish's answer is taken (--check, a task's check, the output type)
    escalation: Any = None  # escalation.Escalation: which model is in charge
    output: Any = None  # output_types.OutputType: what a finish's result must fit (output_type=, --output-schema)
    history: List[Round] = field(default_factory=list)
    unfinished: List[Call] = field(default_factory=list)  # side-effecting calls started before a crash
    follow_up: Optional[str] = None  # the user's next turn after the run's last round (--continue)
    resumed: bool = False  # a run taken up from its trace
    round_limit: Optional[int] = None  # a bare --resume after a round limit: another --max-rounds of rounds
    material: Optional[Tuple[str, int]] = None  # material read a page at a time, and how much was shown
    notes: List[str] = field(default_factory=list)  # said once the run's start is recorded (an MCP server's)
    task_notices: List[str] = field(default_factory=list)  # what a model that took over before round 1 was told
    trace_path: Optional[str] = None  # the file the run is recorded in
    closing: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.closing.close()


def the_callers(name: str, function: Callable) -> Callable:
    """The caller's function, whose exceptions end the run and reach the caller rather than pass for ours."""
    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except Exception as error:
            raise CallerError(f"the {name} function raised") from error
    return call


def told(listener: Optional[Callable[[Any], None]], emit: Optional[Callable[[Any], None]]) -> Optional[Callable]:
    """Who is told each event: the caller's listener (on_event), then astream's queue, which is told
    even when the listener raised (astream's last event stays Ended)."""
    if not (listener and emit):
        return listener or emit

    def both(event: Any) -> None:
        try:
            listener(event)
        finally:
            emit(event)
    return both
