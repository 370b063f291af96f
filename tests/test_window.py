"""The model's window: learned from a local server, the whole input when it fits, never more than it holds."""
import json

import pytest

from agent_demo_kit.client import ModelClient
from agent_demo_kit.windows import window_in
from agent_demo_kit.settings import Settings
from scripted_server import ScriptedServer, action as act


def lines_of(size):
    """About `size` characters of text, in numbered lines."""
    return "".join(f"line {n:07d} of the report\n" for n in range(size // 27))


def test_material_the_window_holds_is_sent_whole(serve, cli):
    material = lines_of(200_000)
    server = serve([act("finish", result="summed up")], key=None, window=131_072)
    code, out, err = cli("--quiet", "summarize", stdin=material)
    assert (code, out) == (0, "summed up\n") and "read_material" not in json.dumps(server.requests[0]["body"])
    assert material.strip("\n") in server.sent_messages(0)[1]["content"] and "the model read" not in err


def test_material_larger_than_the_window_is_paged_and_the_answer_says_how_much_was_read(serve, cli):
    material = lines_of(5_000_000)
    server = serve([act("read_material", offset=1_000_000), act("finish", result="partly read")], key=None,
                   window=131_072)
    code, out, err = cli("--json", "summarize", stdin=material)
    printed = json.loads(out)
    assert (code, printed["status"]) == (0, "finished")
    assert printed["material"]["chars"] == len(material) and 0 < printed["material"]["read_chars"] < 10_000
    assert err.splitlines()[-1] == "agent-demo: the model read under 0.1% of the 5.0 MB piped in"
    assert all(len(json.dumps(request["body"])) <= 131_072 * 3 for request in server.requests)


def test_a_small_window_is_never_overrun_by_a_request_and_its_reply_cap(serve, cli):
    prose = "Counting carefully, one step at a time. " * 40  # re-sent verbatim, unlike a think block
    replies = [prose + act("calculator", expression=f"{n} + 1") for n in range(40)]
    server = serve(replies + [act("finish", result="40")], key=None, window=8_192)
    code, _, err = cli("--max-rounds", "41", "--quiet", "count to 40")
    assert code == 0
    bodies = [request["body"] for request in server.requests]
    assert all(len(json.dumps(body)) / 3 + body.get("max_tokens", 0) <= 8_192 for body in bodies)
    assert max(len(json.dumps(body)) for body in bodies) > 10_000, "it grew to its budget and was folded"


def test_a_max_context_beyond_the_window_is_lowered_to_what_it_holds_beside_the_reply(serve, cli):
    replies = [act("calculator", expression="1" * 2_000 + f" + {n}") for n in range(12)]
    server = serve(replies + [act("finish", result="done")], key=None, window=8_192)
    code, out, err = cli("--max-context", "50000", "--max-rounds", "13", "x")
    assert code == 0
    assert "note: --max-context 50,000 is more than the model's window of 8,192 tokens holds: requests are kept" \
           " under 12,288 characters" in err
    bodies = [request["body"] for request in server.requests]
    assert all(len(json.dumps(body)) / 3 + body.get("max_tokens", 0) <= 8_192 for body in bodies)
    assert {body["max_tokens"] for body in bodies} == {4_096}, "a whole reply still fits"


def test_a_reply_cap_that_does_not_fit_beside_a_request_shrinks_and_says_so_once():
    notes = []
    client = ModelClient(Settings(url="http://127.0.0.1:9/v1", max_reply_tokens=4_096))
    client.windowing.learned = 8_192
    client.trace.note = notes.append
    assert client.reply_cap(3_000) == 4_096
    assert client.reply_cap(15_000) == 8_192 - (15_000 + 32) // 3 - 1 and client.reply_cap(16_000) < 2_900
    assert notes == ["the reply cap is 3,181 tokens, not 4,096: the request takes about 5,000 of the model's 8,192"]


@pytest.mark.parametrize("answer, window", [
    ({"default_generation_settings": {"n_ctx": 8192}}, 8192),  # llama.cpp's /props
    ({"data": [{"id": "other", "max_model_len": 4096}, {"id": "m", "max_model_len": 32768}]}, 32768),  # vLLM
    ({"parameters": "stop <eos>\nnum_ctx 16384", "model_info": {"llama.context_length": 131072}}, 16384),  # Ollama
    ({"model_info": {"gemma3.context_length": 32768}}, 32768),
    ({"n_ctx": -1}, None), ({"data": "nope"}, None), ([1, 2], None),
])
def test_each_servers_way_of_saying_its_window_is_read(answer, window):
    assert window_in(answer, "m") == window


def test_a_hosted_endpoint_is_not_asked_and_gets_the_documented_default():
    client = ModelClient(Settings(url="https://api.example.test/v1", max_context=None))
    assert client.window() == 128_000 and client.request_budget() == (128_000 - 4_096) * 3


@pytest.mark.parametrize("overflow", ["cut", "500"])
def test_a_server_that_says_no_window_and_cuts_a_request_past_it_gets_a_folded_conversation_and_the_run_finishes(
        cli, monkeypatch, overflow):
    thinking = "I will add the next number, then look at the result, as planned. " * 15
    replies = [thinking + act("calculator", expression=f"{n} + 1") for n in range(11)] + [act("finish", result="done")]
    with ScriptedServer(replies, window_limit=3_000, overflow=overflow) as server:  # says no window, holds 3,000
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--max-rounds", 20, "count up")
    assert (code, out.strip()) == (0, "done"), err
    assert server.past_limit == 1, "one request past the window, then folded to fit"
    said = "the server says it holds 3,000 tokens" if overflow == "500" else "the server cut it off or said so"
    assert "seems past the model's window (" + said in err and "the conversation is folded to fit" in err
    assert "--max-context sets the budget" in err


def test_a_local_server_that_says_no_window_is_held_to_a_small_one_and_the_first_fold_says_so(cli, monkeypatch):
    thinking = "I will add the next number, then look at the result, as planned. " * 30
    replies = [thinking + act("calculator", expression=f"{n} + 1") for n in range(9)] + [act("finish", result="done")]
    with ScriptedServer(replies) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--max-rounds", 20, "count up")
    assert code == 0, err
    assert err.count("the server does not say its model's window: requests are kept to what 8,192 tokens hold") == 1
    assert max(len(json.dumps(request["body"])) for request in server.requests) <= 12_288 + 100
