"""agent-demo: a minimal agent loop over an OpenAI-compatible chat-completions endpoint.

`Agent.run` is the loop: ask the model, parse its actions, execute them, feed the results
back, until an ending (agent_demo_kit/records.py) is raised where it is detected and caught
once, in `run`. `agent_demo.run(task, ...)` is the one entrance: the command line
(agent_demo_kit/cli.py) and Python callers both prepare their run with `prepare` and run this
same agent. Which module owns what: README, "Layout".
"""
import contextlib
import json
import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from agent_demo_kit import __version__  # noqa: F401  (agent_demo.__version__; first: it checks prompts and tools)
import prompts
from agent_demo_kit.actions import Action, Parsed, native_calls, parse_reply, said_besides_actions
from agent_demo_kit.child_processes import Check, checks_for, run_check
from agent_demo_kit.conversation import Conversation, recall_rounds, shorten_args, truncate_result
from agent_demo_kit.escalation import Escalation
from agent_demo_kit.records import (Call, Reply, Round, RunEvents, add_usage, answer_text, count_usage, failure,
                                    impossible_counts, is_count, json_size, success, to_json, total_usage)
from agent_demo_kit.endings import (BudgetSpent, CallerError, CheckFailed, ConfigError, EndpointError, Finished,
                                    GaveUp, InternalError, Interrupted, RoundLimit, RunEnded, RunResult, SigTerm,
                                    Stuck, Terminated)
from agent_demo_kit.scoring import cost
from agent_demo_kit.settings import (OBEYED_ONLY_WHEN_GIVEN, CHECK_OUTPUT_LINES, CHECK_OUTPUT_SHOWN,
                                     LAST_WORDS_CHARS, LAST_WORDS_LINES, MATERIAL_SHOWN_CHARS, PAGE_MARGIN_CHARS,
                                     VALUE_SHOWN_CHARS, Settings, keyword_name, load_settings,
                                     check_endpoint_settings, flag_name, recorded_differences, recorded_settings)
from agent_demo_kit.environment import Environment, read_environment
from agent_demo_kit.urls import display_url, secrets_of
from tools import (CONTROL_ACTIONS, FINISH, NOTE, RECALL, REGISTRY, Tool, ToolDefinitionError, call_tool,
                   check_args, clash_message, describe, in_use, material_reader)
from prompts import ENDINGS  # may only come last in a reply

__all__ = ["run", "prepare", "Agent", "RunResult", "Round", "Call", "ConfigError", "Settings"]

FORMAT_ERRORS_BEFORE_STUCK = 3
Approver = Callable[[dict], bool]  # decides about one call ({"tool", "args", ...}); True runs it


class Agent:
    """One run: its settings, the model client, the tools, who approves calls, and the trace."""

    def __init__(self, settings: Settings, client: Any, registry: Dict[str, Tool] = REGISTRY,
                 trace: Optional[RunEvents] = None, approver: Optional[Approver] = None):
        self.settings, self.client, self.registry = settings, client, registry
        self.trace = trace or RunEvents()
        self.approver = approver
        self.on_round: Optional[Callable[[Round], None]] = None  # told of each round as it completes
        self.watchdog = Watchdog()
        self.checks: Optional[List[Check]] = None  # --check (and a task line's own), once known to start
        self.usage: dict = {}
        self.task = ""  # as the user gave it (the conversation's may say more)
        self.uncertain: Dict[str, int] = {}  # tools with a call started before a crash -> the round redone
        self.round_limit, self.token_limit = settings.max_rounds, settings.max_tokens  # a follow-up's are its own
        self.material: Optional[Tuple[str, int]] = None  # material read a page at a time, and how much was shown
        self.expected: Optional[str] = None  # what the task's answer should be, for --check (AGENT_EXPECTED)
        self.stop: Optional[Any] = None  # a threading.Event: once set, the run ends as interrupted before its next round
        self.escalation: Optional[Escalation] = None  # --escalate: the two models, and which is in charge
        self.task_notices: List[str] = []  # what another model that took over before the first round was told
        self.conversation = Conversation("", settings, registry, client, self.trace.compaction)

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
            self.trace.note(f"the reply was not read to its end: {reply.unread} were left unread (a limit on every"
                            " reply)")
        usage, estimated = self.count(reply, messages)
        mode = self.conversation.mode
        parsed = self.read(reply)
        self.trace.reply(number, self.round_limit, reply, parsed.prose, usage, estimated)
        calls, ending = self.execute(parsed, number)
        record = Round(number, reply.content, calls, self.feed_back(parsed, calls), mode, reply.latency_ms,
                       usage, estimated, problem=parsed.problem, tool_calls=native_calls(parsed, mode),
                       request_chars=self.conversation.size,
                       model=self.client.settings.model if self.escalation else None)
        self.conversation.rounds.append(record)
        add_usage(self.usage, record)
        self.trace.round(record)
        if self.on_round:
            self.on_round(record)
        goes_on = ending is None or isinstance(ending, Stuck)  # a run that ends here hands nothing over
        takeover = self.escalation and goes_on and self.escalation.after_round(record, reply.finish_reason, ending)
        if takeover:
            if isinstance(ending, Stuck):  # the stronger model goes on instead
                ending = None
            self.hand_over(takeover)
        if ending:
            raise ending

    def hand_over(self, takeover: Any) -> None:
        """The other model takes the run over: the same conversation, built again for it, with the notice
        that says why after the last round (or with the task, before the first), and a record of it."""
        escalation, rounds = self.escalation, self.conversation.rounds
        before = self.client.settings.model
        notice = self.trace.redact(escalation.switch(takeover, rounds))  # it quotes the model and the check
        self.client = escalation.client
        self.conversation.hand_to(self.client)
        self.watchdog.format_errors_in_a_row = 0  # the model that takes over gets its own tries
        if rounds:
            rounds[-1].notice = notice if rounds[-1].notice is None else f"{rounds[-1].notice}\n\n{notice}"
        else:
            self.task_notices.append(notice)
            self.conversation.task += f"\n\n{notice}"
        self.trace.escalation(len(rounds), before, self.client.settings.model, takeover.trigger, takeover.reason,
                              notice)

    # --- the phases of a round ---------------------------------------------------------------

    def begin(self, task: str, history: Sequence[Round], unfinished: Sequence[Call],
              follow_up: Optional[str], resumed: bool) -> None:
        """Record the start (the resume, the follow-up) with the run's own settings, and say which calls
        may have happened before a crash."""
        self.task = task = self.trace.redact(task)  # what was piped in may hold a key
        self.conversation.task = task
        if unfinished:  # the model never saw their results: it is told they may have happened
            self.conversation.task += prompts.render_may_have_happened(
                [(call.tool, to_json(shorten_args(call.args))) for call in unfinished])
        for notice in self.task_notices:  # another model took over before the first round
            self.conversation.task += f"\n\n{notice}"
        self.conversation.rounds.extend(history)
        self.watchdog.replay(history)
        self.usage = total_usage(list(history))
        if follow_up is not None:  # it gets --max-rounds new rounds (and --max-tokens more tokens)
            follow_up = self.trace.redact(follow_up)
            history[-1].add_follow_up(follow_up)
            self.round_limit = len(history) + self.settings.max_rounds
            if self.token_limit is not None:
                self.token_limit += self.usage.get("total_tokens", 0)
        kept = {name: value for name, value in recorded_settings(self.settings).items() if name not in ("url", "model")}
        kept.update(max_rounds=self.round_limit, max_tokens=self.token_limit, tools=list(self.registry),
                    **self.client.form.record())
        model, url = self.settings.model, display_url(self.settings.endpoint)
        if follow_up is not None:
            self.trace.follow_up(follow_up, model, url, len(history), kept)
        elif resumed:  # a resume record, even after no round: the calls recorded before it still count
            self.trace.resume(task, model, url, len(history), kept)
        else:
            self.trace.start(task, model, url, kept)
        if self.escalation and self.escalation.in_charge == "second":
            goes_to = "the follow-up goes to" if follow_up is not None else "the run goes on with"
            self.trace.note(f"{goes_to} {self.client.settings.model} (--escalate), which had taken the run over")
        for call in unfinished:
            self.uncertain[call.tool] = len(history) + 1
            self.trace.note(f"{call.tool} {to_json(call.args)} started in round {len(history) + 1} before the"
                            f" run was cut short and may have happened: in round {len(history) + 1}, no call of"
                            f" {call.tool} runs unless you approve it")
        side_effects = [name for name, tool in self.registry.items() if tool.side_effects]
        settings = self.settings
        if self.approver is None and not settings.yes and (settings.approve or side_effects):
            refused = "every tool call" if settings.approve else f"every call to {', '.join(side_effects)}"
            self.trace.note(f"{'--approve: ' if settings.approve else ''}there is no terminal to ask, so {refused}"
                            " will be refused; --yes runs them")
        for text in getattr(self.client, "window_notes", list)():
            self.trace.note(text)
        self.conversation.check_fits()
        if self.checks is None:
            self.checks = checks_for(settings.check, settings.named("check"))

    def ask(self) -> Tuple[Reply, List[dict]]:
        """The model's reply to the conversation (and the messages sent), with the live status line meanwhile."""
        with self.trace.working() as status:
            self.client.on_text = status.feed
            return self.client.ask(self.conversation.messages, self.conversation.tools)

    def read(self, reply: Reply) -> Parsed:
        """The reply's actions. A reply of plain words is the model's answer in tools mode, as in every
        function-calling loop; in json and schema mode once the model was told how to send one and
        answered in words again."""
        mode, rounds = self.conversation.mode, self.conversation.rounds
        parsed = parse_reply(reply, mode, in_use(self.registry))
        if parsed.repaired:
            self.trace.note(f"the reply's action was not written as JSON ({parsed.repaired}); it was read as one")
        if not parsed.words:
            return parsed
        if mode == "tools" or rounds and rounds[-1].problem == prompts.WORDS_WITHOUT_ACTION:
            return Parsed([Action(FINISH.name, {"result": parsed.words})], prose=parsed.prose, answered_in_words=True)
        parsed.problem = prompts.WORDS_WITHOUT_ACTION
        return parsed

    def count(self, reply: Reply, messages: List[dict]) -> Tuple[dict, bool]:
        """The round's token counts, estimated when the endpoint's cannot be true (and then said once)."""
        impossible = impossible_counts(reply.usage)
        if impossible:
            self.trace.note(f"the endpoint reported token counts that cannot be right ({to_json(impossible)});"
                            " this round's tokens are estimated")
        return count_usage(reply, json_size(messages))

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
            self.trace.action(index, len(keys), action.tool, action.args, parsed.answered_in_words)
            if key in first_of:
                call = Call(action.tool, action.args, first_of[key].result, watchdog="cached", note=prompts.SAME_REPLY)
            else:
                refusal = self.refusal(action.tool, position[key], len(position), calls)
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
            self.trace.result(call, truncate_result(call.result, self.settings.max_result_chars))
        if self.watchdog.count_reply(calls) >= FORMAT_ERRORS_BEFORE_STUCK:
            ending = Stuck()
        return calls, ending

    def refusal(self, tool: str, position: int, count: int, before: List[Call]) -> Optional[str]:
        """Why the action at this position among the reply's distinct actions is not run, or None."""
        if position >= self.settings.max_calls:
            return prompts.OVER_CAP.format(cap=self.settings.max_calls)
        failed = [(n, done.tool) for n, done in enumerate(before, 1) if not done.result.get("ok")]
        if tool in ENDINGS and position < count - 1:
            return prompts.NOT_LAST.format(tool=tool)
        if tool in ENDINGS and failed:
            return prompts.render_after_failure(failed)
        return None

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
        if control is FINISH and self.checks:
            return self.check_answer(action, action.args["result"])
        value = action.args["result" if control is FINISH else "reason"]
        raise (Finished if control is FINISH else GaveUp)(result=value).by(Call(action.tool, action.args,
                                                                               success(value)))

    def check_answer(self, action: Any, answer: Any) -> Call:
        """Run the checks on a finish (--check, then a task line's own): it ends the run when every
        check exits 0; otherwise the model gets the output of the one that rejected it and goes on,
        until the run has had its --check-attempts."""
        settings, ran = self.settings, []
        for each in self.checks or []:
            with self.trace.working(f"check running ({prompts.clip(each.command, VALUE_SHOWN_CHARS)})"):
                ran.append(run_check(each.argv, each.command, answer_text(answer), self.task, settings.tool_timeout,
                                     each.named, expected=self.expected, stop=self.stop,
                                     secrets=[key for key in (settings.api_key, settings.escalate_key) if key]))
            if ran[-1]["exit_code"] != 0:
                break
        check = {**ran[-1], "command": " && ".join(result["command"] for result in ran)}
        check = self.trace.redact_values(check)  # it may print the environment: the key goes no further
        call = Call(action.tool, action.args, success(answer), check=check)
        if check["exit_code"] == 0:
            raise Finished(result=answer).by(call)
        left = settings.check_attempts - len(self.rejected_answers()) - 1
        call.result = failure(prompts.render_check_rejection(check, left, settings.tool_timeout))
        if left <= 0:
            rejected = len(self.rejected_answers()) + 1
            raise CheckFailed(f"the check rejected {rejected} answer{'s' if rejected > 1 else ''}",
                              result=check["output"]).by(call)
        return call

    def rejected_answers(self) -> List[dict]:
        """What --check said of each answer it rejected so far, resumed runs included."""
        return [call.check for record in self.conversation.rounds for call in record.calls
                if call.check and call.check.get("exit_code") != 0]

    def run_tool(self, call: Call, number: int) -> dict:
        """Call the tool, first asking the user when --approve or the tool's side effects say so (not
        about a call whose arguments would be refused anyway). A call with side effects is recorded
        before it runs. In the round redone after a crash, a call of a tool whose call may have happened
        runs only if the user says so, whatever its arguments: --yes does not say so."""
        tool, settings = self.registry[call.tool], self.settings
        asks = (settings.approve or tool.side_effects) and not settings.yes and not check_args(tool, call.args)
        may_have_run = self.uncertain.get(call.tool) == number
        if may_have_run and not (asks and self.approver):
            self.trace.note(f"{call.tool} {to_json(call.args)} was not run: a call of {call.tool} may have happened"
                            " before the run was cut short" + (" (--yes does not approve that)" if settings.yes else
                                                               "; there is no terminal to ask"))
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
            return self.trace.redact_values(call_tool(call.tool, call.args, self.registry))

    def feed_back(self, parsed: Parsed, calls: List[Call]) -> List[dict]:
        """The messages that answer this round: each result, cut to size, labelled with its call."""
        mode = self.conversation.mode
        if parsed.words:  # told once how to answer; words again will be the answer
            return [{"role": "user", "content": prompts.render_words_without_action(self.conversation.tools, mode)}]
        if parsed.problem:
            return [{"role": "user", "content": prompts.render_format_error(parsed.problem, self.conversation.tools,
                                                                            mode)}]
        lines = [prompts.render_call_result(n, {"tool": call.tool, "args": shorten_args(call.args), "note": call.note},
                                            truncate_result(call.result, self.settings.max_result_chars))
                 for n, call in enumerate(calls, 1)]
        if parsed.answers_by_id(mode):  # every tool_call id gets its own answer
            return [{"role": "tool", "tool_call_id": call.id, "content": line} for call, line in zip(calls, lines)]
        return [{"role": "user", "content": prompts.render_results(lines, parsed.cut_off)}]

    def end(self, ending: RunEnded) -> RunResult:
        """The outcome, recorded as the run's last event. It is data a caller keeps: no key in it
        (an endpoint's error may quote it, a model may repeat it)."""
        rounds, redact = self.conversation.rounds, self.trace.redact_values
        last_words = "" if isinstance(ending, (Finished, GaveUp)) else few_lines(next(
            (said for said in (said_besides_actions(record.model_output) for record in reversed(rounds)) if said), ""),
            LAST_WORDS_LINES, LAST_WORDS_CHARS)
        ending.args, ending.result = tuple(redact(list(ending.args))), redact(ending.result)
        outcome = RunResult(ending, rounds=len(rounds), usage=self.usage,
                            calls=redact([{"round": record.number, "tool": call.tool, "args": call.args,
                                           "result": call.result} for record in rounds for call in record.calls]),
                            progress=redact(self.progress(ending, last_words)), last_words=redact(last_words),
                            checks=redact([{"round": record.number, **call.check} for record in rounds
                                           for call in record.calls if call.check]),
                            trace=getattr(self.trace, "path", None), material=self.material_read(),
                            models=self.models_used(), answered_in_words=isinstance(ending, Finished)
                            and ending.call is not None and ending.call.note == prompts.ANSWERED_IN_WORDS,
                            cost=cost(self.tokens_by_model(), self.settings.prices()) if self.settings.price else None)
        self.trace.end(outcome)
        return outcome

    def models_used(self) -> Optional[Dict[str, dict]]:
        """With --escalate: each model's rounds and tokens (a round of a model that does not say is the first's)."""
        if self.escalation is None:
            return None
        return {name: {"rounds": used["rounds"], "tokens": used["tokens"]} for name, used in self.tokens_by_model().items()}

    def tokens_by_model(self) -> Dict[str, dict]:
        """Each model's rounds and tokens (total, prompt, completion, cached), as metrics counts them."""
        used: Dict[str, dict] = {}
        first = self.escalation.model("first") if self.escalation else self.client.settings.model
        for record in self.conversation.rounds:
            model = used.setdefault(record.model or first, {"rounds": 0, "tokens": 0, "prompt": 0, "completion": 0,
                                                            "cached": 0})
            model["rounds"] += 1
            for name, key in (("tokens", "total_tokens"), ("prompt", "prompt_tokens"),
                              ("completion", "completion_tokens"), ("cached", "cached_tokens")):
                model[name] += record.usage[key] if is_count(record.usage.get(key)) else 0
        return used

    def material_read(self) -> Optional[dict]:
        """How much of the material piped in (read a page at a time) the model saw: the part shown with
        the task and every page read_material gave, each counted once."""
        if self.material is None:
            return None
        material, shown = self.material
        spans = [(0, shown)] + [(call.result["data"]["offset"], call.result["data"]["offset"]
                                 + len(call.result["data"]["text"]))
                                for record in self.conversation.rounds for call in record.calls
                                if call.tool == "read_material" and call.result.get("ok")
                                and isinstance(call.result.get("data"), dict)
                                and isinstance(call.result["data"].get("text"), str)]
        read, reached = 0, 0
        for start, end in sorted(spans):
            read += max(0, end - max(start, reached))
            reached = max(reached, end)
        return {"chars": len(material), "bytes": len(material.encode("utf-8", "replace")), "read_chars": read}

    def progress(self, ending: RunEnded, last_words: str) -> List[str]:
        """The lines said after the outcome of a run that did not finish: the last answer the check
        rejected and what the check said of it, or the model's last words."""
        if isinstance(ending, CheckFailed):
            answer = answer_text(ending.call.args.get("result")) if isinstance(ending.call.args, dict) else ""
            return ["the last answer:", *indented(answer, LAST_WORDS_LINES, LAST_WORDS_CHARS),
                    "the check said:", *(indented(ending.result, CHECK_OUTPUT_LINES, CHECK_OUTPUT_SHOWN)
                                         or ["  (nothing)"])]
        if last_words:
            return ["the model last said:", *(f"  {line}" for line in last_words.splitlines())]
        return []


def indented(text: str, lines: int, chars: int) -> List[str]:
    """text's first `lines` lines, `chars` characters in all, each indented, for the lines after an outcome."""
    kept = few_lines(text, lines, chars).splitlines()
    return [f"  {line}" for line in kept]


def few_lines(text: str, lines: int, chars: int) -> str:
    """text's first `lines` lines, cut to `chars` characters in all, and how many lines were left out."""
    every = text.strip().splitlines()
    kept = prompts.clip("\n".join(every[:lines]), chars)
    return kept + (f"\n... ({len(every) - lines} more lines)" if len(every) > lines else "")


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

    def count_reply(self, calls: List[Call]) -> int:
        """A reply with no usable call (no action, or only calls with broken arguments) adds to the
        streak; returns the streak."""
        usable = any(not call.format_error for call in calls)
        self.format_errors_in_a_row = 0 if usable else self.format_errors_in_a_row + 1
        return self.format_errors_in_a_row

    def replay(self, rounds: Sequence[Round]) -> None:
        """Rebuild the state of a resumed run from its rounds, as live execution left it."""
        for record in rounds:
            self.count_reply(record.calls)
            for call in record.calls:
                if call.watched:
                    self.remember(record.number, call)


# --- the Python API: one entrance for the command line, batch runs and Python callers --------------

def run(task: str, *, tools: Sequence[Callable] = (), approve: Optional[Approver] = None,
        trace: Union[str, "os.PathLike[str]", bool, None] = None, on_round: Optional[Callable[[Round], None]] = None,
        material: str = "", **settings: Any) -> RunResult:
    """Run one task with the agent the command line runs, and return how it ended.

    settings: the command line's settings by their long names (url=, model=, max_rounds=, mode=,
    check=, max_context=, ...; api_key= too), with the same defaults, read from the same
    environment variables and ./.env when not given. tools: plain functions with type hints and a
    docstring, added to the built-in tools as --tools-file adds a file's. approve: decides each
    call that needs approval, given {"tool", "args"} (and "warning"); without it such calls are
    refused, as on the command line without a terminal. trace: a file to append the run's record
    to, True for the run log folder the command line uses, None to keep none. on_round: called with
    each Round as it completes. material: text the task is about, as piped to the command line.

    Raises ConfigError, with the message the command line prints, for what the caller can fix: a
    bad setting, no key, a tool that cannot be described, a --check that cannot start. An endpoint
    that fails gives a result with status "error" (exit_code 3), as on the command line."""
    path = None if trace is None or trace is False else trace
    if approve is not None and not callable(approve):
        raise ConfigError(f"approve must be a function that decides each call, got {approve!r}")
    if approve is not None:  # it decides about every call, as --approve asks about every call
        settings["approve"] = True
    environment = read_environment()
    for note in environment.notes:  # a ./.env passed by: said, as the command line says it
        print(f"agent-demo: {note}", file=sys.stderr)
    with prepare(task, given=settings, environment=environment, named=keyword_name, functions=tools,
                 material=material, trace=path, approver=approve and the_callers("approve", approve)) as job:
        job.agent.on_round = on_round and the_callers("on_round", on_round)
        outcome = job.run()
    if isinstance(outcome.ending, ConfigError) and not outcome.rounds:  # found before anything was sent
        raise outcome.ending
    return outcome


def the_callers(name: str, function: Callable) -> Callable:
    """The caller's function, whose exceptions end the run and reach the caller rather than pass for ours."""
    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except Exception as error:
            raise CallerError(f"the {name} function raised") from error
    return call


@dataclass
class Job:
    """A run made ready: its agent (settings, client, tools, trace, approver) and task, the rounds
    already done when it is taken up again; closing it ends what it opened or started (the trace,
    the endpoint's session, the tools worker, the MCP servers)."""

    agent: Agent
    task: str
    history: List[Round] = field(default_factory=list)
    unfinished: List[Call] = field(default_factory=list)  # side-effecting calls started before a crash
    follow_up: Optional[str] = None  # the user's next turn after the run's last round (--continue)
    closing: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    resumed: bool = False  # a run taken up from its trace

    def run(self) -> RunResult:
        return self.agent.run(self.task, self.history, self.unfinished, self.follow_up, self.resumed)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.closing.close()


def prepare(task: str = "", *, given: Dict[str, Any], environment: Dict[str, str],
            named: Callable[[str], str] = keyword_name, functions: Sequence[Callable] = (), material: str = "",
            trace: Union[str, "os.PathLike[str]", bool, None] = None, resume: Optional[str] = None,
            follow_up: Optional[str] = None, screen: Any = None, redactor: Any = None,
            approver: Optional[Approver] = None, confirm: Optional[Callable[[str], bool]] = None,
            session: Any = None, task_check: Optional[Tuple[str, str]] = None) -> Job:
    """A run made ready from what a caller gave: settings by name (`given`, named for messages by
    `named`), tool functions, the task and its material, where to record it (a path, True for the
    run log folder, None), or the trace of a run to take up again (`resume`, with the user's
    `follow_up` for --continue); the screen that shows it, the redactor every output goes through,
    and who confirms using what only the trace names (`confirm`, a y/N question; None: nobody can);
    the requests.Session to send on (a batch worker reuses its own; None: one of the run's own);
    a task line's own check (its command and how to name it), which the user said to run beside --check.
    ConfigError if it cannot start; what it opened is closed then."""
    from agent_demo_kit import run_log, trace_file
    from agent_demo_kit.client import ModelClient, RequestForm
    from agent_demo_kit.terminal import Redactor
    closing = contextlib.ExitStack()
    try:
        redactor = redactor or Redactor(*secrets_of(environment, given.get("url")))
        start: Optional[dict] = None
        recorded: Optional[Any] = None
        history: List[Round] = []
        unfinished: List[Call] = []
        if resume is not None:  # locked before it is read, and shown before its tools files are imported
            log = closing.enter_context(contextlib.closing(trace_file.RunLog(screen, resume, redactor)))
            recorded = trace_file.read_run(log, resume, continuing=follow_up is not None)
            start, history, unfinished = recorded.start, recorded.rounds, recorded.unfinished
            if not recorded.sealed:
                take_up_unsealed(resume, start, confirm, log)
            if "***" in str(start.get("url")) and not any(
                    (given.get("url"), environment.get("LLM_API_URL"), environment.get("OPENAI_BASE_URL"))):
                raise ConfigError("the run's URL held a password, which is not recorded: give it again with --url"
                                  " or LLM_API_URL")
            settings = load_settings(given, environment, own_settings(start, follow_up is not None), named,
                                     check_endpoint=False)
            log.say(f"{'following up on' if follow_up is not None else 'resuming'} {resume}\n  requests go to"
                    f" {display_url(settings.endpoint)}\n  tools files: {', '.join(settings.tools_files) or 'none'}"
                    + (f"\n  a stronger model on trouble (--escalate): {settings.escalate} at"
                       f" {display_url(settings.stronger().endpoint)}" if settings.escalate else ""))
            settings = settle_differences(settings, start, confirm, log)
            check_endpoint_settings(settings)
            task = start["task"]
        else:
            settings = load_settings(given, environment, named=named)
        redactor.add(*secrets_of({"LLM_API_KEY": settings.api_key or "", "LLM_ESCALATE_KEY": settings.escalate_key
                                  or ""}, settings.url, settings.escalate_url))  # a key= given too, before any child
        # Whole, before it is shown a page at a time: a page's edge must not split a key into parts too short to catch.
        material = redactor(material, placeholders=False) if material else material
        registry, start_fields, notes = tool_registry(settings, functions, redactor.secrets, closing, start)
        form = RequestForm.resumed(settings, start, any(record.mode == settings.mode for record in history)) \
            if start is not None else RequestForm.asked_for(settings)
        client = closing.enter_context(contextlib.closing(ModelClient(settings, form=form, session=session)))
        url_note = environment.where_requests_go(settings) if isinstance(environment, Environment) else ""
        if resume is None:  # said before any request: a local server's window is asked before the start is recorded
            first_lines = trace_file.RunLog(screen, None, redactor)
            first_lines.url_note = url_note
            first_lines.header(first_lines.redact(task), settings.model, display_url(settings.endpoint), form.mode)
        escalation = None
        if settings.escalate:  # the stronger model: its own endpoint and key, or the first model's
            stronger = settings.stronger()  # checked with the first model's endpoint settings
            redactor.add(*secrets_of({"LLM_ESCALATE_KEY": stronger.api_key or ""}, stronger.url))
            second = closing.enter_context(contextlib.closing(ModelClient(stronger)))
            escalation = Escalation(settings, client, second)
            if recorded is not None:
                escalation.restore(recorded.escalations, history)
        piped = start.get("material") if start is not None and isinstance(start.get("material"), str) else None
        if piped is not None:  # read a page at a time, as before
            registry["read_material"] = material_reader(piped, settings.max_result_chars - PAGE_MARGIN_CHARS)
        if material and follow_up is not None:  # piped beside a follow-up: what the follow-up is about
            follow_up = with_material(follow_up, material, registry, start_fields, settings, lambda text: Conversation(
                f"{task}\n\n{text}", settings, registry, client).fits())
            piped = start_fields.get("material", piped)
        elif material and resume is None:
            task = with_material(task, material, registry, start_fields, settings,
                                 lambda text: Conversation(text, settings, registry, client).fits())
            piped = start_fields.get("material")
        Conversation(task, settings, registry, client).check_fits()  # before a new run's trace is made:
        checks = checks_for(settings.check, settings.named("check"), task_check)
        if resume is None:
            path = run_log.new_log_file(environment) if trace is True else trace and os.fspath(trace)
            log = closing.enter_context(contextlib.closing(trace_file.RunLog(screen, path, redactor)))
            if trace is True:
                run_log.prune(Path(path).parent)
        log.start_fields, log.start_notes = start_fields, notes
        log.url_note, log.header_said = url_note, resume is None
        agent = Agent(settings, client, registry, log, approver)
        agent.checks = checks
        for each in escalation.clients.values() if escalation else [client]:
            each.trace = log
        if escalation:
            agent.escalation, agent.client = escalation, escalation.client
            agent.conversation.hand_to(agent.client)
            agent.task_notices = list(recorded.task_notices) if recorded is not None else []
        if piped is not None:  # paged: the outcome says how much of it the model read
            agent.material = (piped, start_fields.get("material_shown", (start or {}).get("material_shown", 0)))
        if resume is not None and recorded.status == "max_rounds" and given.get("max_rounds") is None:
            more = recorded.first_limit or settings.max_rounds  # the run's own --max-rounds, not the total so far
            agent.round_limit = len(history) + more  # a bare --resume: another --max-rounds of rounds
        return Job(agent, task, history, unfinished, follow_up, closing, resumed=resume is not None)
    except BaseException:
        closing.close()
        raise


def take_up_unsealed(path: str, start: dict, confirm: Optional[Callable[[str], bool]], log: Any) -> None:
    """A run whose records agent-demo did not seal as this user (appended by someone else, copied from
    elsewhere, changed, or written before seals) goes on only when the user says so on the terminal;
    with nobody to ask, ConfigError."""
    why = (f"{path}: its run was not set up by agent-demo as you (a record that sets it up carries no seal"
           " of yours: written elsewhere, changed, or by a version before 0.6)")
    if confirm is None:
        raise ConfigError(f"{why}; a trace decides nothing on its own: resume it on a terminal to be asked, or"
                          " run the task again")
    log.say(f"  {why}\n  its task: {prompts.clip(str(start.get('task')), VALUE_SHOWN_CHARS * 3)}")
    if not confirm("take it up anyway, its task and settings as written there? [y/N] "):
        raise ConfigError(f"{path}: not taken up")


def own_settings(start: dict, continuing: bool) -> dict:
    """The recorded settings a run takes up again: all but what starts a process, loads a file or
    chooses where requests go (asked about apart), and a follow-up's limits, which are its own."""
    return {name: value for name, value in start.items() if name not in OBEYED_ONLY_WHEN_GIVEN
            and not (continuing and name in ("max_rounds", "max_tokens"))}


def settle_differences(settings: Settings, start: dict, confirm: Optional[Callable[[str], bool]], log: Any) -> Settings:
    """The settings a resumed run goes on with. What the trace recorded that starts a process, loads a
    file or chooses where requests go is used only when this command line gives the same, or the user
    says so on the terminal (default no); with nobody to ask, ConfigError naming the flags to give."""
    differ = recorded_differences(start, settings)
    if not differ:
        return settings
    flags = " ".join(f"{flag_name(name)} {shlex.quote(value)}" for name, values in differ.items()
                     for value in (values if isinstance(values, list) else [values]))
    if confirm is None:
        raise ConfigError(f"the run was recorded with {flags}, which is not given now: a trace decides no such"
                          " thing on its own; give them again to use them, or others")
    log.say(f"  the trace also names {flags}")
    if not confirm(f"use {flags} as the trace names them? [y/N] "):
        log.say("  not used: the run goes on with this command line's")
        return settings
    sources = {**settings.sources, **dict.fromkeys(differ, "the resumed run")}
    return replace(settings, **{name: os.path.abspath(value) if name == "mcp_config" else
                                [os.path.abspath(path) for path in value] if name == "tools_files" else value
                                for name, value in differ.items()}, sources=sources)


def tool_registry(settings: Settings, functions: Sequence[Callable], secrets: List[str],
                  closing: contextlib.ExitStack, start: Optional[dict]) -> Tuple[Dict[str, Tool], dict, List[str]]:
    """The tools a run offers besides finish, fail, recall and note: the built-in ones, the caller's
    functions, each --tools-file's (run by a worker process) and each MCP server's, cut down to
    --tools (or, on a resume, to the tools the run had); with what the start record keeps of them
    and the notes to say once it is written. ConfigError if a function or a file gives no usable
    tool, a name clashes, a server does not start, or --tools names a tool that does not exist.
    What they start is stopped when `closing` closes."""
    registry = dict(REGISTRY)
    for function in functions:
        try:
            described = describe(function)
        except ToolDefinitionError as error:
            raise ConfigError(f"tools: {error}") from None
        if described.name in in_use(registry):
            raise ConfigError(f"tools: {clash_message(described.name)}")
        registry[described.name] = described
    start_fields: dict = {}
    notes: List[str] = []
    if settings.tools_files:
        from agent_demo_kit.child_processes import load_tools_files
        registry.update(load_tools_files(settings.tools_files, settings.tool_timeout, secrets, in_use(registry),
                                         closing, settings.named("tools_files")))
    if settings.mcp_servers or settings.mcp_config:
        from agent_demo_kit.mcp_client import McpError, McpTools, parse_server_specs
        servers = closing.enter_context(McpTools())
        try:
            specs = parse_server_specs(settings.mcp_servers, settings.mcp_config, settings.named("mcp_servers"),
                                       settings.named("mcp_config"))
            registry.update(servers.start(specs, settings.tool_timeout, taken_names=in_use(registry),
                                          stderr=sys.stderr))
        except McpError as error:
            raise ConfigError(str(error)) from None
        start_fields["mcp"] = servers.describe()
        notes += servers.notes + (servers.changes_since(start.get("mcp")) if start is not None else [])
    if settings.tool_names is not None:
        unknown = [name for name in settings.tool_names if name not in in_use(registry)]
        if unknown:
            raise ConfigError(f"{settings.named('tool_names')}: unknown tool {', '.join(unknown)}"
                              f" (available: {', '.join(in_use(registry))})")
        registry = {name: tool for name, tool in registry.items() if name in settings.tool_names}
    elif start is not None and isinstance(start.get("tools"), list):
        registry = {name: tool for name, tool in registry.items() if name in start["tools"]}
    return registry, start_fields, notes


def with_material(task: str, material: str, registry: Dict[str, Tool], start_fields: dict, settings: Settings,
                  fits: Callable[[str], bool]) -> str:
    """The task with the material piped in: whole when the requests it starts still leave room for
    rounds (`fits`), else its first MATERIAL_SHOWN_CHARS, with read_material among the tools to read
    the rest (and the material, and how much was shown, recorded for a resume). Material of any size
    never makes a request too big; what is shown does not grow with the budget, so the budget check's
    advice holds."""
    whole = prompts.render_task_with_material(task, material)
    if fits(whole):
        return whole
    registry["read_material"] = material_reader(material, settings.max_result_chars - PAGE_MARGIN_CHARS)
    start_fields["material"], start_fields["material_shown"] = material, prompts.material_shown(
        material, MATERIAL_SHOWN_CHARS)
    return prompts.render_task_with_material(task, material, shown_chars=MATERIAL_SHOWN_CHARS)


if __name__ == "__main__":
    sys.modules.setdefault("agent_demo", sys.modules[__name__])  # one module, whichever way it was started
    from agent_demo_kit.cli import main
    sys.exit(main())
