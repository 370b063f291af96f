import json
import socket
import time
import types

import pytest
import requests
import responses

from agent_demo_kit.cli import main
from agent_demo_kit.client import ModelClient
from agent_demo_kit.endpoint_errors import server_message
from agent_demo_kit.replies import CUTOFFS, read_stream
from agent_demo_kit.endings import EndpointError
from agent_demo_kit.settings import Settings
from agent_demo_kit.limits import MIN_LIMIT_TOKENS, REPLY_CHARS_A_TOKEN
from scripted_server import ScriptedServer, action as act
from conftest import KEY

URL = "https://llm.example.test/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def body(content="ok", **message_extra):
    return {"choices": [{"message": {"role": "assistant", "content": content, **message_extra}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def client(**overrides):
    settings = Settings(**{"url": "https://llm.example.test/v1", "model": "m1", "api_key": "sk-test-secret",
                           "retries": 2, "backoff_factor": 0, "stream": False, **overrides})
    return ModelClient(settings)


def ask(asker: ModelClient, messages=MESSAGES):
    """One request through the client's whole loop (retries, form changes), offering no tools; the reply."""
    return asker.ask(lambda: messages, {})[0]


def endpoint_error(**overrides) -> str:
    """The message of the EndpointError one request raises."""
    with pytest.raises(EndpointError) as raised:
        ask(client(**overrides))
    return str(raised.value)


@responses.activate
def test_request_carries_model_messages_and_bearer_key():
    responses.post(URL, json=body("hello"))
    reply = ask(client())
    assert reply.content == "hello"
    assert reply.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    sent = responses.calls[0].request
    assert json.loads(sent.body) == {"model": "m1", "messages": MESSAGES, "max_tokens": 4096}
    assert sent.headers["Authorization"] == "Bearer sk-test-secret"


@responses.activate
def test_no_key_sends_no_authorization_header():
    responses.post("http://127.0.0.1:8080/v1/chat/completions", json=body())
    ask(ModelClient(Settings(url="http://127.0.0.1:8080/v1")))
    assert "Authorization" not in responses.calls[0].request.headers


@responses.activate
def test_429_and_5xx_are_retried_then_answered():
    responses.post(URL, status=429, headers={"Retry-After": "0"}, json={"error": {"message": "slow down"}})
    responses.post(URL, status=503, body="upstream busy")
    responses.post(URL, json=body("finally"))
    assert ask(client()).content == "finally"
    assert len(responses.calls) == 3


@responses.activate
def test_retries_spent_report_the_status_and_the_server_message():
    responses.post(URL, status=429, json={"error": {"message": "Rate limit reached for m1"}})
    assert endpoint_error() == "HTTP 429 after 2 retries: Rate limit reached for m1"
    assert len(responses.calls) == 3


@pytest.mark.parametrize("status, expected", [
    (400, "request rejected (HTTP 400): bad thing"),
    (401, "authentication failed (HTTP 401): bad thing - check LLM_API_KEY"),
    (403, "authentication failed (HTTP 403): bad thing - check LLM_API_KEY"),
    (404, "not found (HTTP 404): bad thing - check LLM_MODEL (m1) and LLM_API_URL"),
])
@responses.activate
def test_client_errors_are_not_retried_and_quote_the_server(status, expected):
    responses.post(URL, status=status, json={"error": {"message": "bad thing", "type": "x"}})
    assert endpoint_error() == expected
    assert len(responses.calls) == 1


@responses.activate
def test_timeouts_become_an_endpoint_error_naming_the_timeout():
    responses.post(URL, body=requests.exceptions.ReadTimeout("Read timed out."))
    assert "no reply within 7 s" in endpoint_error(timeout=7)


@pytest.mark.parametrize("payload, problem", [
    ("<html>502 Bad Gateway</html>", "reply is an HTML page, not JSON: 502 Bad Gateway"),
    ("", "reply is not JSON: (empty body)"),
    (json.dumps({"object": "list"}), "reply has no choices"),
    (json.dumps({"error": {"message": "model overloaded"}}), "reply has no choices: model overloaded"),
    (json.dumps({"choices": []}), "reply has no choices"),
    (json.dumps({"choices": [{"index": 0}]}), "has no message"),
    (json.dumps({"choices": [{"message": {"content": None, "tool_calls": 5}}]}), "tool_calls that are not a list"),
    (json.dumps([1, 2]), "reply has no choices"),
])
@responses.activate
def test_unusable_bodies_are_endpoint_errors(payload, problem):
    responses.post(URL, body=payload, status=200)
    assert problem in endpoint_error()


@responses.activate
def test_extra_fields_and_missing_usage_are_fine():
    payload = body("{}", reasoning_content="long thoughts")
    del payload["usage"]
    payload["system_fingerprint"] = "fp"
    responses.post(URL, json=payload)
    reply = ask(client())
    assert reply.content == "{}" and reply.usage is None


@responses.activate
def test_native_tool_calls_with_empty_content_are_kept():
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
    responses.post(URL, json=body(None, tool_calls=[call]))
    assert ask(client()).tool_calls == [call]


class Retries:
    """A trace that keeps what the client says about each retry."""

    def __init__(self):
        self.said = []

    def retry(self, cause, attempt, retries, wait):
        self.said.append((cause, attempt, retries, wait))


@responses.activate
def test_retry_after_is_waited_for_up_to_its_cap_and_each_retry_is_told():
    responses.post(URL, status=429, headers={"Retry-After": "3600"}, json={"error": {"message": "slow down"}})
    responses.post(URL, status=503, json={"error": {"message": "busy"}})
    responses.post(URL, json=body("fine"))
    trace = Retries()
    asker = ModelClient(Settings(url="https://llm.example.test/v1", retries=2, backoff_factor=0,
                                 max_retry_wait=0.01), trace)
    assert ask(asker).content == "fine"
    assert trace.said == [("HTTP 429", 1, 2, 0.01), ("HTTP 503", 2, 2, 0)]


@responses.activate
def test_a_long_multi_line_server_message_becomes_one_short_line():
    responses.post(URL, status=400, json={"error": {"message": "line one\n  line two\n" + "x" * 1000}})
    message = endpoint_error()
    assert "\n" not in message and message.startswith("request rejected (HTTP 400): line one line two xxx")
    assert len(message) < 400


@pytest.mark.parametrize("payload", ["[" * 100_000, '{"error": ' * 5000])
@pytest.mark.parametrize("status", [200, 401])
@responses.activate
def test_a_body_nested_too_deeply_is_an_endpoint_error(payload, status):
    responses.post(URL, body=payload, status=status)
    assert endpoint_error()


@responses.activate
def test_odd_content_shapes_are_read_safely():
    responses.post(URL, json=body([{"type": "text", "text": None}, {"type": "text", "text": "ok"}, "junk"]))
    assert ask(client()).content == "ok"


@responses.activate
def test_a_lone_surrogate_or_nan_in_a_reply_cannot_reach_the_output():
    call = {"id": 7, "type": "function", "function": {"name": "finish", "arguments": {"result": float("nan")}}}
    text = json.dumps(body("hi \ud800 there", tool_calls=[call]))
    assert "NaN" in text
    responses.post(URL, body=text)
    reply = ask(client())
    assert reply.content == "hi ? there"
    assert reply.tool_calls[0]["function"]["arguments"] == {"result": None}
    json.dumps(reply.tool_calls, allow_nan=False)


# llama-cpp-python 0.3's answer to response_format json_schema, as it comes (HTTP 500).
LLAMA_CPP_PYTHON_REJECTION = {"error": {
    "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg':"
               " \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected':"
               " \"'text' or 'json_object'\"}}\n\n  File \"/opt/venv/lib/python3.11/site-packages/llama_cpp/server/"
               "app.py\", line 376, in create_chat_completion\n    POST /v1/chat/completions",
    "type": "internal_server_error", "param": None, "code": None}}


@pytest.mark.parametrize("payload, said", [
    (LLAMA_CPP_PYTHON_REJECTION, "response_format.type: Input should be 'text' or 'json_object'"),
    ({"detail": [{"type": "missing", "loc": ["body", "messages", 0, "content"], "msg": "Field required",
                  "input": {}}, {"type": "x", "loc": ["body", "model"], "msg": "Input should be a valid string"}]},
     "messages.0.content: Field required; model: Input should be a valid string"),
    ({"error": {"message": "Traceback (most recent call last):\n  File \"/srv/app/server.py\", line 12, in handle\n"
                           "    check(body)\nValueError: n_ctx exceeded"}}, "ValueError: n_ctx exceeded"),
    ({"error": {"message": "failed in /usr/lib/python3/dist-packages/app/handlers.py: bad input"}},
     "failed in handlers.py: bad input"),
])
@responses.activate
def test_a_server_message_loses_framework_dumps_and_file_paths(payload, said):
    responses.post(URL, status=400, json=payload)
    assert endpoint_error().startswith(f"request rejected (HTTP 400): {said}")  # and the window, when it names one


@pytest.mark.parametrize("payload", ["'loc': (" * 50_000, "/a/" + "a" * 200_000, "File \"" * 100_000])
def test_cleaning_a_hostile_error_body_takes_no_time(payload):
    started = time.monotonic()
    server_message(payload)
    assert time.monotonic() - started < 10  # backtracking would take minutes


@responses.activate
def test_a_500_refusing_response_format_is_not_retried_and_says_it_was_refused():
    responses.post(URL, status=500, json=LLAMA_CPP_PYTHON_REJECTION)
    with pytest.raises(EndpointError) as raised:
        ask(client())
    assert str(raised.value) == ("request rejected (HTTP 500): response_format.type:"
                                 " Input should be 'text' or 'json_object'")
    assert raised.value.http_status == 500 and len(responses.calls) == 1


@responses.activate
def test_a_500_about_something_else_is_retried_even_with_response_format():
    responses.post(URL, status=500, json={"error": {"message": "out of memory"}})
    responses.post(URL, json=body("fine"))
    assert ask(client()).content == "fine"
    assert len(responses.calls) == 2


@responses.activate
def test_the_reply_cap_moves_to_max_completion_tokens_once_when_the_endpoint_asks():
    responses.post(URL, status=400, json={"error": {
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model."
                   " Use 'max_completion_tokens' instead.", "param": "max_tokens"}})
    responses.post(URL, json=body("one"))
    responses.post(URL, json=body("two"))
    settings = Settings(url="https://llm.example.test/v1", model="m1", max_reply_tokens=64)
    asker = ModelClient(settings)
    assert [ask(asker).content, ask(asker).content] == ["one", "two"]
    assert asker.form.reply_cap_field == "max_completion_tokens"
    sent = [json.loads(call.request.body) for call in responses.calls]
    assert [("max_tokens" in b, b.get("max_completion_tokens")) for b in sent] == [
        (True, None), (False, 64), (False, 64)]


@responses.activate
def test_a_reply_cut_off_keeps_its_finish_reason():
    payload = body("{\"tool\": \"calc")
    payload["choices"][0]["finish_reason"] = "length"
    responses.post(URL, json=payload)
    assert ask(client()).finish_reason == "length"


@pytest.mark.parametrize("url, local", [("http://localhost:8080/v1", True), ("http://gpu-box.local/v1", True),
                                        ("http://10.0.0.5:8000/v1", True), ("http://[::1]:8000/v1", True),
                                        ("https://api.example.com/v1", False), ("http://8.8.8.8/v1", False)])
def test_a_local_endpoint_is_told_apart_from_a_hosted_one(url, local):
    from agent_demo_kit.client import is_local
    assert is_local(url) is local


@responses.activate
def test_a_retry_after_that_is_not_a_number_falls_back_to_the_backoff():
    responses.post(URL, status=429, headers={"Retry-After": "soon"}, json={"error": {"message": "slow down"}})
    responses.post(URL, json=body("fine"))
    trace = Retries()
    asker = ModelClient(Settings(url="https://llm.example.test/v1", retries=1, backoff_factor=0), trace)
    assert ask(asker).content == "fine"
    assert trace.said == [("HTTP 429", 1, 1, 0)]


@pytest.mark.parametrize("error, said", [
    (requests.exceptions.ConnectTimeout("timed out"), "cannot reach https://llm.example.test/v1/chat/completions:"
                                                      " no connection within 10 s"),
    (requests.exceptions.ChunkedEncodingError("broken"), "the reply stopped arriving from https://llm.example.test/v1/"
                                                         "chat/completions: the connection broke mid-reply"),
    (requests.exceptions.ConnectionError("Failed to resolve: [Errno -2] Name or service not known"),
     "cannot reach https://llm.example.test/v1/chat/completions: host name not found"),
    (requests.exceptions.ConnectionError("<urllib3.connection.HTTPSConnection object at 0x7f>: something odd"),
     "cannot reach https://llm.example.test/v1/chat/completions: something odd"),
    (requests.exceptions.InvalidHeader("bad header"), "request to https://llm.example.test/v1/chat/completions"
                                                      " failed: InvalidHeader"),
])
@responses.activate
def test_each_network_failure_is_said_in_words(error, said):
    responses.post(URL, body=error)
    assert endpoint_error(retries=0) == said + " (after 0 retries)"


@responses.activate
def test_an_error_in_the_middle_of_a_stream_is_an_endpoint_error_with_its_message():
    stream = ('data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
              'data: {"error": {"message": "the model   crashed\\n mid-reply"}}\n\n')
    responses.post(URL, body=stream, content_type="text/event-stream")
    assert endpoint_error(stream=True, retries=0) == ("the endpoint reported an error mid-reply: the model crashed"
                                                      " mid-reply (after 0 retries)")


def test_tool_call_arguments_sent_whole_as_an_object_are_kept():
    stream = ('data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "calc",'
              ' "arguments": {"x": 1}}}]}, "finish_reason": "tool_calls"}]}\n\ndata: [DONE]\n\n')
    reply = read_stream(iter([stream.encode()]))
    assert reply.tool_calls[0]["function"]["arguments"] == {"x": 1}


@pytest.mark.parametrize("page, said", [
    ("<!DOCTYPE html><html><head><title>501 Not Implemented</title></head><body><h1>Not Implemented</h1>"
     + "<p>filler</p>" * 500 + "</body></html>", "501 Not Implemented"),
    ("<html><body><h1>Bad &amp; Gateway</h1><p>nginx</p></body></html>", "Bad & Gateway nginx"),
])
def test_an_html_error_page_is_said_by_its_title_or_its_words(page, said):
    assert server_message(page) == said


def test_an_html_page_without_a_title_is_said_by_its_first_words_without_its_code():
    said = server_message("<html><head><script>var x = 1;</script><style>p {}</style></head><body>"
                          + "details " * 100 + "</body></html>")
    assert said.startswith("details details") and "var x" not in said and "{}" not in said and len(said) < 260


@pytest.mark.parametrize("url, hint", [
    ("http://localhost:11434", "; its path has no /v1, which most servers want (Ollama's among them): try"
                               " http://localhost:11434/v1"),
    ("http://localhost:11434/v1", ""),
])
@responses.activate
def test_a_404_from_a_url_without_v1_says_to_try_it(url, hint):
    responses.post(url.rstrip("/") + "/chat/completions", status=404, body="404 page not found")
    said = endpoint_error(url=url)
    assert said == ("not found (HTTP 404): 404 page not found - check LLM_MODEL (m1) and LLM_API_URL" + hint)


# --- bounded by the reply, not only by silence ----------------------------------------------------

def test_a_stream_of_keep_alives_ends_at_the_reply_deadline_and_is_not_sent_again(serve, capsys):
    server = serve([{"content": "Thinking", "keep_alive": 0.05}], key=None)
    assert main(["--timeout", "0.2", "--reply-deadline", "0.4", "x"]) == 3  # the default retries: not sent again
    assert len(server.requests) == 1, "not held for ever, nor once per retry"
    assert "the reply did not end within --reply-deadline 0.4 s (its server kept sending" in capsys.readouterr().err


@pytest.mark.parametrize("how", [{}, {"close": True}, {"size_line": True}, {"close": True, "size_line": True}],
                         ids=["kept-alive", "Connection: close", "its size line", "its size line, Connection: close"])
def test_a_piece_that_drips_a_byte_at_a_time_ends_at_the_reply_deadline(serve, capsys, how):
    # Each byte comes well within --timeout, inside one chunk the server announced whole (or its size).
    server = serve([{"content": "x", "drip": 0.02, **how}], key=None)
    assert main(["--timeout", "0.2", "--reply-deadline", "0.4", "x"]) == 3
    assert len(server.requests) == 1 and server.hang_ups(1) == 1, "cut at its deadline, not when the server gave up"
    assert "the reply did not end within --reply-deadline 0.4 s (its server kept sending" in capsys.readouterr().err


@pytest.mark.parametrize("after_done", [{"linger": 0.02}, {"linger": 0.02, "drip": True},
                                        {"linger": 0.02, "drip": True, "close": True}],
                         ids=["keep-alives", "a chunk that drips", "a chunk that drips, Connection: close"])
def test_a_complete_reply_whose_stream_lingers_after_done_is_used_and_its_connection_dropped(serve, capsys, after_done):
    server = serve([{"content": act("finish", result="done"), **after_done}], key=None)
    assert main(["--timeout", "0.2", "x"]) == 0, capsys.readouterr().err
    assert server.hang_ups(1) == 1, "the run went on without waiting for the stream's end"
    assert "done" in capsys.readouterr().out


def test_the_deadlines_of_replies_read_whole_are_let_go_and_cut_no_connection(serve, capsys):
    server = serve([act("calculator", expression=f"{n} + 1") for n in range(30)] + [act("finish", result="ok")],
                   key=None)
    assert main(["--max-rounds", "40", "x"]) == 0, capsys.readouterr().err
    with CUTOFFS._lock:
        kept = [entry for entry in CUTOFFS._due if entry[3] is not None]
        waiting = len(CUTOFFS._due)
    assert kept == [] and waiting <= 2, "31 replies read: none still watched, none piling up"
    assert server.connections == 1


def test_a_connection_whose_socket_has_no_shutdown_of_its_own_is_cut_through_the_one_it_wraps():
    # HTTPS inside an HTTPS proxy: urllib3's SSLTransport has no shutdown, the socket under it has.
    mine, theirs = socket.socketpair()
    theirs.settimeout(10)
    wrapped = types.SimpleNamespace(socket=mine)
    response = types.SimpleNamespace(raw=types.SimpleNamespace(connection=types.SimpleNamespace(sock=wrapped)))
    with CUTOFFS.at(response, time.monotonic()) as watched:
        assert watched and theirs.recv(1) == b"", "cut: the other end sees the connection end"
    mine.close(), theirs.close()
    held = types.SimpleNamespace(socket=None)  # nothing to shut: the watcher goes on for the others
    response.raw.connection.sock = held
    with CUTOFFS.at(response, time.monotonic()):
        mine, theirs = socket.socketpair()
        theirs.settimeout(10)
        response2 = types.SimpleNamespace(raw=types.SimpleNamespace(connection=types.SimpleNamespace(sock=mine)))
        with CUTOFFS.at(response2, time.monotonic()):
            assert theirs.recv(1) == b""
    mine.close(), theirs.close()


def test_keep_alives_while_a_local_server_reads_a_long_prompt_keep_the_reply_alive_past_the_timeout(serve, capsys):
    server = serve([{"content": act("finish", result="done"), "pings": 6, "ping_every": 0.1}], key=None)
    assert main(["--timeout", "0.25", "x"]) == 0, capsys.readouterr().err  # 0.6 s of pings
    assert len(server.requests) == 1


def test_an_endless_reply_is_cut_past_its_cap_and_read_as_cut_off(serve, capsys):
    server = serve([{"content": "I will never stop. " * 300, "endless": True}, act("finish", result="done")], key=None)
    assert main(["--max-reply-tokens", "100", "x"]) == 0
    err = capsys.readouterr().err
    most = MIN_LIMIT_TOKENS * REPLY_CHARS_A_TOKEN
    assert f"the reply was not read to its end: all after its first {most:,} characters were left unread" in err
    assert len(server.requests) == 2 and "cut off" in server.sent_messages(1)[-1]["content"]


def events_of(calls: int, indexed: bool = False) -> list:
    """A streamed reply of this many tool calls, each in two pieces, in 64 KB chunks."""
    def chunk(delta):
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}) + "\n\n"
    text = "".join(chunk({"tool_calls": [{**({"index": n} if indexed else {}), "id": f"c{n}", "function": {
        "name": "calculator", "arguments": '{"expression": '}}]}) + chunk({"tool_calls": [{**({"index": n} if indexed else {}),
                                                                       "function": {"arguments": f'"{n} + 1"}}'}}]})
        for n in range(calls)) + 'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}\n\n'
    data = text.encode()
    return [data[start:start + 65536] for start in range(0, len(data), 65536)]


def cpu_seconds(work) -> float:
    """The least CPU time of two tries: the machines are shared, and CPU time counts only ours."""
    times = []
    for _ in range(2):
        started = time.process_time()
        work()
        times.append(time.process_time() - started)
    return min(times)


def test_reading_a_reply_s_calls_is_linear_in_their_number_and_stops_past_the_cap():
    small, large = events_of(1_000), events_of(10_000)
    assert len(read_stream(iter(large)).tool_calls) == 10_000
    ratio = cpu_seconds(lambda: read_stream(iter(large))) / cpu_seconds(lambda: read_stream(iter(small)))
    assert ratio < 25, f"ten times the calls took {ratio:.0f} times as long"  # quadratic: about 100
    capped = read_stream(iter(events_of(2_000, indexed=True)), max_calls=8)
    assert (len(capped.tool_calls), capped.unread) == (9, "its calls after the first 9")
    assert capped.tool_calls[-1]["function"]["arguments"] == '{"expression": "8 + 1"}'


def test_one_long_event_line_costs_about_what_parsing_it_costs():
    data = (b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"x" * (16 << 20)
            + b'"}, "finish_reason": "stop"}]}\n\n')
    chunks = [data[start:start + 65536] for start in range(0, len(data), 65536)]
    assert len(read_stream(iter(chunks)).content) == 16 << 20
    text = data[len(b"data: "):].decode()
    ratio = cpu_seconds(lambda: read_stream(iter(chunks))) / cpu_seconds(lambda: json.loads(text))
    assert ratio < 10, f"reading a 16 MB line took {ratio:.0f} times what parsing it takes"  # joined anew each piece: 50+


def test_an_event_line_longer_than_any_reply_is_not_kept_and_the_reply_is_read_as_cut_off():
    def long_line():  # as a gzip bomb would be, but it ends, so that a reader that keeps it all fails
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "'
        for _ in range(256):
            yield b"x" * 65536
        yield b'"}, "finish_reason": "stop"}]}\n\n'
    reply = read_stream(long_line(), max_chars=100_000)
    assert (reply.finish_reason, reply.content) == ("length", "")
    assert reply.unread == "an event of more than 800,000 bytes and all after it"


def test_the_environment_proxy_and_no_proxy_are_obeyed(cli, monkeypatch):
    """Read once a run (not on every request), the proxy settings still decide where requests go."""
    finish = act("finish", result="done")
    with ScriptedServer([finish]) as endpoint, ScriptedServer([finish]) as proxy:
        monkeypatch.setenv("LLM_API_URL", endpoint.url)
        monkeypatch.setenv("HTTP_PROXY", proxy.url.rsplit("/", 1)[0])
        assert cli("--no-log", "say done")[0] == 0
        assert proxy.requests[0]["path"] == endpoint.url + "/chat/completions" and not endpoint.requests
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert cli("--no-log", "say done")[0] == 0
        assert len(endpoint.requests) == 1 and len(proxy.requests) == 1


@pytest.mark.parametrize("overrides", [{}, {"max_reply_tokens": 0}, {"stream": True, "mode": "tools"}],
                         ids=["with a reply cap", "without one", "streamed, tools mode"])
@responses.activate
def test_the_body_is_made_once_and_sent_byte_for_byte_as_requests_would_send_json(overrides):
    from agent_demo_kit.tools import REGISTRY, in_use
    responses.post(URL, json=body())
    asker = client(**overrides)
    tools = in_use(REGISTRY) if overrides.get("mode") == "tools" else {}
    messages = [{"role": "user", "content": "non-ASCII: 待支付, a quote \" and a NaN-free 1.5"}]
    made = asker.body(messages, tools)
    asker.attempt(made) if not overrides.get("stream") else None
    expected = requests.Request("POST", URL, json=made).prepare()
    assert asker.encoded[1].encode("utf-8") == expected.body
    if not overrides.get("stream"):
        sent = responses.calls[0].request
        assert sent.body == expected.body and sent.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("change", ["a message edited in place", "another mode", "another tool"])
def test_a_body_made_again_is_the_same_only_while_what_it_is_made_of_is(change):
    from agent_demo_kit.tools import REGISTRY, in_use
    asker, tools = client(mode="tools"), in_use(REGISTRY)
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "task"}]
    first = asker.body(messages, tools)
    first_sent = asker.encoded[1]
    assert asker.body([dict(message) for message in messages], tools) is first, "made once for the same messages"
    if change == "a message edited in place":
        messages[1]["content"] = "another task"
    elif change == "another mode":
        asker.form.mode = "json"
    else:
        tools = {name: tool for name, tool in tools.items() if name == "calculator"}
    asker.body(messages, tools)
    assert asker.encoded[1].encode("utf-8") == requests.Request("POST", URL, json=asker.encoded[0]).prepare().body
    assert asker.encoded[1] != first_sent, "what is sent follows the change"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_to_another_host_is_not_followed_and_the_conversation_stays_here(cli, monkeypatch, status):
    with ScriptedServer([act("finish", result="elsewhere")]) as elsewhere:
        target = elsewhere.url + "/chat/completions?token=SECRETTOKEN123"
        with ScriptedServer([{"status": status, "headers": {"Location": target}, "body": ""}]) as endpoint:
            monkeypatch.setenv("LLM_API_URL", endpoint.url)
            monkeypatch.setenv("LLM_API_KEY", KEY)
            code, out, err = cli("--retries", "0", "a secret task")
        assert elsewhere.requests == [], "the conversation went to where the redirect pointed"
    assert code == 3 and f"HTTP {status}, a redirect to {elsewhere.url}/chat/completions?token=***" in err
    assert "SECRETTOKEN123" not in err


@pytest.mark.parametrize("status, points", [(300, True), (305, True), (302, False), (399, True)])
def test_any_3xx_is_an_endpoint_error_that_says_it_was_a_redirect_and_sends_nothing_on(cli, monkeypatch, status,
                                                                                         points):
    with ScriptedServer([act("finish", result="elsewhere")]) as elsewhere:
        headers = {"Location": elsewhere.url + "/chat/completions"} if points else {}
        with ScriptedServer([{"status": status, "headers": headers, "body": ""}]) as endpoint:
            monkeypatch.setenv("LLM_API_URL", endpoint.url)
            code, out, err = cli("--retries", "0", "a secret task")
        assert elsewhere.requests == [] and elsewhere.gets == 0
    said = f"HTTP {status}, a redirect to {elsewhere.url}/chat/completions" if points else \
        f"HTTP {status}, a redirect that names no address"
    assert code == 3 and said in err and "not JSON" not in err


def test_the_plain_question_after_a_bare_500_follows_no_redirect_to_another_port(cli, monkeypatch):
    with ScriptedServer([]) as elsewhere:
        elsewhere.get_answer = {"status": 500, "body": "Internal Server Error"}
        with ScriptedServer([{"status": 500, "body": "Internal Server Error"}]) as endpoint:
            endpoint.get_answer = {"status": 302, "headers": {"Location": elsewhere.url + "/models"}, "body": ""}
            monkeypatch.setenv("LLM_API_URL", endpoint.url)
            code, out, err = cli("--retries", "0", "a secret task")
            assert endpoint.gets >= 1, "the list of models was asked for"
        assert elsewhere.gets == 0 and elsewhere.requests == [], "a redirect was followed"
    assert code == 3 and "HTTP 500" in err and "to every request without a key" not in err
