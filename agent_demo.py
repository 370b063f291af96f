"""agent-demo: a minimal agent loop over an OpenAI-compatible chat-completions endpoint.

`Agent.run` is the loop: ask the model, parse its actions, execute them, feed the results back, until
an ending (agent_demo_kit/endings.py) is raised where it is detected and caught once, in `run`. It
reports to one seam (agent_demo_kit/seam.py) and imports no layer. The command line, a batch and
`agent_demo.run(task, ...)` all make a Job with agent_demo_kit/setup.py and run this same agent.
"""
import os
import sys
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple, Union

from agent_demo_kit import __version__
from agent_demo_kit import prompts
from agent_demo_kit.actions import Action, Parsed, native_calls, parse_reply, refusal_of
from agent_demo_kit.conversation import Conversation, recall_rounds, shorten_args, truncate_result
from agent_demo_kit.endings import (BudgetSpent, CallerError, ConfigError, EndpointError, Finished, GaveUp,
                                    InternalError, Interrupted, RoundLimit, RunEnded, RunResult, SigTerm, Stuck,
                                    Terminated)
from agent_demo_kit import outcome
from agent_demo_kit.records import (Call, Reply, Round, add_usage, count_usage, failure, json_size,
                                    success, to_json, total_usage)
from agent_demo_kit.seam import Approver, Job
from agent_demo_kit.settings import recorded_settings
from agent_demo_kit.setup import notes_before_the_first_round, prepare_for_caller
from agent_demo_kit.urls import display_url
from agent_demo_kit.watchdog import Watchdog
from agent_demo_kit.tools import (CONTROL_ACTIONS, FINISH, NOTE, RECALL, Tool, ToolError, call_tool, check_args, in_use,
                                  tool)

# The Python API (docs/python.md): dir(agent_demo) shows these; the rest is the loop's own.
__all__ = ["run", "arun", "astream", "events", "tool", "ToolError", "ConfigError", "RunResult", "Round", "Call",
           "__version__"]


def __dir__() -> List[str]:
    return list(__all__)


def __getattr__(name: str) -> Any:
    """agent_demo.events, the types of what a run reports to a caller: loaded when a caller asks."""
    if name == "events":
        from agent_demo_kit import events
        return events
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Agent:
    """One run, made from its Job (agent_demo_kit/seam.py: settings, the model client, the tools, the
    hooks it reports to and the layers' answers, made whole by setup.py); nothing outside sets its
    parts after. stop: a threading.Event, once set the run ends as interrupted before its next round
    (a batch told to stop, a cancelled arun)."""

    def __init__(self, job: Job, stop: Any = None):
        self.job, self.stop = job, stop
        self.settings, self.registry, self.hooks = job.settings, job.registry, job.hooks
        self.escalation = job.escalation  # who is in charge, with --escalate
        self.client = job.escalation.client if job.escalation else job.client
        self.task_notices = list(job.task_notices)
        self.watchdog = Watchdog()
        self.usage: dict = {}
        self.task = ""  # as the user gave it (the conversation's may say more)
        self.uncertain: Dict[str, int] = {}  # tools with a call started before a crash -> the round redone
        self.round_limit = job.round_limit or self.settings.max_rounds  # a follow-up's are its own
        self.token_limit = self.settings.max_tokens
        self.conversation = Conversation("", self.settings, self.registry, self.client, self.hooks.compaction,
                                         finish=job.output and job.output.finish())

    def run(self, task: str, history: Sequence[Round] = (), unfinished: Sequence[Call] = (),
            follow_up: Optional[str] = None, resumed: bool = False) -> RunResult:
        """Ask, parse, execute, feed back, until an ending. history (the rounds done) resumes a run
        (resumed: one cut short even before its first round ended); unfinished are the calls with side
        effects it started in the round after them; follow_up is the user's next turn after its last round."""
        try:
            self.begin(task, history, unfinished, follow_up, resumed or bool(history))
            while True:
                self.step()
        except RunEnded as ended:
            ending = ended
        except KeyboardInterrupt:
            ending = Interrupted()
        except SigTerm:
            ending = Terminated("terminated by SIGTERM")
        except CallerError as error:  # the caller's own function raised: the run ends, and they get it back
            self.end(RunEnded(f"{error}: {type(error.__cause__).__name__}: {error.__cause__}"))
            raise error.__cause__ from None
        except Exception as error:  # a bug of ours: the run still ends with its record, and --debug shows it
            ending = InternalError(f"internal error: {type(error).__name__}: {error}")
            ending.__cause__ = error
        return self.end(ending)

    def step(self) -> None:
        """One round: ask, run what the reply asks for, feed the results back; raise the ending it reaches."""
        number = len(self.conversation.rounds) + 1
        if self.stop is not None and self.stop.is_set():  # a batch was told to stop: resumable, as after Ctrl-C
            raise Interrupted()
        if number > self.round_limit:
            raise RoundLimit()
        if self.token_limit is not None and self.usage.get("total_tokens", 0) >= self.token_limit:
            raise BudgetSpent()
        try:
            reply, messages = self.ask()
        except EndpointError as error:  # the first model's endpoint failed: the stronger one may get past it
            takeover = self.escalation and self.escalation.on_endpoint_error(error)
            if not takeover:
                raise
            self.hand_over(takeover)
            return
        if reply.unread:
            self.hooks.note(f"the reply was not read to its end: {reply.unread} were left unread (a limit on"
                            " every reply)")
        usage, estimated = count_usage(reply, lambda: json_size(messages), self.hooks.note)
        mode = self.conversation.mode
        parsed = self.read(reply)
        self.hooks.reply(number, self.round_limit, reply, parsed.prose, usage, estimated)
        calls, ending = self.execute(parsed, number)
        # What is sent back, to this endpoint or to another model's, holds no key the model repeated.
        redact, redact_values = self.hooks.redact, self.hooks.redact_values
        record = Round(number, redact(reply.content), calls, redact_values(self.conversation.feedback(parsed, calls)), mode,
                       reply.latency_ms, usage, estimated, problem=parsed.problem,
                       tool_calls=redact_values(native_calls(parsed, mode)),
                       request_chars=self.conversation.size,
                       model=self.client.settings.model if self.escalation else None)
        self.conversation.rounds.append(record)
        add_usage(self.usage, record)
        self.hooks.round(record)
        goes_on = ending is None or isinstance(ending, Stuck)  # a run that ends here hands nothing over
        takeover = self.escalation and goes_on and self.escalation.after_round(record, reply.finish_reason, ending)
        if takeover:
            if isinstance(ending, Stuck):  # the stronger model goes on instead
                ending = None
            self.hand_over(takeover)
        if ending:
            raise ending

    def hand_over(self, takeover: Any) -> None:
        """The other model takes the run over (escalation.py says how); it gets its own tries."""
        notice = self.escalation.hand_over(takeover, self.conversation, self.hooks)
        self.client = self.escalation.client
        self.watchdog.hand_over()
        if not self.conversation.rounds:  # told with the task, before the first round
            self.task_notices.append(notice)

    # --- the phases of a round ---------------------------------------------------------------

    def begin(self, task: str, history: Sequence[Round], unfinished: Sequence[Call],
              follow_up: Optional[str], resumed: bool) -> None:
        """Record the start (the resume, the follow-up) with the run's own settings, and say which calls
        may have happened before a crash."""
        self.task = task = self.hooks.redact(task)  # what was piped in may hold a key
        self.conversation.task = task
        if unfinished:  # the model never saw their results: it is told they may have happened
            self.conversation.task += prompts.render_may_have_happened(
                [(call.tool, to_json(shorten_args(call.args))) for call in unfinished])
        if self.job.output:  # what the result must fit, said with the task
            self.conversation.task += prompts.render_output_schema(self.job.output.schema)
        for notice in self.task_notices:  # another model took over before the first round
            self.conversation.task += f"\n\n{notice}"
        self.conversation.rounds.extend(history)
        self.watchdog.replay(history)
        self.usage = total_usage(list(history))
        if follow_up is not None:  # it gets --max-rounds new rounds (and --max-tokens more tokens)
            follow_up = self.hooks.redact(follow_up)
            history[-1].add_follow_up(follow_up)
            self.round_limit = len(history) + self.settings.max_rounds
            if self.token_limit is not None:
                self.token_limit += self.usage.get("total_tokens", 0)
        kept = {name: value for name, value in recorded_settings(self.settings).items() if name not in ("url", "model")}
        kept.update(max_rounds=self.round_limit, max_tokens=self.token_limit, tools=list(self.registry),
                    answer_only=self.settings.tool_names == [], **self.client.form.record())
        model, url = self.settings.model, display_url(self.settings.endpoint)
        if follow_up is not None:
            self.hooks.follow_up(follow_up, model, url, len(history), kept)
        elif resumed:  # a resume record, even after no round: the calls recorded before it still count
            self.hooks.resume(task, model, url, len(history), kept)
        else:
            self.hooks.start(task, model, url, kept)
        for text in [*self.job.notes, *notes_before_the_first_round(  # the notes of its tools first (MCP's)
                self.settings, self.registry, self.job.approver, self.client, self.escalation, follow_up is not None)]:
            self.hooks.note(text)
        for call in unfinished:
            self.uncertain[call.tool] = len(history) + 1
            self.hooks.note(f"{call.tool} {to_json(call.args)} started in round {len(history) + 1} before the"
                            f" run was cut short and may have happened: in round {len(history) + 1}, no call of"
                            f" {call.tool} runs unless you approve it")
        self.conversation.check_fits()

    def ask(self) -> Tuple[Reply, List[dict]]:
        """The model's reply to the conversation (and the messages sent), with the live status line meanwhile."""
        with self.hooks.working() as status:
            def feed(piece: str) -> None:  # a run told to stop (a cancelled arun) stops mid-reply
                if self.stop is not None and self.stop.is_set():
                    raise Interrupted()
                status.feed(piece)
            self.client.on_text = feed
            return self.client.ask(self.conversation.messages, self.conversation.tools, self.stop)

    def read(self, reply: Reply) -> Parsed:
        """The reply's actions. A reply of plain words is the model's answer in tools mode, as in every
        function-calling loop; in json and schema mode once the model was told how to send one and
        answered in words again."""
        mode, rounds = self.conversation.mode, self.conversation.rounds
        parsed = parse_reply(reply, mode, in_use(self.registry))
        if parsed.repaired:
            self.hooks.note(f"the reply's action was not written as JSON ({parsed.repaired}); it was read as one")
        if not parsed.words:
            return parsed
        if mode == "tools" or rounds and rounds[-1].problem == prompts.WORDS_WITHOUT_ACTION:
            return Parsed([Action(FINISH.name, {"result": parsed.words})], prose=parsed.prose, answered_in_words=True)
        parsed.problem = prompts.WORDS_WITHOUT_ACTION
        return parsed

    def execute(self, parsed: Parsed, number: int) -> Tuple[List[Call], Optional[RunEnded]]:
        """Run a reply's actions in order, one Call each (in tools mode every tool_call id gets its
        answer), and the first ending a call reached. The same action again in the reply gets the first
        one's result; finish or fail count only last and after calls that all succeeded."""
        calls: List[Call] = []
        first_of: Dict[str, Call] = {}
        ending: Optional[RunEnded] = None
        keys = [Watchdog.key(action) if isinstance(action.args, dict) else str(index)
                for index, action in enumerate(parsed.actions)]
        position = {key: n for n, key in enumerate(dict.fromkeys(keys))}  # among the actions, each once
        for index, (action, key) in enumerate(zip(parsed.actions, keys), 1):
            self.hooks.action(index, len(keys), action.tool, action.args, parsed.answered_in_words)
            if key in first_of:
                call = Call(action.tool, action.args, first_of[key].result, watchdog="cached", note=prompts.SAME_REPLY)
            else:
                refusal = refusal_of(action.tool, position[key], len(position), calls, self.settings.max_calls)
                try:
                    call = Call(action.tool, action.args, failure(refusal)) if refusal \
                        else self.execute_call(action, number)
                except RunEnded as reached:  # finish, fail, a check out of attempts, a call repeated too often
                    if reached.call is None:  # not reached by the call: the trace or the check failed
                        raise
                    call, ending = reached.call, ending or reached
                first_of[key] = call
            call.id = action.id
            if parsed.answered_in_words:
                call.note = prompts.ANSWERED_IN_WORDS
            calls.append(call)
            self.hooks.result(call, truncate_result(call.result, self.settings.max_result_chars))
        if self.watchdog.stuck_on_format(calls):
            ending = Stuck()
        return calls, ending

    def execute_call(self, action: Any, number: int) -> Call:
        """Run one action: finish and fail end the run, recall reads the rounds done, note adds to the
        working notes; a repeated call is cached, refused, then stuck."""
        if action.problem or not isinstance(action.args, dict):
            problem = action.problem or f"\"args\" of {action.tool} must be a JSON object"
            return Call(action.tool, action.args, failure(problem), format_error=True)
        control = CONTROL_ACTIONS.get(action.tool)
        if control:
            return self.execute_control(control, action, number)
        if action.tool not in self.registry:
            return Call(action.tool, action.args, call_tool(action.tool, action.args, self.registry))  # unknown tool
        earlier = self.watchdog.earlier(action)
        times = len(earlier["rounds"]) if earlier else 0
        call = Call(action.tool, action.args, {}, watched=True)
        if times == 0 or times == 1 and earlier["result"].get("cancelled"):  # the user may say yes this time
            call.result = self.run_tool(call, number)
        elif times == 1:
            call.result, call.watchdog = earlier["result"], "cached"
            call.note = prompts.render_cached_note(earlier["rounds"][0])
        elif times == 2:
            call.result, call.watchdog = failure(prompts.render_refusal(earlier["rounds"])), "refused"
        else:
            call.result, call.watchdog = failure(f"stuck: this exact call was already made {times} times"), "stuck"
            self.watchdog.remember(number, call)
            raise Stuck().by(call)
        self.watchdog.remember(number, call)
        return call

    def execute_control(self, control: Tool, action: Any, number: int) -> Call:
        """finish, fail, recall or note, answered by the loop itself."""
        problem = check_args(control, action.args)
        if problem:
            return Call(action.tool, action.args, failure(f"bad arguments for {control.name}: {problem}",
                                                          example=control.example()))
        if control is RECALL:  # no side effects, and asking again after a fold is fair: never watched
            return Call(action.tool, action.args, recall_rounds(
                self.conversation.rounds, self.settings.max_result_chars, **action.args))
        if control is NOTE:  # no side effects either; the same note twice is kept once
            return Call(action.tool, action.args, self.conversation.notes.add(number, action.args["text"]))
        if control is FINISH and self.job.judge:  # --check, a task's own check, the output type
            return self.job.judge(action, action.args["result"], self.task, self.conversation.rounds, self.hooks,
                                  self.stop)
        value = action.args["result" if control is FINISH else "reason"]
        raise (Finished if control is FINISH else GaveUp)(result=value).by(Call(action.tool, action.args,
                                                                               success(value)))

    def run_tool(self, call: Call, number: int) -> dict:
        """Call the tool, first asking the user when --approve or the tool's side effects say so (not
        about a call whose arguments would be refused anyway). A call with side effects is recorded
        before it runs. In the round redone after a crash, a call of a tool whose call may have happened
        runs only if the user says so, whatever its arguments: --yes does not say so."""
        tool, settings = self.registry[call.tool], self.settings
        asks = (settings.approve or tool.side_effects) and not settings.yes and not check_args(tool, call.args)
        may_have_run = self.uncertain.get(call.tool) == number
        if may_have_run and not (asks and self.job.approver):
            self.hooks.note(f"{call.tool} {to_json(call.args)} was not run: a call of {call.tool} may have happened"
                            " before the run was cut short" + (" (--yes does not approve that)" if settings.yes else
                                                               "; there is no terminal to ask"))
            return failure(prompts.OUTCOME_UNKNOWN)
        if asks:
            if self.job.approver is None:
                return failure(prompts.NO_TERMINAL, cancelled=True)
            question = {**call.action, **({"warning": tool.warning} if tool.warning else {}),
                        **({"may_have_run": True} if may_have_run else {})}
            if not self.job.approver(question):
                return failure(prompts.OUTCOME_UNKNOWN) if may_have_run else failure(prompts.CANCELLED, cancelled=True)
        if tool.side_effects:
            self.hooks.call_started(number, call)
        with self.hooks.working(f"running {call.tool}"):
            # A key a tool hands back goes no further: not to the endpoint, the digest or the trace.
            return self.hooks.redact_values(call_tool(call.tool, call.args, self.registry))

    def end(self, ending: RunEnded) -> RunResult:
        """The outcome, recorded as the run's last event. It is data a caller keeps: no key in it
        (an endpoint's error may quote it, a model may repeat it)."""
        first = self.escalation.model("first") if self.escalation else self.client.settings.model
        result = outcome.run_result(ending, self.conversation.rounds, self.usage, self.hooks.redact_values, first,
                                    by_model=bool(self.escalation), material=self.job.material,
                                    trace=self.job.trace_path,
                                    prices=self.settings.prices() if self.settings.price else None)
        if self.job.output and result.status == "finished":  # the result fitted: as the caller's type
            result.output = self.job.output.value_of(result.result)
        self.hooks.end(result)
        return result


# --- the Python API: one entrance for the command line, batch runs and Python callers --------------

def run(task: str, *, tools: Sequence[Callable] = (), approve: Optional[Approver] = None,
        trace: Union[str, "os.PathLike[str]", bool, None] = None, on_round: Optional[Callable[[Round], None]] = None,
        on_event: Optional[Callable[[Any], None]] = None, output_type: Any = None, material: str = "",
        **settings: Any) -> RunResult:
    """Run one task with the agent the command line runs, and return how it ended (docs/python.md).

    settings: the command line's settings by their long names (url=, model=, max_rounds=, mode=,
    check=, max_context=, ...; api_key= too), with the same defaults, read from the same
    environment variables and ./.env when not given. tools: plain functions (or async def ones)
    with type hints and a docstring, added to the built-in tools. approve: decides each call that
    needs approval, given {"tool", "args"} (and "warning"); without it such calls are refused, as on
    the command line without a terminal. trace: a file to append the run's record to, True for the
    run log folder the command line uses, None to keep none. on_round: called with each Round as it
    completes; on_event: with each event (agent_demo_kit/events.py). output_type: a JSON Schema, a
    dataclass, a TypedDict or a pydantic model the finish's result must fit (result.output is it,
    typed). material: text the task is about, as piped to the command line.

    Raises ConfigError, with the message the command line prints, for what the caller can fix: a
    bad setting, no key, a tool that cannot be described, a --check that cannot start. An endpoint
    that fails gives a result with status "error" (exit_code 3), as on the command line."""
    return _run(task, dict(settings, tools=tools, approve=approve, trace=trace, on_round=on_round, on_event=on_event,
                           output_type=output_type, material=material))


async def arun(task: str, *, parallel: Optional[int] = None, **given: Any) -> RunResult:
    """run() as a coroutine, with the same keywords. The run goes on in a thread of its own (a blocking
    tool does not block the event loop; an async def tool is awaited on this loop). The arun() and
    astream() calls of a process share one limit on requests in flight to an endpoint: `parallel`
    (default as --batch's), lowered by 429s. Cancelled, the run ends as interrupted, with its end record."""
    from agent_demo_kit.aio import in_a_thread, shared_gate
    return await in_a_thread(lambda stop: _run(task, given, stop, shared_gate(parallel)))


async def astream(task: str, *, parallel: Optional[int] = None, **given: Any) -> AsyncIterator[Any]:
    """arun() as the events it reports (agent_demo.events), in order, as they come; the last is Ended,
    with the RunResult. Leaving the loop early stops the run (it ends as interrupted)."""
    from agent_demo_kit.aio import events_of, shared_gate
    async for event in events_of(lambda stop, emit: _run(task, given, stop, shared_gate(parallel), emit)):
        yield event


def _run(task: str, given: Dict[str, Any], stop: Any = None, gate: Any = None, emit: Any = None) -> RunResult:
    """run(), arun() and astream(): given holds run()'s keywords and the settings; stop, once set, ends
    the run as interrupted; gate limits requests in flight; emit is told each event, after on_event."""
    with prepare_for_caller(task, given, gate, emit) as job:
        try:
            result, _ = run_job(job, stop)
        except CallerError as error:  # on_event raised at the end: its own exception, as from anywhere else
            raise error.__cause__ from None
    if isinstance(result.ending, ConfigError) and not result.rounds:  # found before anything was sent
        raise result.ending
    return result


def run_job(job: Job, stop: Any = None) -> Tuple[RunResult, Agent]:
    """Run a job made ready by `prepare` to its end (stop: as Agent takes it); its outcome, and its agent."""
    agent = Agent(job, stop)
    return agent.run(job.task, job.history, job.unfinished, job.follow_up, job.resumed), agent


if __name__ == "__main__":
    sys.modules.setdefault("agent_demo", sys.modules[__name__])  # one module, whichever way it was started
    from agent_demo_kit.cli import main
    sys.exit(main())
