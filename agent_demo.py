"""agent-demo: a minimal agent loop over an OpenAI-compatible chat-completions endpoint.

`run` is the loop: ask the model, parse its actions, execute them, feed the
results back, until an ending (endings.py) is raised. `main` is the command
line around it. Which module owns what: README, "Layout".
"""
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import cli
import prompts
import runs
from actions import Action, Parsed, parse_reply
from client import ModelClient, Reply
from context import Conversation, digest_line, recall_rounds, request_size, shorten_args, truncate_result
from endings import (BudgetSpent, ConfigError, EndpointError, Finished, GaveUp, InternalError, Interrupted,
                     OutputClosed, RequestChanged, RoundLimit, RunEnded, RunResult, SigTerm, Stuck,
                     Terminated)
from output import Redactor, protected, stray_prints_to_stderr
from records import Call, Round
from runlog import RunLog
from settings import Settings, chat_completions_url, display_url, read_environment, secrets_of
from tools import CONTROL_ACTIONS, FAIL, FINISH, RECALL, REGISTRY, Tool, call_tool, check_args, failure

FORMAT_ERRORS_BEFORE_STUCK = 3
ENDINGS = (FINISH.name, FAIL.name)  # may only come last in a reply
Approver = Callable[[dict], bool]  # asks the user about one call; True runs it


# --- the loop -------------------------------------------------------------------------

def run(task: str, settings: Settings, ask_model: Callable[..., Reply],
        registry: Dict[str, Tool] = REGISTRY, log: Optional[RunLog] = None,
        history: Sequence[Round] = (), approve: Optional[Approver] = None) -> RunResult:
    """Ask, parse, execute, feed back, until an ending; history (the rounds done) resumes a run."""
    log = log or RunLog()
    conversation = Conversation(task, registry, settings, list(history), settings.mode,
                                mode_worked=any(record.mode == settings.mode for record in history),
                                on_compaction=log.compaction)
    watchdog, usage = Watchdog().replay(history), total_usage(history)
    try:
        start_log(log, conversation, approve)
        for number in range(len(history) + 1, settings.max_rounds + 1):
            if settings.max_tokens is not None and usage.get("total_tokens", 0) >= settings.max_tokens:
                raise BudgetSpent()
            reply, messages = ask(ask_model, conversation, log)
            counted = count_usage(reply, messages)
            log.reply(number, settings.max_rounds, reply, *counted)
            parsed = parse_reply(reply, conversation.mode)
            calls = execute(parsed, registry, watchdog, number, approve, settings, conversation.rounds)
            record = make_round(number, reply, counted, parsed, calls,
                                feed_back(parsed, calls, registry, settings, conversation.mode), conversation.mode)
            conversation.rounds.append(record)
            add_usage(usage, record)
            log.round(record)
            end_if_done(record, watchdog)
        raise RoundLimit()
    except RunEnded as ended:
        ending = ended
    except KeyboardInterrupt:
        ending = Interrupted()
    except SigTerm:
        ending = Terminated("terminated by SIGTERM")
    except Exception as error:  # a bug of ours: the run still ends with its record, and --debug shows it
        ending = InternalError(f"internal error: {type(error).__name__}: {error}")
        ending.__cause__ = error
    rounds = conversation.rounds
    outcome = RunResult(ending, rounds=len(rounds), usage=usage,
                        calls=[{"round": record.number, "tool": call.tool, "args": call.args, "result": call.result}
                               for record in rounds for call in record.calls],
                        progress=[] if ending.status in ("finished", "failed")
                        else [digest_line(record, 200) for record in rounds])  # what was done, for a run cut short
    log.end(outcome)
    return outcome


def start_log(log: RunLog, conversation: Conversation, approve: Optional[Approver]) -> None:
    """Record the start (or the resume) with the run's own limits, and check that the task fits."""
    settings = conversation.settings
    limits = {"max_rounds": settings.max_rounds, "max_tokens": settings.max_tokens,
              "max_reply_tokens": settings.max_reply_tokens, "mode": settings.mode,
              "max_calls": settings.max_calls, "tools": list(conversation.registry), "approve": settings.approve,
              "tools_files": settings.tools_files, "max_context": settings.max_context,
              "tool_timeout": settings.tool_timeout}
    url = display_url(chat_completions_url(settings.url))
    if conversation.rounds:
        log.resume(conversation.task, settings.model, url, len(conversation.rounds), limits)
    else:
        log.start(conversation.task, settings.model, url, limits)
    if settings.approve and not settings.yes and approve is None:
        log.note("--approve: there is no terminal to ask, so every tool call will be refused")
    conversation.check_fits()


def ask(ask_model: Callable[..., Reply], conversation: Conversation, log: RunLog) -> Tuple[Reply, List[dict]]:
    """Send the conversation; while the endpoint refuses this mode's options, step down and send again."""
    while True:
        messages = conversation.messages()
        try:
            reply = ask_model(messages, **conversation.options())
        except RequestChanged as change:  # the request is built again, to the budget, in the new form
            log.setting(change.setting, change.value, str(change))
        except EndpointError as error:
            if conversation.mode == "json" or not error.rejects_request_options(conversation.mode_worked):
                raise
            step_down(conversation, log, f"HTTP {error.http_status}: {error.server_said}")
        else:
            conversation.mode_worked = True
            return reply, messages


def step_down(conversation: Conversation, log: RunLog, refusal: str) -> None:
    """After a refusal, the next thing to try: schema mode's next response_format variant, else json mode."""
    variants = prompts.SCHEMA_VARIANTS
    variant = conversation.schema_variant if conversation.mode == "schema" else None
    if variant in variants[:-1]:
        conversation.schema_variant = variants[variants.index(variant) + 1]
        log.fallback("schema", "schema", refusal, variant, conversation.schema_variant)
    else:
        log.fallback(conversation.mode, "json", refusal, variant)
        conversation.mode = "json"
    conversation.mode_worked = False  # the new form has yet to be answered


def execute(parsed: Parsed, registry: Dict[str, Tool], watchdog: "Watchdog", number: int,
            approve: Optional[Approver], settings: Settings, rounds_done: Sequence[Round]) -> List[Call]:
    """Run a reply's actions in order; finish or fail count only last and after calls that all succeeded."""
    calls: List[Call] = []
    this_reply: Dict[str, Call] = {}  # the same call twice in one reply is answered once, not a loop
    for index, action in enumerate(parsed.actions):
        failed = [(n, done.tool) for n, done in enumerate(calls, 1) if not done.result.get("ok")]
        repeat = this_reply.get(Watchdog.key(action)) if isinstance(action.args, dict) else None
        refusal = (prompts.OVER_CAP.format(cap=settings.max_calls) if index >= settings.max_calls
                   else prompts.NOT_LAST.format(tool=action.tool) if action.tool in ENDINGS
                   and index < len(parsed.actions) - 1
                   else prompts.render_after_failure(failed) if action.tool in ENDINGS and failed
                   else None)
        if repeat:
            call = Call(action.tool, action.args, repeat.result, watchdog="cached", note=prompts.SAME_REPLY)
        elif refusal:
            call = Call(action.tool, action.args, failure(refusal))
        else:
            call = execute_call(action, registry, watchdog, number, approve, settings, rounds_done)
            if isinstance(action.args, dict):
                this_reply.setdefault(Watchdog.key(action), call)
        call.id = action.id
        calls.append(call)
    watchdog.count_reply(calls)
    return calls  # one per action: in tools mode every tool_call id gets its answer


def execute_call(action: Action, registry: Dict[str, Tool], watchdog: "Watchdog", number: int,
                 approve: Optional[Approver], settings: Settings, rounds_done: Sequence[Round]) -> Call:
    """Run one action: finish and fail end the run, recall reads the rounds done; a repeated call
    is cached, refused, then stuck."""
    if action.problem or not isinstance(action.args, dict):
        problem = action.problem or f"\"args\" of {action.tool} must be a JSON object"
        return Call(action.tool, action.args, failure(problem), format_error=True)
    control = CONTROL_ACTIONS.get(action.tool)
    if control:
        problem = check_args(control, action.args)
        if problem:
            return Call(action.tool, action.args, failure(f"bad arguments for {control.name}: {problem}",
                                                          example=control.example()))
        if control is RECALL:  # no side effects, and asking again after a fold is fair: never watched
            return Call(action.tool, action.args, recall_rounds(rounds_done, max_chars=settings.max_result_chars,
                                                                **action.args))
        value = action.args["result" if control is FINISH else "reason"]
        return Call(action.tool, action.args, {"ok": True, "data": value},
                    ends_run="finished" if control is FINISH else "failed")
    if action.tool not in registry:
        return Call(action.tool, action.args, call_tool(action.tool, action.args, registry))  # unknown tool
    earlier = watchdog.earlier(action)
    times = len(earlier["rounds"]) if earlier else 0
    call = Call(action.tool, action.args, {}, watched=True)
    if times == 0 or times == 1 and earlier["result"].get("cancelled"):  # the user may say yes this time
        call.result = run_tool(call, registry, approve, settings)
    elif times == 1:
        call.result, call.watchdog = earlier["result"], "cached"
        call.note = prompts.render_cached_note(earlier["rounds"][0])
    elif times == 2:
        call.result, call.watchdog = failure(prompts.render_refusal(earlier["rounds"])), "refused"
    else:
        call.result = failure(f"stuck: this exact call was already made {times} times")
        call.watchdog = call.ends_run = "stuck"
    watchdog.remember(number, call)
    return call


def run_tool(call: Call, registry: Dict[str, Tool], approve: Optional[Approver], settings: Settings) -> dict:
    """Call the tool, first asking the user when --approve or the tool's side effects say so (not
    about a call whose arguments would be refused anyway)."""
    if (settings.approve or registry[call.tool].side_effects) and not settings.yes \
            and not check_args(registry[call.tool], call.args):
        if approve is None:
            return failure(prompts.NO_TERMINAL, cancelled=True)
        if not approve(call.action):
            return failure(prompts.CANCELLED, cancelled=True)
    return call_tool(call.tool, call.args, registry)


def feed_back(parsed: Parsed, calls: List[Call], registry: Dict[str, Tool], settings: Settings,
              mode: str) -> List[dict]:
    """The messages that answer this round: each result, cut to size, labelled with its call."""
    if parsed.problem:
        names = [*registry, *CONTROL_ACTIONS]
        return [{"role": "user", "content": prompts.render_format_error(parsed.problem, names, mode)}]
    lines = [prompts.render_call_result(n, {"tool": call.tool, "args": shorten_args(call.args), "note": call.note},
                                        truncate_result(call.result, settings.max_result_chars))
             for n, call in enumerate(calls, 1)]
    if parsed.answers_by_id(mode):  # every tool_call id gets its own answer
        return [{"role": "tool", "tool_call_id": call.id, "content": line} for call, line in zip(calls, lines)]
    return [{"role": "user", "content": prompts.render_results(lines, parsed.cut_off)}]


def end_if_done(record: Round, watchdog: "Watchdog") -> None:
    """Raise the ending this round reached: stuck, finished or gave up; return if the run goes on."""
    ending = next((call for call in record.calls if call.ends_run), None)
    if watchdog.format_errors_in_a_row >= FORMAT_ERRORS_BEFORE_STUCK or ending and ending.ends_run == "stuck":
        raise Stuck()
    if ending:
        raise (Finished if ending.ends_run == "finished" else GaveUp)(result=ending.result["data"])


# --- the watchdog -----------------------------------------------------------------------

class Watchdog:
    """Notices a model going in circles: the same call again and again, or no action at all."""

    def __init__(self) -> None:
        self.calls: Dict[str, dict] = {}  # canonical call -> {"rounds": [...], "result": first result}
        self.format_errors_in_a_row = 0

    @staticmethod
    def key(action: Any) -> str:
        return json.dumps([action.tool, action.args], sort_keys=True, ensure_ascii=False)

    def earlier(self, action: Action) -> Optional[dict]:
        """What this run already knows about an identical call, or None."""
        return self.calls.get(self.key(action))

    def remember(self, number: int, call: Call) -> None:
        """Count the call; keep its first real result (a cancelled one can be redone)."""
        known = self.calls.setdefault(self.key(call), {"rounds": [], "result": call.result})
        known["rounds"].append(number)
        if known["result"].get("cancelled") and not call.result.get("cancelled"):
            known["result"] = call.result

    def count_reply(self, calls: List[Call]) -> None:
        """A reply with no usable call (no action, or only calls with broken arguments) adds to the streak."""
        usable = any(not call.format_error for call in calls)
        self.format_errors_in_a_row = 0 if usable else self.format_errors_in_a_row + 1

    def replay(self, rounds: Sequence[Round]) -> "Watchdog":
        """Rebuild the state of a resumed run from its rounds, as live execution left it."""
        for record in rounds:
            self.count_reply(record.calls)
            for call in record.calls:
                if call.watched:
                    self.remember(record.number, call)
        return self


# --- usage ---------------------------------------------------------------------------------

def make_round(number: int, reply: Reply, counted: Tuple[dict, bool], parsed: Parsed, calls: List[Call],
               feedback: List[dict], mode: str) -> Round:
    """One round as the run remembers it: enough to show it, and to rebuild the conversation."""
    usage, estimated = counted
    tool_calls = None
    if parsed.answers_by_id(mode):  # re-sent as the model wrote them, broken arguments too
        tool_calls = [{"id": action.id, "type": "function", "function": {
            "name": action.tool, "arguments": action.arguments if isinstance(action.arguments, str)
            else prompts.to_json(action.arguments)}} for action in parsed.actions]
    return Round(number, reply.content, calls, feedback, mode, reply.latency_ms, usage, estimated,
                 problem=parsed.problem, tool_calls=tool_calls)


def count_usage(reply: Reply, messages: List[dict]) -> Tuple[dict, bool]:
    """The round's token counts: the endpoint's, or an estimate (about 4 characters a token)."""
    usage = reply.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    cached = cached_tokens(usage)
    if cached is not None:
        usage = {**usage, "cached_tokens": cached}
    if isinstance(usage.get("total_tokens"), int):
        return usage, False
    if isinstance(prompt, int) and isinstance(completion, int):
        return {**usage, "total_tokens": prompt + completion}, False
    prompt = request_size(messages) // 4
    completion = (len(reply.content) + (len(prompts.to_json(reply.tool_calls)) if reply.tool_calls else 0)) // 4
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}, True


def cached_tokens(usage: dict) -> Optional[int]:
    """Prompt tokens the endpoint served from its cache, as OpenAI, vLLM and Qwen or as DeepSeek report them."""
    details = usage.get("prompt_tokens_details")
    for value in (details.get("cached_tokens") if isinstance(details, dict) else None,
                  usage.get("prompt_cache_hit_tokens")):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def add_usage(total: dict, record: Round) -> None:
    """Add one round's token counts to the run's totals."""
    for key in ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens"):
        value = record.usage.get(key)
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value
    if record.usage_estimated:
        total["estimated"] = True


def total_usage(rounds: Sequence[Round]) -> dict:
    """The token counts of the rounds already done (a resumed run goes on counting)."""
    total: dict = {}
    for record in rounds:
        add_usage(total, record)
    return total


# --- the command line ------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    """The command line: read flags and settings, run, print the outcome; returns the exit code."""
    try:
        environment, unreadable = read_environment(), None
    except ConfigError as error:  # reported once the flags say how (--json or not)
        environment, unreadable = dict(os.environ), error
    redactor = Redactor(*secrets_of(environment))
    with protected(redactor) as answer:
        try:
            args = cli.parse_args(argv)
        except KeyboardInterrupt:  # Ctrl-C while a piped task was being read
            return Interrupted.exit_code
        redactor.add(*secrets_of(environment, args.url))
        if unreadable or args.runs:
            return cli.report(RunResult(unreadable), args, answer) if unreadable else runs.list_runs(environment)
        outcome, job = start(args, environment, redactor)
        try:
            if args.debug or environment.get("AGENT_DEBUG", "") not in ("", "0"):
                cli.show_traceback(outcome)
            return cli.report(outcome, args, answer, job and job.trace_path, job and job.settings)
        except OutputClosed:  # the reader took what it wanted (| head): the run's own ending stands
            return outcome.exit_code


def start(args: Any, environment: Dict[str, str], redactor: Redactor) -> Tuple[RunResult, Optional[cli.Job]]:
    """Prepare the run (or the resume) and run it; the outcome, and the job once the run started."""
    try:
        job = cli.prepare(args, environment)
        log = cli.open_log(args, job.trace_path, redactor, environment)
    except ConfigError as error:
        return RunResult(error), None
    except KeyboardInterrupt:
        return RunResult(Interrupted()), None
    except SigTerm:
        return RunResult(Terminated("terminated by SIGTERM")), None
    client = ModelClient(job.settings)
    try:
        with cli.ending_on_sigterm(), stray_prints_to_stderr():
            outcome = run(job.task, job.settings, cli.watched(client, log), job.registry, log, job.history,
                          cli.terminal_approver(redactor))
    finally:
        client.close()
        log.close()
    return outcome, job


if __name__ == "__main__":
    sys.exit(main())
