"""Long runs at constant cost: append-only requests, compaction in large steps, recall, cached tokens."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import responses as responses_lib

from agent_demo_kit import conversation as context
from agent_demo_kit.cli import main
from agent_demo_kit import prompts
from agent_demo_kit.records import Call, Round
from agent_demo_kit.settings import Settings
from agent_demo_kit.trace_file import TraceFile
from scripted_model import run
from agent_demo_kit.client import ModelClient, RequestForm
from agent_demo_kit.records import Reply
from agent_demo_kit.replies import AttemptFailed
from conftest import run_cli, start_cli
from scripted_model import ScriptedModel
from scripted_server import ScriptedServer, action as act
from agent_demo_kit.tools import REGISTRY, registry_of

ROOT = Path(__file__).resolve().parent.parent


def sums(count, think="", start=0):
    """Replies computing n + 1 for n in start..start+count-1, each a distinct call."""
    return [f"<think>{think}</think>" + act("calculator", expression=f"{n} + 1") for n in range(start, start + count)]


def play(model, registry=REGISTRY, log=None, **settings):
    return run("keep adding", Settings(**{"max_rounds": 50, "max_context": 24_000, **settings}), model, registry=registry, log=log)


class Recorder(ScriptedModel):
    """A scripted model that keeps each request as the JSON of its body, exactly as the client would
    send it (cheaper than deep copies)."""

    def __init__(self, *replies, **kwargs):
        super().__init__(*replies, **kwargs)
        self.bodies = []

    def attempt(self, body):
        self.bodies.append(json.dumps(body))
        self.requests.append(body)  # not copied: read only right away
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        if isinstance(reply, BaseException):
            raise reply
        return reply if isinstance(reply, Reply) else Reply(content=reply, usage=self.usage)


def messages_json(body):
    return json.dumps(json.loads(body)["messages"])


def compactions(bodies):
    """Indexes of the requests that do not start with the whole previous request."""
    texts = [messages_json(body) for body in bodies]
    return [i for i in range(1, len(texts)) if not texts[i].startswith(texts[i - 1][:-1])]


# --- append-only between compactions -----------------------------------------------------

def test_between_compactions_each_request_starts_with_the_whole_previous_one():
    model = Recorder(*sums(199, think="t" * 2000), act("finish", result="done"))
    outcome = play(model, max_rounds=200)
    assert (outcome.status, outcome.rounds) == ("finished", 200)
    broken = compactions(model.bodies)
    assert 1 <= len(broken) <= 6, "a compaction holds for dozens of rounds"
    system = json.loads(model.bodies[0])["messages"][0]
    for index in broken:  # a compaction keeps the system prompt and the task, and rewrites what follows
        messages = json.loads(model.bodies[index])["messages"]
        assert messages[0] == system and messages[1]["content"].startswith("Task: keep adding\n\nEarlier rounds")


def test_a_compaction_brings_the_request_to_about_half_the_budget():
    model = Recorder(*sums(199, think="t" * 2000), act("finish", result="done"))
    play(model, max_rounds=200)
    sizes = [len(body) for body in model.bodies]
    bare = sizes[0]  # the system prompt and the task alone
    assert max(sizes) <= 24_000
    assert len(compactions(model.bodies)) >= 3, "200 rounds of long think blocks fold again and again"
    for index in compactions(model.bodies):
        assert sizes[index - 1] + 400 > 24_000 - 2000, "it waited until the budget was nearly spent"
        assert 24_000 * 0.4 < sizes[index] <= bare + (24_000 - bare) // 2


def native(count, start=0):
    """The same calls as sums(), as tools-mode replies."""
    return [Reply(content="<think>t</think>", tool_calls=[{"id": f"c{n}", "type": "function", "function": {
        "name": "calculator", "arguments": json.dumps({"expression": f"{n} + 1"})}}]) for n in range(start, start + count)]


@pytest.mark.parametrize("mode", ["json", "schema", "tools"])
def test_no_request_passes_the_budget_over_a_long_run_and_the_prefix_holds(mode):
    calls = native(399) if mode == "tools" else sums(399, think="t" * 500)
    model = Recorder(*calls, act("finish", result="done"))
    run("keep adding", Settings(model="m" * 200, max_rounds=400, max_context=11_000, mode=mode), model)
    sizes = [len(body) for body in model.bodies]
    assert len(sizes) == 400 and max(sizes) <= 11_000
    texts = [messages_json(body) for body in model.bodies]
    kept = [len(a) - 1 if b.startswith(a[:-1]) else 0 for a, b in zip(texts, texts[1:])]
    assert sum(kept) / sum(map(len, texts[1:])) > 0.85


def test_a_full_digest_leaves_out_old_rounds_in_large_steps_and_otherwise_only_grows():
    model = Recorder(*sums(400), act("finish", result="done"))
    play(model, max_rounds=401, max_context=10_000)
    digests = [json.loads(model.bodies[i])["messages"][1]["content"] for i in compactions(model.bodies)]
    assert "rounds 1-" in digests[-1] and "are not shown" in digests[-1]
    grew = sum(1 for before, after in zip(digests, digests[1:]) if after.startswith(before))
    assert grew >= 0.6 * (len(digests) - 1), "most compactions keep the whole digest before them"


class SizeWatcher(Recorder):
    """Keeps, for each request, the conversation's running size and the size of the body sent."""

    def __init__(self, *replies, **kwargs):
        super().__init__(*replies, **kwargs)
        self.sizes = []

    def ask(self, request, tools, stop=None):
        answer = super().ask(request, tools, stop)
        self.sizes.append((request.__self__.size, len(self.bodies[-1])))
        return answer


@pytest.mark.parametrize("mode", ["json", "tools"])
def test_the_running_size_is_the_size_of_the_body_as_sent(mode):
    lookups = [Reply(content="", tool_calls=[{"id": f"o{n}", "type": "function", "function": {
        "name": "get_order_status", "arguments": json.dumps({"order_id": f"A100{n % 3 + 1}"})}}])
        for n in range(3)] if mode == "tools" else [act("get_order_status", order_id=f"A100{n}") for n in (1, 2, 3)]
    model = SizeWatcher(*lookups, *(native(60) if mode == "tools" else sums(60)), act("finish", result="done"))
    play(model, max_rounds=64, max_context=9000, mode=mode)
    assert len(compactions(model.bodies)) >= 3 and "\\u5f85" in model.bodies[3], "folded, non-ASCII and all"
    assert [size for size, _ in model.sizes] == [actual for _, actual in model.sizes]


def test_a_fallback_to_json_after_compactions_keeps_the_digest_and_the_budget():
    rejected = AttemptFailed("HTTP 400", 400, '{"error": {"message": "tools are not supported"}}')
    model = Recorder(*native(40), rejected, *sums(10, start=40), act("finish", result="done"))
    outcome = play(model, max_rounds=60, max_context=9000, mode="tools")
    assert outcome.status == "finished"
    after = json.loads(model.bodies[41])
    assert "tools" not in after and max(len(body) for body in model.bodies) <= 9000
    assert "Earlier rounds" in after["messages"][1]["content"]
    assert [m["role"] for m in after["messages"]][2:4] == ["assistant", "user"], "tool turns re-sent as text"
    assert messages_json(model.bodies[42]).startswith(messages_json(model.bodies[41])[:-1])


def test_think_blocks_stay_out_and_turns_alternate_after_compactions():
    model = Recorder(*sums(120, think="secret reasoning " * 20), act("finish", result="done"))
    play(model, max_rounds=121, max_context=6000)
    for body in model.bodies:
        messages = json.loads(body)["messages"]
        assert "secret reasoning" not in body
        roles = [m["role"] for m in messages]
        assert roles[:2] == ["system", "user"] and roles[2:] == ["assistant", "user"] * ((len(roles) - 2) // 2)
        assert messages[1]["content"].startswith("Task: keep adding")


# --- recall --------------------------------------------------------------------------------

def test_recall_gets_back_a_round_the_digest_no_longer_shows():
    replies = sums(150) + [act("recall", first_round=1, last_round=2), act("finish", result="done")]
    model = Recorder(*replies)
    outcome = play(model, max_rounds=160, max_context=5000)
    assert outcome.status == "finished"
    before = json.loads(model.bodies[150])["messages"]
    digest = before[1]["content"]
    assert "round 1:" not in digest and "round 2:" not in json.dumps(before)
    assert "are not shown" in digest and "recall" in digest
    answer = json.loads(json.loads(model.bodies[151])["messages"][-1]["content"].split("\n", 1)[1])
    assert answer["tool"] == "recall" and answer["result"]["ok"] is True
    assert answer["result"]["data"]["rounds"] == [
        {"round": 1, "calls": [{"tool": "calculator", "args": {"expression": "0 + 1"}, "result": {"ok": True, "data": 1}}]},
        {"round": 2, "calls": [{"tool": "calculator", "args": {"expression": "1 + 1"}, "result": {"ok": True, "data": 2}}]}]


def test_recall_of_a_round_not_yet_done_says_so():
    model = ScriptedModel(act("calculator", expression="1 + 1"), act("recall", first_round=5),
                          act("finish", result=2))
    play(model)
    fed = json.loads(model.messages(2)[-1]["content"].split("\n", 1)[1])["result"]
    assert fed["ok"] is False and "round 5 has not happened yet" in fed["error"]
    assert "rounds 1-1" not in fed["error"] and "this is round 2" in fed["error"]


def test_recall_answers_are_cut_to_the_result_size_and_say_what_did_not_fit():
    def blob(n: int) -> str:
        """A long result."""
        return f"<{n}>" + "x" * 700
    registry = {**REGISTRY, **registry_of(blob)}
    replies = [act("blob", n=n) for n in range(1, 6)] + [act("recall", first_round=1, last_round=5),
                                                         act("finish", result="ok")]
    model = ScriptedModel(*replies)
    play(model, registry=registry, max_result_chars=2000)
    line = json.loads(model.messages(6)[-1]["content"].split("\n", 1)[1])
    assert len(json.dumps(line["result"], ensure_ascii=False)) <= 2000
    rounds = line["result"]["data"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    assert "rounds 3-5 did not fit" in line["result"]["data"]["not_shown"]


def test_recall_is_never_refused_as_a_repeated_call():
    replies = [act("calculator", expression="1 + 1")] + [act("recall", first_round=1)] * 4 + [act("finish", result=2)]
    outcome = play(ScriptedModel(*replies))
    assert (outcome.status, outcome.rounds) == ("finished", 6)
    assert all(call["result"]["ok"] for call in outcome.calls)


@pytest.mark.parametrize("mode", ["json", "schema", "tools"])
def test_recall_is_described_in_every_mode_even_with_an_allowlist(serve, mode):
    server = serve([act("finish", result="x")])
    assert main(["--tools", "calculator", "--mode", mode, "--quiet", "hi"]) == 0
    body = server.requests[0]["body"]
    if mode == "tools":
        assert "recall" in [tool["function"]["name"] for tool in body["tools"]]
    else:
        assert "- recall: " in body["messages"][0]["content"]
    if mode == "schema":
        calls, ending = body["response_format"]["json_schema"]["schema"]["properties"]["actions"]["anyOf"]
        assert ["recall"] in [branch["properties"]["tool"]["enum"] for branch in calls["items"]["anyOf"]]


# --- cached tokens ----------------------------------------------------------------------------

@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105, "prompt_tokens_details": {"cached_tokens": 64}},
    {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105, "prompt_cache_hit_tokens": 64,
     "prompt_cache_miss_tokens": 36},
], ids=["openai", "deepseek"])
def test_cached_prompt_tokens_are_counted_per_round_and_in_the_run(serve, tmp_path, capsys, usage):
    trace = tmp_path / "run.jsonl"
    serve([{"content": act("calculator", expression="1 + 1"), "usage": usage},
           {"content": act("finish", result=2), "usage": usage}])
    assert main(["--json", "--trace", str(trace), "hi"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["usage"] == {"prompt_tokens": 200, "completion_tokens": 10, "total_tokens": 210,
                                        "cached_tokens": 128}
    rounds = [json.loads(line) for line in trace.read_text().splitlines() if '"event": "round"' in line]
    assert [r["usage"]["cached_tokens"] for r in rounds] == [64, 64]
    assert "210 tokens (128 cached)" in err


def test_no_cached_tokens_are_claimed_when_the_endpoint_reports_none():
    outcome = play(ScriptedModel(act("finish", result=1), usage={"prompt_tokens": 3, "completion_tokens": 2,
                                                                  "total_tokens": 5}))
    assert (outcome.status, outcome.usage) == ("finished", {"prompt_tokens": 3, "completion_tokens": 2,
                                                            "total_tokens": 5})


# --- resume after compactions -------------------------------------------------------------------

@pytest.mark.parametrize("stop_at", ["at_the_compaction", "after_it"])
def test_resume_after_a_compaction_sends_the_interrupted_request_byte_for_byte(serve, tmp_path, stop_at):
    trace = tmp_path / "run.jsonl"
    probe = Recorder(*sums(60))
    play(probe, max_rounds=60, max_context=5000)
    first = compactions(probe.bodies)[1] + 1  # 1-based number of a request that compacted (the second one)
    stop = first if stop_at == "at_the_compaction" else first + 3
    model = Recorder(*sums(stop - 1), KeyboardInterrupt())
    log = TraceFile(str(trace))
    assert play(model, log=log, max_rounds=60, max_context=5000).status == "interrupted"
    log.close()
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [e["before_round"] for e in events if e["event"] == "compaction"][-1] <= stop
    server = serve(sums(5, start=stop - 1) + [act("finish", result="done")], key=None)
    assert main(["--resume", str(trace), "--max-rounds", "60", "--max-context", "5000", "--quiet"]) == 0
    assert json.dumps(server.requests[0]["body"]) == model.bodies[-1], "the same bytes as the interrupted request"
    assert messages_json(json.dumps(server.requests[1]["body"])).startswith(
        messages_json(model.bodies[-1])[:-1]), "and the run goes on appending"


@pytest.mark.processes
def test_kill_9_in_the_request_right_after_a_compaction_then_resume_sends_it_again(tmp_path):
    probe = Recorder(*sums(40))
    play(probe, max_rounds=40, max_context=5000)
    stop = compactions(probe.bodies)[1]  # 0-based index of a request that compacted (the second one)
    replies = sums(stop) + [{"delay": 60, "content": "never answered"}] + sums(3, start=stop) + [
        act("finish", result="done")]
    trace = tmp_path / "run.jsonl"
    with ScriptedServer(replies) as server:
        env = {"LLM_API_URL": server.url}
        process = start_cli("--trace", trace, "--max-rounds", "60", "--max-context", "5000", "x", env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while len(server.requests) <= stop and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        code, out, _ = run_cli("--resume", trace, "--max-context", "5000", "--quiet", env=env)
    assert (code, out) == (0, "done\n")
    interrupted, redone = server.requests[stop]["body"], server.requests[stop + 1]["body"]
    assert json.dumps(redone) == json.dumps(interrupted), "the same bytes, digest and all"
    assert "Earlier rounds" in interrupted["messages"][1]["content"]


def test_a_trace_without_compaction_records_still_resumes_within_the_budget(serve, tmp_path):
    trace = tmp_path / "run.jsonl"
    log = TraceFile(str(trace))
    play(Recorder(*sums(40), KeyboardInterrupt()), log=log, max_context=5000)
    log.close()
    kept = [line for line in trace.read_text().splitlines() if '"event": "compaction"' not in line]
    trace.write_text("\n".join(kept) + "\n")
    server = serve([act("finish", result="done")], key=None)
    assert main(["--resume", str(trace), "--max-context", "5000", "--quiet"]) == 0
    assert len(json.dumps(server.requests[0]["body"])) <= 5000


@pytest.mark.parametrize("stream, cap_field", [(False, "max_tokens"), (True, "max_tokens"),
                                               (False, "max_completion_tokens")])
@responses_lib.activate
def test_the_running_size_counts_what_the_client_sends_streaming_included(stream, cap_field):
    url = "http://127.0.0.1:9/v1/chat/completions"
    responses_lib.post(url, json={"choices": [{"message": {"content": "x"}}]})
    settings = Settings(url=url)
    client = ModelClient(settings, form=RequestForm(mode="json", stream=stream, reply_cap_field=cap_field))
    conversation = context.Conversation("add things up", settings, REGISTRY, client)
    client.ask(conversation.messages, conversation.tools)
    assert conversation.size == len(responses_lib.calls[-1].request.body)  # after a local server's window is asked


def recorded_rounds():
    """Three rounds as a run records them: a call, a reply with no action, a long result."""
    return [Round(1, "", [Call("calculator", {"expression": "1 + 1"}, {"ok": True, "data": 2})], []),
            Round(2, "hm", [], [], problem="no JSON object found"),
            Round(3, "", [Call("blob", {"text": "y" * 500}, {"ok": True, "data": "x" * 3000})], [])]


@pytest.mark.parametrize("first, last, said", [
    (0, 0, {"ok": False, "error": "first_round must be at least 1"}),
    (3, 2, {"ok": False, "error": "last_round 2 comes before first_round 3; give 0 or a later round"}),
    (2, 0, {"ok": True, "data": {"rounds": [{"round": 2, "no_action": "no JSON object found"}]}}),
    (1, 9, {"ok": True, "data": {"rounds": [
        {"round": 1, "calls": [{"tool": "calculator", "args": {"expression": "1 + 1"}, "result": {"ok": True,
                                                                                                "data": 2}}]},
        {"round": 2, "no_action": "no JSON object found"}], "not_yet": "rounds after 3 have not happened yet",
        "not_shown": "round 3 did not fit; recall it alone"}}),
])
def test_recall_says_what_it_cannot_give_back(first, last, said):
    assert context.recall_rounds(recorded_rounds(), 1000, first, last) == said


def test_a_round_recalled_alone_is_cut_to_fit():
    [entry] = context.recall_rounds(recorded_rounds(), 1000, 3)["data"]["rounds"]
    [call] = entry["calls"]
    assert call["result"]["truncated"] and call["args"].startswith('{"text": "yyy') and len(json.dumps(entry)) < 1000


@pytest.mark.parametrize("text, said", [
    ("   ", {"ok": False, "error": prompts.NOTE_EMPTY}),
    ("x" * 300, {"ok": False, "error": "a note takes at most 200 characters and this one has 313; keep only what"
                                        " matters"}),
    ("A1002 is unpaid", {"ok": True, "data": prompts.NOTE_KNOWN}),
])
def test_a_note_that_is_empty_too_long_or_known_is_said_so(text, said):
    notes = context.Notes(200)
    assert notes.add(1, "A1002 is unpaid")["ok"]
    assert notes.add(2, text) == said
