"""OpenTelemetry (the otel extra): a run's spans in memory, then through a real OTLP/HTTP receiver on
loopback from the command line, SIGTERM included; and nothing of it without the extra or the setting."""
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import agent_demo
from agent_demo_kit.cli import main
from conftest import KEY, ROOT, child_environment, start_cli
from scripted_server import ScriptedServer, action as act
from test_escalation import ByModel

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="pip install 'agent-demo[otel]'")


@pytest.fixture
def spans(monkeypatch):
    """The spans a run makes, kept in memory (the SDK's own exporter) instead of sent."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from agent_demo_kit import telemetry
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "provider", lambda endpoint: provider)
    return exporter


def every_text(span):
    return json.dumps([span.name, dict(span.attributes), [[event.name, dict(event.attributes)] for event in span.events],
                       span.status.description])


@pytest.mark.parametrize("mode", ["json", "tools"])
def test_a_two_round_run_with_one_tool_call_is_one_agent_span_two_chats_and_one_tool(spans, serve, mode):
    calculator = act("calculator", expression="2 + 3") if mode == "json" else {"content": None, "tool_calls": [
        {"id": "call-1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 + 3"}'}}]}
    serve([calculator, act("finish", result=f"5, and the key is {KEY}")])
    result = agent_demo.run("add", mode=mode, otel="http://127.0.0.1:4318")
    assert result.status == "finished"
    done = spans.get_finished_spans()
    [agent] = [span for span in done if span.name == "invoke_agent agent-demo"]
    chats = [span for span in done if span.name == "chat gpt-4o-mini"]
    [tool] = [span for span in done if span.name == "execute_tool calculator"]
    assert len(done) == 4 and len(chats) == 2
    assert agent.parent is None and all(span.parent.span_id == agent.context.span_id for span in [*chats, tool])
    assert all(span.context.trace_id == agent.context.trace_id for span in done)
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent" and agent.attributes["gen_ai.request.model"] == \
        "gpt-4o-mini" and agent.attributes["gen_ai.usage.input_tokens"] == 20
    first = chats[0].attributes
    assert (first["gen_ai.operation.name"], first["gen_ai.request.model"], first["gen_ai.usage.input_tokens"],
            first["gen_ai.usage.output_tokens"], first["server.address"]) == ("chat", "gpt-4o-mini", 10, 5, "127.0.0.1")
    assert first["gen_ai.response.finish_reasons"] == ("stop",), "as the endpoint said"
    assert (tool.attributes["gen_ai.operation.name"], tool.attributes["gen_ai.tool.name"]) == ("execute_tool",
                                                                                               "calculator")
    assert tool.attributes.get("gen_ai.tool.call.id") is None, "the endpoint's text: only with content"
    assert not any("gen_ai.output.messages" in span.attributes for span in done), "no content unless asked"
    assert all(KEY not in every_text(span) for span in done)


def test_contents_only_when_the_convention_says_so_and_redacted_then(spans, serve, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    serve([act("calculator", expression="2 + 3"), act("finish", result=f"the key is {KEY}")])
    agent_demo.run("add", otel="http://127.0.0.1:4318")
    done = spans.get_finished_spans()
    chat = [span for span in done if span.name.startswith("chat")][-1]
    assert "[redacted]" in chat.attributes["gen_ai.output.messages"]
    assert all(KEY not in every_text(span) for span in done)
    [tool] = [span for span in done if span.name.startswith("execute_tool")]
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"expression": "2 + 3"}


def test_with_capture_off_a_span_holds_configured_names_and_figures_only(spans, serve):
    words = ["MADE_UP_TOOL_NAME", "SECRET_ARGUMENT_TEXT", "ENDPOINT_OWN_TEXT", "ODD_FINISH_REASON", "CALL_ID_TEXT"]
    serve([act("MADE_UP_TOOL_NAME", x="1"),
           {"content": None, "finish_reason": "ODD_FINISH_REASON", "tool_calls": [
               {"id": "CALL_ID_TEXT", "type": "function", "function": {"name": "calculator", "arguments":
                                                                        '{"expression": "SECRET_ARGUMENT_TEXT"}'}}]},
           {"status": 400, "body": {"error": {"message": "ENDPOINT_OWN_TEXT: request refused"}}}])
    assert agent_demo.run("add", otel="http://127.0.0.1:4318").status == "error"
    done = spans.get_finished_spans()
    names = sorted(span.name for span in done)
    assert "execute_tool unknown_tool" in names and "execute_tool calculator" in names, names
    leaked = [(word, span.name) for span in done for word in words if word in every_text(span)]
    assert leaked == [], "text of the model, a tool or the endpoint in a span with capture off"


@pytest.mark.parametrize("counts", [
    {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cached_tokens": "ENDPOINT_OWN_TEXT"},
    {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "prompt_tokens_details": {
        "cached_tokens": "ENDPOINT_OWN_TEXT"}, "prompt_cache_hit_tokens": ["ENDPOINT_OWN_TEXT"]},
    {"prompt_tokens": "ENDPOINT_OWN_TEXT", "completion_tokens": 5, "total_tokens": 15},
])
def test_with_capture_off_a_chat_spans_token_counts_are_figures_the_endpoint_cannot_put_words_in(spans, serve,
                                                                                                   counts):
    serve([{"content": act("note", text="remember this"), "usage": counts},
           {"content": act("finish", result="5"), "usage": counts}])
    assert agent_demo.run("add", otel="http://127.0.0.1:4318").status == "finished"
    done = spans.get_finished_spans()
    leaked = [span.name for span in done if "ENDPOINT_OWN_TEXT" in every_text(span)]
    assert leaked == [], "the endpoint's words in a span's token counts, with capture off"
    for span in done:
        for name, value in span.attributes.items():
            if name.startswith("gen_ai.usage."):
                assert isinstance(value, int) and not isinstance(value, bool), (span.name, name, value)


def test_a_note_or_recall_span_is_named_for_the_action_not_as_an_unknown_tool(spans, serve):
    serve([act("note", text="remember this"), act("recall", first_round=1), act("finish", result="5")])
    assert agent_demo.run("add", otel="http://127.0.0.1:4318").status == "finished"
    names = [span.name for span in spans.get_finished_spans()]
    assert "execute_tool note" in names and "execute_tool recall" in names, names


def test_an_escalation_is_an_event_and_an_endpoint_error_an_error_type(spans, serve):
    missing = {"status": 404, "body": {"error": {"message": "model 'small' not found"}}}
    serve([], screen=ByModel(small=[missing], big=[act("finish", result="5")]))
    assert agent_demo.run("add", model="small", escalate="big", otel="http://127.0.0.1:4318").status == "finished"
    [agent] = [span for span in spans.get_finished_spans() if span.name.startswith("invoke_agent")]
    [event] = agent.events
    assert (event.name, event.attributes["agent_demo.to_model"]) == ("agent_demo.escalation", "big")
    failed = [span for span in spans.get_finished_spans() if span.name == "chat small"]
    assert failed and failed[0].attributes["error.type"] == "EndpointError"
    spans.clear()
    serve([{"status": 401, "body": {"error": {"message": f"bad key {KEY}"}}}])
    assert agent_demo.run("add", otel="http://127.0.0.1:4318").status == "error"
    [agent] = [span for span in spans.get_finished_spans() if span.name.startswith("invoke_agent")]
    assert agent.attributes["error.type"] == "EndpointError" and agent.status.status_code.name == "ERROR"
    assert all(KEY not in every_text(span) for span in spans.get_finished_spans())


def test_without_the_extra_the_variable_changes_nothing_and_the_flag_is_a_usage_error(serve, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "agent_demo_kit.telemetry", None)  # as if the SDK were not installed
    serve([act("finish", result="5")])
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert main(["--no-log", "-q", "add"]) == 0
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    assert main(["--no-log", "--otel", "http://127.0.0.1:4318", "add"]) == 2
    assert "--otel needs the OpenTelemetry SDK: pip install 'agent-demo[otel]'" in capsys.readouterr().err


@pytest.mark.processes
def test_without_the_setting_no_opentelemetry_module_is_imported(serve):
    server = serve([act("finish", result="5")])
    code = ("import sys, agent_demo; agent_demo.run('add', url=%r);"
            " print(sorted({m.split('.')[0] for m in sys.modules if m.startswith('opentelemetry')}))" % server.url)
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                           env=child_environment())
    assert shown.stdout.strip() == "[]", shown.stderr


class Receiver:
    """An OTLP/HTTP receiver on loopback: the spans of each export request it gets, decoded."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        self.spans, self.got = [], threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        receiver.spans.extend(scope.spans)
                receiver.path = self.path
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                receiver.got.set()

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def attributes(self, span):
        return {item.key: (item.value.string_value or item.value.int_value) for item in span.attributes}


@pytest.mark.processes
def test_the_command_line_sends_its_spans_to_a_receiver_and_flushes_them_on_sigterm(tmp_path):
    receiver = Receiver()
    with ScriptedServer([act("calculator", expression="2 + 3"), act("finish", result="5")]) as model:
        shown = subprocess.run([sys.executable, os.path.join(ROOT, "agent_demo.py"), "--no-log", "-q", "--otel", receiver.url,
                                "add"], capture_output=True, text=True, env=child_environment(
                                    {"LLM_API_URL": model.url, "LLM_API_KEY": KEY}), timeout=60)
    assert (shown.returncode, shown.stdout) == (0, "5\n"), shown.stderr
    assert receiver.path == "/v1/traces"
    assert sorted(span.name for span in receiver.spans) == ["chat gpt-4o-mini", "chat gpt-4o-mini",
                                                            "execute_tool calculator", "invoke_agent agent-demo"]
    receiver.spans.clear()
    arrived = threading.Event()

    def slow(body):
        arrived.set()
        return {"content": act("finish", result="5"), "delay": 30}
    with ScriptedServer([], screen=slow) as model:
        process = start_cli("--no-log", "--otel", receiver.url, "add", new_interpreter=True,
                            env={"LLM_API_URL": model.url, "LLM_API_KEY": KEY})
        assert arrived.wait(30)
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert process.returncode == 143
    [agent] = [span for span in receiver.spans if span.name.startswith("invoke_agent")]
    assert receiver.attributes(agent)["agent_demo.status"] == "interrupted"
    [chat] = [span for span in receiver.spans if span.name.startswith("chat")]
    assert receiver.attributes(chat)["error.type"] in ("SigTerm", "interrupted")


def test_spans_after_an_escalation_name_the_stronger_models_own_server(spans, serve):
    missing = {"status": 404, "body": {"error": {"message": "model 'small' not found"}}}
    first = serve([missing])
    with ScriptedServer([act("finish", result="5")]) as strong:
        assert agent_demo.run("add", model="small", escalate="big", escalate_url=strong.url,
                              otel="http://127.0.0.1:4318").status == "finished"
    [chat] = [span for span in spans.get_finished_spans() if span.name == "chat big"]
    assert chat.attributes["server.port"] == int(strong.url.split(":")[2].split("/")[0]) != \
        int(first.url.split(":")[2].split("/")[0])


class Hostile:
    """An OTLP endpoint that takes the spans and then answers without end: an endless body as fast as it
    can, or one byte at a time. It counts what it sent, and notes when the reader hung up."""

    def __init__(self, how):
        self.sent, self.hung_up, self.stop = 0, threading.Event(), threading.Event()
        hostile = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(2 << 30))  # 2 GiB, it says
                self.end_headers()
                piece = b"x" * (65536 if how == "endless" else 1)
                try:
                    while not hostile.stop.is_set():
                        self.wfile.write(piece)
                        self.wfile.flush()
                        hostile.sent += len(piece)
                        if how == "dripping":
                            hostile.stop.wait(0.05)
                except OSError:
                    hostile.hung_up.set()

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.server.shutdown()


@pytest.mark.processes
@pytest.mark.parametrize("how", ["endless", "dripping"])
def test_an_otlp_endpoint_that_answers_without_end_costs_no_memory_and_does_not_hold_exit(how):
    hostile = Hostile(how)
    try:
        with ScriptedServer([act("calculator", expression="2 + 3"), act("finish", result="5")]) as model:
            process = start_cli("--no-log", "-q", "--otel", hostile.url, "add", new_interpreter=True,
                                env={"LLM_API_URL": model.url, "LLM_API_KEY": KEY})
            try:
                out, err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
                pytest.fail(f"agent-demo was still reading the {how} answer after 60 s")
        assert (process.returncode, out) == (0, "5\n"), err
        assert hostile.hung_up.wait(30), "agent-demo hung up on the answer"
        assert hostile.sent < 16 << 20, f"it read {hostile.sent:,} bytes of an answer that says nothing"
        if how == "dripping":  # a byte each 0.05 s: 200 bytes is 10 s of dripping, three times the deadline
            assert hostile.sent < 200, f"exit waited for {hostile.sent} bytes of a dripping answer"
    finally:
        hostile.close()


class RawCollector:
    """An OTLP endpoint on a bare socket, for answers http.server cannot give. It reads each export
    request whole, then answers as `how` says: with a status line or a header that drips a byte each
    0.05 s, an endless run of "100 Continue", a body that drips, or a refusal whose reason and body
    hold escape sequences. It counts what it sent after the head, notes when the reader hung up (or
    stopped reading), and gives up on its own after `most_seconds` (gave_up: the reader waited for it that long)."""

    HEADS = {"status line": b"HTTP/1.1 200 ",
             "headers": b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nX-Slow: ",
             "dripping body": b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 2147483648"
                              b"\r\n\r\n"}
    WORDS = b"\x1b]0;OWNED\x07\x1b[2J"

    def __init__(self, how, most_seconds=20.0):
        self.how, self.most_seconds = how, most_seconds
        self.sent, self.requests = 0, 0
        self.hung_up, self.gave_up, self.stop = threading.Event(), threading.Event(), threading.Event()
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listening.getsockname()[1]}"
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.stop.is_set():
            try:
                connection, _ = self.listening.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(connection,), daemon=True).start()

    def answer(self, connection):
        with connection:
            head = b""
            while b"\r\n\r\n" not in head:
                piece = connection.recv(65536)
                if not piece:
                    return
                head += piece
            head, body = head.split(b"\r\n\r\n", 1)
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
            while len(body) < length:
                body += connection.recv(65536)
            self.requests += 1
            connection.settimeout(5)  # a send that waits that long: the reader stopped reading
            try:
                self.send(connection)
            except OSError:
                self.hung_up.set()

    def send(self, connection):
        if self.how == "words":
            said = self.WORDS + b"refused"
            connection.sendall(b"HTTP/1.1 400 " + self.WORDS + b"Bad\r\nContent-Type: text/plain\r\nConnection: close"
                               b"\r\nContent-Length: " + str(len(said)).encode() + b"\r\n\r\n" + said)
            return
        connection.sendall(self.HEADS.get(self.how, b""))
        until = time.monotonic() + self.most_seconds
        while not self.stop.is_set():
            if time.monotonic() > until:
                self.gave_up.set()
                return
            if self.how == "endless 100 continue":
                connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" * 64)
                self.sent += 64
                continue
            connection.sendall(b"x")
            self.sent += 1
            self.stop.wait(0.05)

    def close(self):
        self.stop.set()
        self.listening.close()


@pytest.mark.processes
@pytest.mark.parametrize("how", ["status line", "headers", "endless 100 continue"])
def test_an_otlp_endpoint_that_drips_its_status_line_or_headers_does_not_hold_exit(how):
    collector = RawCollector(how, most_seconds=20)  # the SDK itself waits 30 s for its exports at exit
    try:
        with ScriptedServer([act("calculator", expression="2 + 3"), act("finish", result="5")]) as model:
            process = start_cli("--no-log", "-q", "--otel", collector.url, "add", new_interpreter=True,
                                env={"LLM_API_URL": model.url, "LLM_API_KEY": KEY})
            try:
                out, err = process.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
                pytest.fail(f"agent-demo was still reading the answer's {how} after 90 s")
        assert (process.returncode, out) == (0, "5\n"), err
        assert collector.requests >= 1, "the spans were sent"
        assert not collector.gave_up.is_set(), f"exit waited until the collector gave up its {how} after 20 s"
        assert collector.hung_up.wait(30), "agent-demo hung up on the answer"
    finally:
        collector.close()


EXIT_SCRIPT = """
import sys
from agent_demo_kit import telemetry
tracer = telemetry.provider(sys.argv[1]).get_tracer("many")
for number in range(10000):
    tracer.start_span(f"span {number}").end()
print("made", flush=True)
"""


@pytest.mark.processes
def test_exit_waits_a_few_seconds_for_spans_however_many_batches_are_left():
    collector = RawCollector("dripping body", most_seconds=120)
    try:
        process = subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT, collector.url], cwd=ROOT, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_environment(
                                       {"PYTHONPATH": ROOT, "OTEL_BSP_MAX_QUEUE_SIZE": "20000"}))
        assert process.stdout.readline() == "made\n"  # twenty batches wait; each export is answered by a drip
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            pytest.fail("exit waited more than 20 s for the spans of a collector that drips")
        assert collector.requests >= 1
    finally:
        collector.close()


@pytest.mark.processes
def test_an_otlp_endpoints_own_words_reach_the_terminal_inert():
    collector = RawCollector("words")
    try:
        with ScriptedServer([act("finish", result="5")]) as model:
            shown = subprocess.run([sys.executable, os.path.join(ROOT, "agent_demo.py"), "--no-log", "-q", "--otel",
                                    collector.url, "add"], capture_output=True, text=True, timeout=60,
                                   env=child_environment({"LLM_API_URL": model.url, "LLM_API_KEY": KEY}))
        assert (shown.returncode, shown.stdout) == (0, "5\n"), shown.stderr
        assert collector.requests >= 1
        assert "\x1b" not in shown.stderr and "\x07" not in shown.stderr, shown.stderr
    finally:
        collector.close()


def test_with_spans_on_the_trace_file_still_holds_every_round_note_and_retry(spans, serve, tmp_path):
    serve([{"status": 500, "body": "down"}, "no action here", act("calculator", expression="2 + 3"),
           act("finish", result="5")])
    trace = tmp_path / "run.jsonl"
    assert agent_demo.run("add", otel="http://127.0.0.1:4318", trace=str(trace), retries=1).status == "finished"
    events = [json.loads(line)["event"] for line in trace.read_text().splitlines()]
    assert events == ["start", "retry", "round", "round", "round", "end"], "the spans and the file are both told"
    assert len(spans.get_finished_spans()) == 5
