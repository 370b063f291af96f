"""Long tasks: token budget, what is re-sent each round, the loop watchdog."""
import json
import re

import pytest


from agent_demo_kit.cli import main
from agent_demo_kit.settings import Settings
from agent_demo_kit.trace_file import TraceFile
from scripted_model import run
from agent_demo_kit.records import json_size as request_size
from scripted_model import ScriptedModel
from scripted_server import action as act
from agent_demo_kit.tools import REGISTRY, registry_of


def sums(count, think=""):
    """Replies computing n + 1 for n in 0..count-1, each a distinct call."""
    return [f"<think>{think}</think>" + act("calculator", expression=f"{n} + 1") for n in range(count)]


def play(model, registry=REGISTRY, log=None, **settings):
    return run("keep adding", Settings(**{"max_rounds": 50, "max_context": 24_000, **settings}), model, registry=registry, log=log)


# --- token budget ---------------------------------------------------------------------

def test_token_budget_stops_before_the_next_request():
    model = ScriptedModel(*sums(10), usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    outcome = play(model, max_tokens=40)
    assert (outcome.status, outcome.rounds, outcome.exit_code) == ("budget", 3, 1)
    assert len(model.requests) == 3
    assert outcome.usage == {"prompt_tokens": 30, "completion_tokens": 15, "total_tokens": 45}


def test_missing_usage_is_estimated_from_characters_and_marked(tmp_path):
    trace = tmp_path / "t.jsonl"
    log = TraceFile(str(trace))
    model = ScriptedModel(act("finish", result="x" * 400), usage=None)
    outcome = play(model, log=log)
    log.close()
    record = [json.loads(line) for line in trace.read_text().splitlines()][1]
    expected_prompt = request_size(model.messages(0)) // 4
    assert record["usage_estimated"] is True
    assert record["usage"]["prompt_tokens"] == expected_prompt
    assert record["usage"]["completion_tokens"] == len(act("finish", result="x" * 400)) // 4
    assert outcome.usage["estimated"] is True
    assert outcome.usage["total_tokens"] == record["usage"]["total_tokens"]


def test_a_run_cut_short_ends_with_one_summary_line_and_how_to_continue(serve, capsys):
    serve(sums(10))  # the scripted server reports 15 tokens a request
    assert main(["--max-tokens", "30", "keep adding"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-3:-1] == ["", "=== not completed: token budget spent after 2 round(s), 30 tokens ==="]
    assert err[-1].startswith("agent-demo: to continue: ") and err[-1].endswith(" --max-tokens 60")
    assert sum("calculator(" in line for line in err) == 2, "each action once, as it ran: no second listing"


# --- what is re-sent ---------------------------------------------------------------------

def test_think_blocks_are_not_re_sent_but_the_goal_always_is():
    model = ScriptedModel(*sums(3, think="secret reasoning " * 10), act("finish", result="done"))
    play(model)
    last = model.messages(-1)
    assert last[0]["role"] == "system" and last[1]["content"] == "Task: keep adding"
    assistant_turns = [m["content"] for m in last if m["role"] == "assistant"]
    assert assistant_turns == [act("calculator", expression=f"{n} + 1") for n in range(3)]
    assert "secret reasoning" not in json.dumps(last)


def big_registry(size=10_000):
    def dump(name: str) -> str:
        """Return a big blob."""
        return "A" * (size // 2) + "MIDDLE" + "Z" * (size // 2)
    return {**REGISTRY, **registry_of(dump)}


def test_a_long_tool_result_is_cut_to_head_and_tail_with_a_marker():
    model = ScriptedModel(act("dump", name="x"), act("finish", result="ok"))
    play(model, registry=big_registry(), max_result_chars=1000)
    fed = json.loads(model.messages(1)[3]["content"].split("\n", 1)[1])["result"]
    assert fed["truncated"] is True and fed["original_chars"] == 10_006
    assert fed["data"].startswith("AAAA") and fed["data"].endswith("ZZZZ")
    assert "MIDDLE" not in fed["data"]
    dropped = int(re.search(r"\[truncated (\d+) chars\]", fed["data"])[1])
    kept = len(fed["data"]) - len(f" ...[truncated {dropped} chars]... ")
    assert dropped + kept == 10_006
    assert len(json.dumps(fed, ensure_ascii=False)) <= 1000, "the cap holds for the whole result"


def test_over_budget_the_oldest_rounds_fold_into_a_digest_and_the_newest_stay():
    model = ScriptedModel(*sums(20, think="x" * 2000), act("finish", result="done"))
    play(model, max_context=6000, max_result_chars=1000)
    last = model.messages(-1)
    digest = [m["content"] for m in last if "Earlier rounds" in m["content"]]
    assert len(digest) == 1 and digest[0].startswith("Task: keep adding\n\nEarlier rounds")
    roles = [m["role"] for m in last]
    turns = (len(roles) - 2) // 2
    assert turns >= 4 and roles == ["system", "user"] + ["assistant", "user"] * turns, "turns still alternate"
    assert "round 1: calculator(0 + 1) -> 1" in digest[0]
    assert f"round {20 - turns}: calculator({19 - turns} + 1) -> {20 - turns}" in digest[0]
    verbatim = [m["content"] for m in last if m["role"] == "assistant"]
    assert verbatim == [act("calculator", expression=f"{n} + 1") for n in range(20 - turns, 20)]
    assert request_size(last) <= 6000


def test_a_200_round_run_with_long_think_blocks_stays_under_budget_and_loses_no_result():
    model = ScriptedModel(*sums(199, think="t" * 2000), act("finish", result="done"))
    outcome = play(model, max_rounds=200, max_context=24_000)
    assert (outcome.status, outcome.rounds) == ("finished", 200)
    sizes = [request_size(request["messages"]) for request in model.requests]
    assert max(sizes) <= 24_000
    final = "\n".join(message["content"] for message in model.messages(-1))
    for n in range(199):
        folded = f"calculator({n} + 1) -> {n + 1}"
        verbatim = f'"args": {{"expression": "{n} + 1"}}, "result": {{"ok": true, "data": {n + 1}}}'
        assert folded in final or verbatim in final


def test_a_budget_too_small_for_the_task_is_a_configuration_error():
    outcome = run("x" * 20_000, Settings(max_context=24_000), ScriptedModel(act("finish", result=1)))
    assert (outcome.status, outcome.exit_code) == ("error", 2)
    assert "--max-context 24000 is too small" in outcome.error


# --- the watchdog -------------------------------------------------------------------------

def counting_registry(calls):
    def count(n: float) -> int:
        """Count."""
        calls.append(n)
        return len(calls)
    return {**REGISTRY, **registry_of(count)}


def test_a_repeated_call_is_cached_then_refused_then_stuck(tmp_path):
    calls, trace = [], tmp_path / "t.jsonl"
    log = TraceFile(str(trace))
    model = ScriptedModel('{"tool": "count", "args": {"n": 1}}')
    outcome = play(model, registry=counting_registry(calls), log=log)
    log.close()
    assert (outcome.status, outcome.rounds, outcome.exit_code) == ("stuck", 4, 1)
    assert calls == [1], "the tool ran once"
    second, third = model.messages(2)[-1]["content"], model.messages(3)[-1]["content"]
    assert '"result": {"ok": true, "data": 1}' in second and "already made this exact call in round 1" in second
    assert "refused: this exact call was already made in rounds 1, 2" in third
    rounds = [json.loads(line) for line in trace.read_text().splitlines() if '"round"' in line][:4]
    assert [r["calls"][0].get("watchdog") for r in rounds] == [None, "cached", "refused", "stuck"]
    assert json.loads(trace.read_text().splitlines()[-1])["status"] == "stuck"


def test_calls_are_identical_whatever_the_order_of_their_arguments():
    calls = []
    def pair(a: float, b: float) -> None:
        """Pair."""
        calls.append((a, b))
    registry = {**counting_registry(calls), **registry_of(pair)}
    model = ScriptedModel('{"tool": "pair", "args": {"a": 1, "b": 2}}',
                          '{"tool": "pair", "args": {"b": 2, "a": 1}}', act("finish", result=1))
    play(model, registry=registry)
    assert calls == [(1, 2)]


def test_three_format_errors_in_a_row_end_the_run_as_stuck():
    model = ScriptedModel('{"answer": 1}', "", '{"tool": 7}', act("finish", result=1))
    outcome = play(model)
    assert (outcome.status, outcome.rounds, outcome.exit_code) == ("stuck", 3, 1)


def test_format_errors_that_are_not_in_a_row_are_tolerated():
    model = ScriptedModel("", "{}", act("calculator", expression="1 + 1"), "", "{}", act("finish", result=2))
    assert play(model).status == "finished"


def test_stuck_shows_in_the_json_output(serve, capsys):
    serve([act("calculator", expression="1 + 1")])
    assert main(["--json", "--max-rounds", "9", "loop"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["rounds"]) == ("stuck", 4)


def test_a_truncated_error_keeps_its_other_fields():
    from agent_demo_kit.conversation import truncate_result
    result = {"ok": False, "error": "x" * 5000, "available_tools": ["calculator", "finish"]}
    cut = truncate_result(result, 1000)
    assert cut["available_tools"] == ["calculator", "finish"] and cut["truncated"] is True
    assert len(json.dumps(cut)) <= 1000


def test_one_huge_argument_does_not_wipe_the_earlier_rounds():
    replies = [act("calculator", expression=f"{n} + 1") for n in range(9)]
    replies += [act("calculator", expression="1" * 30_000)] + [act("calculator", expression=f"{n} + 2") for n in range(5)]
    model = ScriptedModel(*replies, act("finish", result="done"))
    play(model)
    last = "\n".join(message["content"] for message in model.messages(-1))
    for n in range(9):
        assert f"calculator({n} + 1) -> {n + 1}" in last or f'"expression": "{n} + 1"' in last
    assert "not shown" not in last and "1" * 1000 not in last
    verbatim = [m["content"] for m in model.messages(-1) if m["role"] == "assistant"]
    assert verbatim == [act("calculator", expression=f"{n} + 2") for n in range(5)], "the rounds after it"


@pytest.mark.parametrize("streaming", ["--no-stream", "--stream"])
def test_whole_request_bodies_stay_under_the_budget_schema_and_model_name_included(serve, monkeypatch, streaming):
    server = serve(sums(60, think="t" * 2000) + [act("finish", result="done")])
    monkeypatch.setenv("LLM_MODEL", "m" * 300)
    assert main(["--mode", "schema", "--max-rounds", "61", "--max-context", "16000", "--quiet", streaming, "x"]) == 0
    sizes = [len(json.dumps(request["body"])) for request in server.requests]
    assert max(sizes) <= 16_000 and max(sizes) > 15_000


def test_folded_results_keep_their_full_length_while_they_fit():
    def blob(n: float) -> str:
        """A long result."""
        return f"<{n}>" + "x" * 1500 + f"</{n}>"
    prose = "Let me explain my plan at length. " * 90  # kept verbatim, dropped when folded
    replies = [prose + json.dumps({"tool": "blob", "args": {"n": n}}) for n in range(10)]
    model = ScriptedModel(*replies, act("finish", result="ok"))
    play(model, registry={**REGISTRY, **registry_of(blob)}, max_context=40_000, keep_recent=1)
    last = model.messages(-1)
    assert "Earlier rounds" in last[1]["content"], "the run was folded"
    assert "[truncated" not in json.dumps(last)
    assert request_size(last) <= 40_000


def test_how_many_rounds_a_compaction_keeps_verbatim_can_be_set():
    def verbatim_after_each_compaction(keep_recent):
        model = ScriptedModel(*sums(60), act("finish", result="done"))
        play(model, max_rounds=61, max_context=6000, keep_recent=keep_recent)
        texts = [json.dumps(request["messages"]) for request in model.requests]
        return [sum(1 for m in model.messages(i) if m["role"] == "assistant")
                for i in range(1, len(texts)) if not texts[i].startswith(texts[i - 1][:-1])]
    assert min(verbatim_after_each_compaction(4)) == 4
    assert min(verbatim_after_each_compaction(1)) < 4, "fewer verbatim rounds leave the digest more room"
