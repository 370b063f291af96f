"""agent-demo: a minimal agent loop over an OpenAI-compatible chat-completions endpoint.

`Agent.run` is the loop: ask the model, parse its actions, execute them, feed the
results back, until an ending (agent_demo_kit/endings.py) is raised where it is
detected and caught once, in `run`. The command line around it is agent_demo_kit/cli.py;
which module owns what: README, "Layout".
"""
import json
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import prompts
from agent_demo_kit.actions import Parsed, parse_reply
from agent_demo_kit.stream import Reply
from agent_demo_kit.context import Conversation, recall_rounds, request_size, shorten_args, truncate_result
from agent_demo_kit.check import check_command, run_check
from agent_demo_kit.endings import (BudgetSpent, CheckFailed, Finished, GaveUp, InternalError, Interrupted, RoundLimit,
                                    RunEnded, RunResult, SigTerm, Stuck, Terminated, answer_text)
from agent_demo_kit.settings import Settings, chat_completions_url, display_url, recorded_settings
from agent_demo_kit.trace import Call, Round, RunLog
from tools import CONTROL_ACTIONS, FAIL, FINISH, NOTE, RECALL, REGISTRY, Tool, call_tool, check_args, failure

FORMAT_ERRORS_BEFORE_STUCK = 3
ENDINGS = (FINISH.name, FAIL.name)  # may only come last in a reply
Approver = Callable[[dict], bool]  # asks the user about one call; True runs it


class Agent:
    """One run: its settings, the model client, the tools, who approves calls, and the trace."""

    def __init__(self, settings: Settings, client: Any, registry: Dict[str, Tool] = REGISTRY,
                 trace: Optional[RunLog] = None, approver: Optional[Approver] = None):
        self.settings, self.client, self.registry = settings, client, registry
        self.trace = trace or RunLog()
        self.approver = approver
        self.watchdog = Watchdog()
        self.check: Optional[List[str]] = None  # how --check is started, once it is known to start
        self.usage: dict = {}
        self.unfinished: Dict[str, int] = {}  # calls with side effects started before a crash -> their round
        self.conversation = Conversation("", settings, registry, client, self.trace.compaction)

    def run(self, task: str, history: Sequence[Round] = (), unfinished: Sequence[Call] = ()) -> RunResult:
        """Ask, parse, execute, feed back, until an ending; history (the rounds done) resumes a run,
        unfinished are the calls with side effects it started in the round after them."""
        try:
            self.begin(task, history, unfinished)
            while True:
                self.step()
        except RunEnded as ended:
            ending = ended
        except KeyboardInterrupt:
            ending = Interrupted()
        except SigTerm:
            ending = Terminated("terminated by SIGTERM")
        except Exception as error:  # a bug of ours: the run still ends with its record, and --debug shows it
            ending = InternalError(f"internal error: {type(error).__name__}: {error}")
            ending.__cause__ = error
        return self.end(ending)

    def step(self) -> None:
        """One round: ask, run what the reply asks for, feed the results back; raise the ending it reaches."""
        rounds, settings = self.conversation.rounds, self.settings
        number = len(rounds) + 1
        if number > settings.max_rounds:
            raise RoundLimit()
        if settings.max_tokens is not None and self.usage.get("total_tokens", 0) >= settings.max_tokens:
            raise BudgetSpent()
        reply, messages = self.ask()
        usage, estimated = count_usage(reply, messages)
        impossible = impossible_counts(reply.usage)
        if impossible:
            self.trace.note(f"the endpoint reported token counts that cannot be right ({prompts.to_json(impossible)});"
                            " this round's tokens are estimated")
        mode = self.conversation.mode
        parsed = parse_reply(reply, mode)
        tokens = f", {'~' if estimated else ''}{usage['total_tokens']:,} tokens" if "total_tokens" in usage else ""
        self.trace.reply(f"\n--- round {number}/{settings.max_rounds} --- {reply.latency_ms / 1000:.1f} s{tokens}",
                         reply, parsed.prose)
        calls = self.execute(parsed, number)
        record = Round(number, reply.content, calls, self.feed_back(parsed, calls), mode, reply.latency_ms,
                       usage, estimated, problem=parsed.problem, tool_calls=native_calls(parsed, mode))
        rounds.append(record)
        add_usage(self.usage, record)
        self.trace.round(record)
        self.end_if_done(record)

    # --- the phases of a round ---------------------------------------------------------------

    def begin(self, task: str, history: Sequence[Round], unfinished: Sequence[Call] = ()) -> None:
        """Record the start (or the resume) with the run's own settings, say which calls may have
        happened before a crash, and check that the task fits."""
        task = self.trace.redactor(task, placeholders=False)  # what was piped in may hold a key
        self.conversation.task = task
        self.conversation.rounds.extend(history)
        self.watchdog.replay(history)
        self.usage = total_usage(history)
        settings = self.settings
        kept = {name: value for name, value in recorded_settings(settings).items() if name not in ("url", "model")}
        kept.update(tools=list(self.registry), **self.client.form.record())
        url = display_url(chat_completions_url(settings.url))
        if history:
            self.trace.resume(task, settings.model, url, len(history), kept)
        else:
            self.trace.start(task, settings.model, url, kept)
        for call in unfinished:
            self.unfinished[Watchdog.key(call)] = len(history) + 1
            self.trace.note(f"{call.tool} {prompts.to_json(call.args)} started in round {len(history) + 1} before the"
                            " run was cut short and may have happened: it is not run again unless you approve it")
        side_effects = [name for name, tool in self.registry.items() if tool.side_effects]
        if self.approver is None and not settings.yes and (settings.approve or side_effects):
            refused = "every tool call" if settings.approve else f"every call to {', '.join(side_effects)}"
            self.trace.note(f"{'--approve: ' if settings.approve else ''}there is no terminal to ask, so {refused}"
                            " will be refused; --yes runs them")
        self.conversation.check_fits()
        if settings.check is not None:
            self.check = check_command(settings.check)

    def ask(self) -> Tuple[Reply, List[dict]]:
        """The model's reply to the conversation (and the messages sent), with the live status line meanwhile."""
        with self.trace.working() as status:
            self.client.on_text = status.feed
            return self.client.ask(self.conversation.request)

    def execute(self, parsed: Parsed, number: int) -> List[Call]:
        """Run a reply's actions in order, one Call each (in tools mode every tool_call id gets its
        answer). The same action again in the reply gets the first one's result; finish or fail
        count only last and after calls that all succeeded."""
        calls: List[Call] = []
        first_of: Dict[str, Call] = {}
        keys = [Watchdog.key(action) if isinstance(action.args, dict) else str(index)
                for index, action in enumerate(parsed.actions)]
        distinct = list(dict.fromkeys(keys))  # the actions, each once, in order
        for index, (action, key) in enumerate(zip(parsed.actions, keys), 1):
            self.trace.action(f"action {index}/{len(keys)}" if len(keys) > 1 else "action", action.tool, action.args)
            if key in first_of:
                call = Call(action.tool, action.args, first_of[key].result, watchdog="cached", note=prompts.SAME_REPLY)
            else:
                position = distinct.index(key)
                failed = [(n, done.tool) for n, done in enumerate(calls, 1) if not done.result.get("ok")]
                refusal = (prompts.OVER_CAP.format(cap=self.settings.max_calls) if position >= self.settings.max_calls
                           else prompts.NOT_LAST.format(tool=action.tool) if action.tool in ENDINGS
                           and position < len(distinct) - 1
                           else prompts.render_after_failure(failed) if action.tool in ENDINGS and failed
                           else None)
                call = Call(action.tool, action.args, failure(refusal)) if refusal else self.execute_call(action, number)
                first_of[key] = call
            call.id = action.id
            calls.append(call)
            self.trace.result(call, truncate_result(call.result, self.settings.max_result_chars))
        self.watchdog.count_reply(calls)
        return calls

    def execute_call(self, action: Any, number: int) -> Call:
        """Run one action: finish and fail end the run, recall reads the rounds done, note adds to the
        working notes; a repeated call is cached, refused, then stuck."""
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
                return Call(action.tool, action.args, recall_rounds(
                    self.conversation.rounds, max_chars=self.settings.max_result_chars, **action.args))
            if control is NOTE:  # no side effects either; the same note twice is kept once
                return Call(action.tool, action.args, self.conversation.notes.add(number, action.args["text"]))
            value = action.args["result" if control is FINISH else "reason"]
            if control is FINISH and self.check:
                return self.check_answer(action, value)
            return Call(action.tool, action.args, {"ok": True, "data": value},
                        ends_run="finished" if control is FINISH else "failed")
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
            call.result = failure(f"stuck: this exact call was already made {times} times")
            call.watchdog = call.ends_run = "stuck"
        self.watchdog.remember(number, call)
        return call

    def check_answer(self, action: Any, answer: Any) -> Call:
        """Run --check on a finish: it ends the run when the check exits 0; otherwise the model gets the
        check's output and goes on, until the run has had its --check-attempts."""
        settings = self.settings
        with self.trace.working(f"check running ({prompts.clip(settings.check, 60)})"):
            check = run_check(self.check, settings.check, answer_text(answer), self.conversation.task,
                              settings.tool_timeout)
        call = Call(action.tool, action.args, {"ok": True, "data": answer}, ends_run="finished", check=check)
        if check["exit_code"] != 0:
            left = settings.check_attempts - len(self.rejected_answers()) - 1
            call.result = failure(prompts.render_check_rejection(check, left, settings.tool_timeout))
            call.ends_run = None if left > 0 else "failed"
        return call

    def rejected_answers(self) -> List[dict]:
        """What --check said of each answer it rejected so far, resumed runs included."""
        return [call.check for record in self.conversation.rounds for call in record.calls
                if call.check and call.check.get("exit_code") != 0]

    def run_tool(self, call: Call, number: int) -> dict:
        """Call the tool, first asking the user when --approve or the tool's side effects say so (not
        about a call whose arguments would be refused anyway). A call with side effects is recorded
        before it runs; one that may have run before a crash runs again only if the user says so."""
        tool, settings = self.registry[call.tool], self.settings
        asks = (settings.approve or tool.side_effects) and not settings.yes and not check_args(tool, call.args)
        may_have_run = self.unfinished.pop(Watchdog.key(call), None) is not None
        if may_have_run and not (asks and self.approver):
            return failure(prompts.OUTCOME_UNKNOWN)
        if asks:
            if self.approver is None:
                return failure(prompts.NO_TERMINAL, cancelled=True)
            question = {**call.action, **({"warning": tool.warning} if tool.warning else {}),
                        **({"may_have_run": True} if may_have_run else {})}
            if not self.approver(question):
                return failure(prompts.OUTCOME_UNKNOWN) if may_have_run else failure(prompts.CANCELLED, cancelled=True)
        if tool.side_effects:
            self.trace.call_started(number, call)
        with self.trace.working(f"running {call.tool}"):
            # A key a tool hands back goes no further: not to the endpoint, the digest or the trace.
            return self.trace.redactor.values(call_tool(call.tool, call.args, self.registry))

    def feed_back(self, parsed: Parsed, calls: List[Call]) -> List[dict]:
        """The messages that answer this round: each result, cut to size, labelled with its call."""
        mode = self.conversation.mode
        if parsed.problem:
            names = [*self.registry, *CONTROL_ACTIONS]
            return [{"role": "user", "content": prompts.render_format_error(parsed.problem, names, mode)}]
        lines = [prompts.render_call_result(n, {"tool": call.tool, "args": shorten_args(call.args), "note": call.note},
                                            truncate_result(call.result, self.settings.max_result_chars))
                 for n, call in enumerate(calls, 1)]
        if parsed.answers_by_id(mode):  # every tool_call id gets its own answer
            return [{"role": "tool", "tool_call_id": call.id, "content": line} for call, line in zip(calls, lines)]
        return [{"role": "user", "content": prompts.render_results(lines, parsed.cut_off)}]

    def end_if_done(self, record: Round) -> None:
        """Raise the ending this round reached: stuck, finished or gave up; return if the run goes on."""
        ending = next((call for call in record.calls if call.ends_run), None)
        if self.watchdog.format_errors_in_a_row >= FORMAT_ERRORS_BEFORE_STUCK or ending and ending.ends_run == "stuck":
            raise Stuck()
        if ending and ending.check and ending.ends_run == "failed":
            raise CheckFailed(f"the check rejected {len(self.rejected_answers())} answers",
                              result=ending.check["output"])
        if ending:
            raise (Finished if ending.ends_run == "finished" else GaveUp)(result=ending.result["data"])

    def end(self, ending: RunEnded) -> RunResult:
        """The outcome, recorded as the run's last event."""
        rounds = self.conversation.rounds
        outcome = RunResult(ending, rounds=len(rounds), usage=self.usage,
                            calls=[{"round": record.number, "tool": call.tool, "args": call.args,
                                    "result": call.result} for record in rounds for call in record.calls],
                            progress=self.progress(ending),
                            checks=[{"round": record.number, **call.check} for record in rounds
                                    for call in record.calls if call.check])
        self.trace.end(outcome)
        return outcome

    def progress(self, ending: RunEnded) -> List[str]:
        """The lines shown after the outcome: the check's last output, when the check ended the run."""
        if isinstance(ending, CheckFailed):
            return prompts.clip(ending.result, 4000).splitlines() or ["(it printed nothing)"]
        return []


# --- the watchdog -----------------------------------------------------------------------

class Watchdog:
    """Notices a model going in circles: the same call again and again, or no action at all."""

    def __init__(self) -> None:
        self.calls: Dict[str, dict] = {}  # canonical call -> {"rounds": [...], "result": first result}
        self.format_errors_in_a_row = 0

    @staticmethod
    def key(action: Any) -> str:
        return json.dumps([action.tool, action.args], sort_keys=True, ensure_ascii=False)

    def earlier(self, action: Any) -> Optional[dict]:
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

    def replay(self, rounds: Sequence[Round]) -> None:
        """Rebuild the state of a resumed run from its rounds, as live execution left it."""
        for record in rounds:
            self.count_reply(record.calls)
            for call in record.calls:
                if call.watched:
                    self.remember(record.number, call)


# --- a round's record and its token counts -------------------------------------------------

def native_calls(parsed: Parsed, mode: str) -> Optional[List[dict]]:
    """A tools-mode reply's calls, to re-send as the model wrote them (broken arguments too)."""
    if not parsed.answers_by_id(mode):
        return None
    return [{"id": action.id, "type": "function", "function": {
        "name": action.tool, "arguments": action.arguments if isinstance(action.arguments, str)
        else prompts.to_json(action.arguments)}} for action in parsed.actions]


# More than any model's context holds: a count above it is not a count.
MOST_TOKENS_A_ROUND = 10_000_000
COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def is_count(value: Any) -> bool:
    """A token count that can be true: a whole number, not negative, not absurd (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MOST_TOKENS_A_ROUND


def impossible_counts(usage: Optional[dict]) -> dict:
    """The counts an endpoint reported that cannot be true (-1e9, NaN, true): the round is then estimated."""
    usage = usage or {}
    return {key: usage[key] for key in COUNTS if usage.get(key) is not None and not is_count(usage[key])}


def count_usage(reply: Reply, messages: List[dict]) -> Tuple[dict, bool]:
    """The round's token counts: the endpoint's when they can be true, or an estimate (about 4
    characters a token), so no reply can give back the budget it spent."""
    usage = reply.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    cached = cached_tokens(usage)
    if cached is not None:
        usage = {**usage, "cached_tokens": cached}
    if not impossible_counts(usage):
        if is_count(usage.get("total_tokens")):
            return usage, False
        if is_count(prompt) and is_count(completion):
            return {**usage, "total_tokens": prompt + completion}, False
    prompt = request_size(messages) // 4
    completion = (len(reply.content) + (len(prompts.to_json(reply.tool_calls)) if reply.tool_calls else 0)) // 4
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}, True


def cached_tokens(usage: dict) -> Optional[int]:
    """Prompt tokens the endpoint served from its cache, as OpenAI, vLLM and Qwen or as DeepSeek report them."""
    details = usage.get("prompt_tokens_details")
    for value in (details.get("cached_tokens") if isinstance(details, dict) else None,
                  usage.get("prompt_cache_hit_tokens")):
        if is_count(value):
            return value
    return None


def add_usage(total: dict, record: Round) -> None:
    """Add one round's token counts to the run's totals (a count a trace holds that cannot be true is not added)."""
    for key in (*COUNTS, "cached_tokens"):
        value = record.usage.get(key)
        if is_count(value):
            total[key] = total.get(key, 0) + value
    if record.usage_estimated:
        total["estimated"] = True


def total_usage(rounds: Sequence[Round]) -> dict:
    """The token counts of the rounds already done (a resumed run goes on counting)."""
    total: dict = {}
    for record in rounds:
        add_usage(total, record)
    return total


def main(argv: Optional[List[str]] = None) -> int:
    """The command line (agent_demo_kit/cli.py); returns the exit code."""
    from agent_demo_kit import cli
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
