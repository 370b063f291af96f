"""The model's window: learned from a local server, the whole input when it fits, never more than it holds."""
import json
import re

import pytest

from agent_demo_kit.client import ModelClient
from agent_demo_kit.windows import past_window, window_in
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
    said = "the server says it holds 3,000 tokens" if overflow == "500" else "the server cut it off and says no window"
    assert "seems past the model's window (" + said in err and "this one is folded to fit and sent again" in err
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


def counting_up(rounds, thinking=15):
    """Replies that add one a round, each with prose the conversation re-sends, then a finish."""
    prose = "I will add the next number, then look at the result, as planned. " * thinking
    return [prose + act("calculator", expression=f"{n} + 1") for n in range(rounds)] + [act("finish", result="done")]


@pytest.mark.parametrize("mode, overflow, limit, stream", [
    ("json", "cut", 2_048, True), ("schema", "cut", 2_048, True), ("tools", "500", 2_048, True),
    ("json", "500", 1_000, True), ("schema", "400", 2_048, True), ("json", "cut", 2_048, False),
])
def test_a_server_that_says_no_window_and_refuses_past_n_tokens_is_folded_to_fit_in_every_mode(
        cli, monkeypatch, mode, overflow, limit, stream):
    with ScriptedServer(counting_up(11), window_limit=limit, overflow=overflow) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--max-rounds", 20, "--mode", mode, *([] if stream else ["--no-stream"]), "count up")
        assert (code, out.strip()) == (0, "done"), err
        assert server.past_limit == 1, "one request past the window, then never again"
    [said] = [line for line in err.splitlines() if "seems past the model's window" in line]
    assert "this one is folded to fit and sent again; --max-context sets the budget" in said
    budget = int(re.search(r"requests are kept to ([\d,]+) characters", said)[1].replace(",", ""))
    later = [len(json.dumps(request["body"])) for request in server.requests[1:]][-8:]
    assert max(later) <= budget, "the note names the budget the requests now keep to"


def last_error(err):
    return next(line for line in reversed(err.strip().splitlines()) if line.startswith("agent-demo: error:"))


@pytest.mark.parametrize("overflow", ["500", "400"])
def test_a_task_past_the_window_a_server_names_is_not_sent_again_and_the_error_names_the_window(cli, monkeypatch,
                                                                                                 overflow):
    with ScriptedServer(counting_up(3), window_limit=600, overflow=overflow) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--max-rounds", 5, "add up " + "these figures carefully " * 40)
        assert server.past_limit == 1, "the same request is not sent again as it was"
    said = last_error(err)
    assert (code, out) == (3, "") and "model's window of 600 tokens, and even the task takes about" in said
    assert ("exceed context window of 600" if overflow == "500" else "maximum context length is 600 tokens") in said
    assert "--n_ctx" in said and "or a shorter task" in said


def test_a_request_still_past_the_window_after_the_fold_ends_at_once_naming_the_window(cli, monkeypatch):
    with ScriptedServer(counting_up(3), window_limit=780) as server:  # the task alone just fits
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--max-rounds", 5, "count up")
        assert server.past_limit == 2, "folded once, then not sent again as it was"
    said = last_error(err)
    assert (code, out) == (3, "") and "seems past the model's window" in said
    assert "folding the conversation did not make it fit" in said and "--max-context a smaller budget" in said
    assert "the stream ended before the reply was complete" in said and "which the server does not say" in said


def test_a_first_request_a_server_that_says_no_window_cuts_off_is_retried_and_the_error_says_why_it_may_be(
        cli, monkeypatch):
    with ScriptedServer(counting_up(3), window_limit=600) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--max-rounds", 5, "--retries", 1, "add up " + "these figures carefully " * 40)
        assert server.past_limit == 2, "a first request cut off may be an outage: retried"
    said = last_error(err)
    assert code == 3 and "the stream ended before the reply was complete (after 1 retries)" in said
    assert "a server that does not say its window may cut off a request past it" in said and "--max-context" in said


@pytest.mark.parametrize("status, said, grew, past, window", [
    (500, "Requested tokens (8334) exceed context window of 8192", True, True, 8_192),  # llama-cpp-python
    (400, "This model's maximum context length is 8192 tokens. However, you requested 8334 tokens (8334 in the"
          " messages, None in the completion).", False, True, 8_192),  # llama-cpp-python's handler, vLLM, OpenAI
    (400, "the request exceeds the available context size, try increasing it", True, True, None),  # llama.cpp
    (400, "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it", True,
     True, 8_192),
    (400, "The decoder prompt (length 9000) is longer than the maximum model length of 4096. Make sure that"
          " `max_model_len` is no smaller than the number of text tokens.", True, True, 4_096),  # vLLM
    (400, "Trying to keep the first 5000 tokens when context the overflows. However, the model is loaded with"
          " context length of only 4096 tokens, which is not enough.", True, True, 4_096),  # LM Studio
    (413, "Request Entity Too Large", True, True, None),  # a proxy's body limit
    (413, "Request Entity Too Large", False, False, None),  # no larger than one it took: not about the size
    (400, "prompt is 9000 tokens, too long", True, True, None),
    (500, "Internal Server Error", True, False, None),
    (400, "max_tokens must be at least 1", False, False, None),
    (None, "the reply stopped arriving: the server closed the connection without replying", True, True, None),
    (None, "the reply stopped arriving: the stream ended before the reply was complete", False, False, None),
])
def test_what_servers_say_of_a_request_past_the_window_is_read_with_the_window_it_names(status, said, grew, past,
                                                                                       window):
    assert past_window(status, said, guessed=True, grew=grew) == (past, window)


def test_a_window_a_server_named_in_an_error_holds_for_the_next_run_of_the_process(cli, monkeypatch):
    with ScriptedServer(counting_up(8), window_limit=2_048, overflow="500") as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        assert cli("--max-rounds", 12, "count up")[0] == 0
        server.restart()
        code, out, err = cli("--max-rounds", 12, "count up")
        assert (code, out.strip()) == (0, "done"), err
        assert server.past_limit == 1, "the second run kept to the window the first one was told"
