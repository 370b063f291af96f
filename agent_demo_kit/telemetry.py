"""OpenTelemetry (pip install 'agent-demo[otel]'; --otel URL or OTEL_EXPORTER_OTLP_ENDPOINT): each run
is an `invoke_agent` span, with a `chat {model}` span per request and an `execute_tool {name}` span
per tool call, carrying the GenAI semantic conventions' attributes. Imported only when a run asks
for it, so nothing else pays for it.

Spans are made from the run's own reports (records.RunEvents), passed on to the trace unchanged,
from values already redacted: no key reaches a span. Message contents are recorded only when
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT is true. Spans go out in batches and are flushed
at exit (Ctrl-C and SIGTERM end a run like any ending; a batch's second Ctrl-C flushes first),
each export request within EXPORT_SECONDS and exit within EXIT_SECONDS, whatever the collector does.

It imports records, prompts, tools, terminal, urls and the opentelemetry SDK.
"""
import atexit
import contextlib
import json
import logging
import socket
import threading
import time
from http.client import responses
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence
from urllib.parse import urlsplit

import requests
import urllib3
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Status, StatusCode

from agent_demo_kit.prompts import ENDINGS
from agent_demo_kit.records import Call, Reply, RunEvents, Working, is_count
from agent_demo_kit.tools import CONTROL_ACTIONS
from agent_demo_kit.terminal import inert
from agent_demo_kit.urls import display_url

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
UNKNOWN_TOOL = "unknown_tool"  # a span's name for a call of a tool the run does not have, with capture off
FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter", "function_call"}
_own: Optional[TracerProvider] = None
_exporter: Optional["BoundedExporter"] = None
_made = threading.Lock()
_log = logging.getLogger(__name__)


EXPORT_SECONDS = 3.0  # the longest one export request may take, from connecting to its answer's last byte
EXIT_SECONDS = 5.0  # the longest exit (or a flush before it) waits for the spans still to go, however many
COLLECTOR_REPLY_BYTES = 64 << 10  # what of a collector's answer is read: it says "ok" or why not, briefly


# --- each export request within its deadline ------------------------------------------------------

class _Request:
    """An export request under way: its deadline, and the connections it opened, to shut then."""

    def __init__(self, deadline: float) -> None:
        self.deadline, self.sockets, self.cut = deadline, [], False
        self.lock = threading.Lock()

    def opened(self, sock: Any) -> None:
        with self.lock:
            self.sockets.append(sock)
            if self.cut:
                _shut(sock)

    def shut(self) -> None:
        with self.lock:
            self.cut = True
            for sock in self.sockets:
                _shut(sock)


def _shut(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except Exception:  # noqa: BLE001 - closed already, or never connected: nothing to cut
        pass


_opening = threading.local()  # the export request this thread is making (its connections are cut with it)


class Deadlines:
    """The export requests under way, and one thread that shuts a request's connections once its
    deadline has passed: a socket's timeout limits each wait only, so a collector that drips its
    status line, its headers or its body, or says "100 Continue" without end, would hold a request
    (and exit) for as long as it likes. The thread starts with the exporter, not at exit, where
    Python 3.12 starts none."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.under_way: List[_Request] = []
        self.last_moment: Optional[float] = None  # set at exit: no request goes on past it
        self.watcher = self._watching()

    def _watching(self) -> threading.Thread:
        watcher = threading.Thread(target=self._watch, daemon=True, name="otlp-deadlines")
        watcher.start()
        return watcher

    @contextlib.contextmanager
    def request(self, seconds: float) -> Iterator[_Request]:
        """A request that has `seconds` (and no more than exit allows): its connections are cut after."""
        deadline = time.monotonic() + seconds
        under_way = _Request(deadline if self.last_moment is None else min(deadline, self.last_moment))
        with self.changed:
            if not self.watcher.is_alive():  # a forked child has no threads of its parent
                with contextlib.suppress(RuntimeError):  # none starts at exit: each wait is then timed alone
                    self.watcher = self._watching()
            self.under_way.append(under_way)
            self.changed.notify()
        _opening.request = under_way
        try:
            yield under_way
        finally:
            _opening.request = None
            with self.changed:
                self.under_way.remove(under_way)

    def close_by(self, moment: Optional[float]) -> None:
        """From now on no request goes on past `moment` (None: each has its own time again)."""
        with self.changed:
            self.last_moment = moment
            for under_way in self.under_way:
                under_way.deadline = min(under_way.deadline, moment) if moment is not None else under_way.deadline
            self.changed.notify()

    def past_last_moment(self) -> bool:
        return self.last_moment is not None and time.monotonic() >= self.last_moment

    def _watch(self) -> None:
        with self.changed:
            while True:
                now = time.monotonic()
                for under_way in self.under_way:
                    if not under_way.cut and under_way.deadline <= now:
                        under_way.shut()
                waits = [under_way.deadline - now for under_way in self.under_way if not under_way.cut]
                self.changed.wait(max(min(waits), 0.01) if waits else None)


class _CutAtDeadline:
    """A connection whose socket the export request under way in this thread shuts at its deadline."""

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        under_way = getattr(_opening, "request", None)
        if under_way is not None:
            under_way.opened(self.sock)  # type: ignore[attr-defined]


class _Connection(_CutAtDeadline, urllib3.connection.HTTPConnection):
    pass


class _TlsConnection(_CutAtDeadline, urllib3.connection.HTTPSConnection):
    pass


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _Connection


class _TlsPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TlsConnection


_POOLS = {"http": _Pool, "https": _TlsPool}


class _CutAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter, its connections made to be cut (through an HTTP proxy too)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):  # a SOCKS proxy's pools are its own: each wait is timed alone
            manager.pool_classes_by_scheme = _POOLS
        return manager


class BoundedSession(requests.Session):
    """The exporter's session: each request, from connecting to its answer's last byte, ends within
    EXPORT_SECONDS (and by the last moment exit allows), and COLLECTOR_REPLY_BYTES of the answer at
    most are read, like every answer agent-demo reads: a collector that drips or answers without end
    costs neither memory nor time (requests would read the whole body, as long as it keeps coming).
    What the collector says (its reason phrase, its body, an error quoting it) reaches the exporter's
    log lines inert."""

    def __init__(self) -> None:
        super().__init__()
        self.deadlines = Deadlines()
        for scheme in ("http://", "https://"):
            self.mount(scheme, _CutAdapter())

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:
        with self.deadlines.request(_seconds(kwargs.get("timeout"))) as under_way:
            left = under_way.deadline - time.monotonic()
            if left <= 0:  # not a connection error: the exporter tries no more
                raise requests.RequestException("no time was left to send the spans")
            kwargs.update(stream=True, allow_redirects=False, timeout=left,  # a redirect takes no spans elsewhere
                          headers={**(kwargs.get("headers") or {}), "Accept-Encoding": "identity"})
            try:
                response = super().request(method, url, *args, **kwargs)
                body = _read_capped(response, under_way)
            except requests.RequestException as error:
                raise _inert_error(error) from None
            finally:
                self.close()  # no connection is kept: the next request opens its own, cut at its own deadline
        response._content = body if response.ok else inert(body.decode("utf-8", "replace")).encode()
        response._content_consumed = True  # where requests keeps a body it has read
        response.reason = responses.get(response.status_code, "")  # the collector's own words stay out of the log
        return response


def _seconds(timeout: Any) -> float:
    """The exporter's timeout (seconds, or connect and read seconds) as a request's time, EXPORT_SECONDS at most."""
    if isinstance(timeout, tuple):
        timeout = max((each for each in timeout if isinstance(each, (int, float))), default=None)
    return min(float(timeout), EXPORT_SECONDS) if isinstance(timeout, (int, float)) else EXPORT_SECONDS


def _read_capped(response: requests.Response, under_way: _Request) -> bytes:
    """COLLECTOR_REPLY_BYTES of the answer at most, as sent (a gzip bomb stays a small body), until the deadline."""
    raw, kept = response.raw, bytearray()
    read = getattr(raw, "read1", None) or raw.read  # read1: what has arrived (urllib3 1.x has none)
    try:
        while len(kept) < COLLECTOR_REPLY_BYTES and time.monotonic() < under_way.deadline:
            piece = read(min(65536, COLLECTOR_REPLY_BYTES - len(kept)), decode_content=False)
            if not piece:
                break
            kept += piece
    except Exception:  # noqa: BLE001 - cut at the deadline, or broken: the status says whether the spans were taken
        pass
    finally:
        response.close()
    return bytes(kept)


def _inert_error(error: requests.RequestException) -> requests.RequestException:
    """The same kind of error (the exporter retries by its kind), in words that may quote the collector, inert."""
    try:
        return type(error)(inert(str(error)), request=error.request, response=error.response)
    except Exception:  # noqa: BLE001 - a kind made otherwise
        return requests.ConnectionError(inert(str(error)))


# --- the exporter, and exit ---------------------------------------------------------------------

class BoundedExporter(SpanExporter):
    """OTLP/HTTP through a BoundedSession, held to the last moment exit gives it: a batch still waiting
    then is dropped, and counted, so exit waits EXIT_SECONDS at most however many batches are left."""

    def __init__(self, endpoint: str) -> None:
        self.session = BoundedSession()
        self.otlp = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_SECONDS, session=self.session)
        self.dropped = 0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        if self.session.deadlines.past_last_moment():
            self.dropped += len(spans)
            return SpanExportResult.FAILURE
        return self.otlp.export(spans)

    def shutdown(self) -> None:
        self.otlp.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.otlp.force_flush(timeout_millis)

    def close_by(self, moment: Optional[float]) -> None:
        """No export goes on past `moment` (time.monotonic; None: each has its own time again)."""
        self.session.deadlines.close_by(moment)


def provider(endpoint: str) -> Any:
    """The application's own tracer provider when it set one up (its exporters, its sampling), else
    agent-demo's: OTLP/HTTP to endpoint/v1/traces, sent at exit within EXIT_SECONDS."""
    global _own, _exporter
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    with _made:
        if _own is None:
            _exporter = BoundedExporter(endpoint.rstrip("/") + "/v1/traces")
            _own = TracerProvider(resource=Resource.create({"service.name": "agent-demo"}))
            _own.add_span_processor(BatchSpanProcessor(_exporter, export_timeout_millis=EXPORT_SECONDS * 1000))
            atexit.register(_shut_down)
        return _own


def _shut_down() -> None:
    """At exit: the spans still waiting go out within EXIT_SECONDS; how many could not is said once."""
    if _own is None or _exporter is None:
        return
    _exporter.close_by(time.monotonic() + EXIT_SECONDS)
    _own.shutdown()
    if _exporter.dropped:
        _log.warning("%s spans were not sent: the OTLP endpoint took longer than exit waits (%g s)",
                     f"{_exporter.dropped:,}", EXIT_SECONDS)


def flush() -> None:
    """Send what is waiting now, within EXIT_SECONDS (before an exit that skips atexit)."""
    if _own is not None and _exporter is not None:
        _exporter.close_by(time.monotonic() + EXIT_SECONDS)
        try:
            _own.force_flush(int(EXIT_SECONDS * 1000))
        finally:
            _exporter.close_by(None)


class Traced(RunEvents):
    """A listener that makes a run's reports into spans."""

    def __init__(self, settings: Any, environment: Any, tools: Iterable[str], redactor: Any):
        self.redactor = redactor
        self.tools = {*tools, *CONTROL_ACTIONS}  # the tools the user configured, and ours: their names may name a span
        self.tracer = provider(settings.otel).get_tracer("agent-demo")
        self.content = str(environment.get(CAPTURE_CONTENT, "")).lower() in ("true", "1")
        self.model, self.url = settings.model, settings.endpoint
        self.urls = {settings.model: settings.endpoint}  # each model's endpoint: an escalation may change both
        if settings.escalate:
            self.urls[settings.escalate.strip()] = settings.stronger().endpoint
        self.agent: Any = None
        self.chat: Any = None
        self.tool: Any = None

    def redact(self, text: str) -> str:
        return self.redactor(text, placeholders=False) if self.redactor else text

    def redact_values(self, value: Any) -> Any:
        return self.redactor.values(value) if self.redactor else value

    def _child(self, name: str, **attributes: Any) -> Any:
        context = trace.set_span_in_context(self.agent) if self.agent is not None else None
        return self.tracer.start_span(name, context=context, kind=trace.SpanKind.CLIENT if name.startswith("chat")
                                      else trace.SpanKind.INTERNAL, attributes=_plain(attributes))

    def _server(self) -> Dict[str, Any]:
        parts = urlsplit(self.url)
        return {"server.address": parts.hostname or "", "server.port": parts.port or
                (443 if parts.scheme == "https" else 80)}

    def _begin(self, task: str, model: str, url: str) -> None:
        self.model = model
        self.agent = self.tracer.start_span("invoke_agent agent-demo", kind=trace.SpanKind.INTERNAL, attributes=_plain({
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "agent-demo", "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model, "url.full": display_url(url), **self._server(),
            **({"gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": task}]}])}
               if self.content else {})}))

    def start(self, task: str, model: str, url: str, kept: dict) -> None:
        self._begin(task, model, url)

    def resume(self, task: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self._begin(task, model, url)

    def follow_up(self, text: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self._begin(text, model, url)

    @contextlib.contextmanager
    def working(self, label: str = "model working") -> Iterator[Working]:
        if label != "model working":
            yield Working()
            return
        self.chat = self._child(f"chat {self.model}", **{"gen_ai.operation.name": "chat", "gen_ai.provider.name":
                                                       "openai", "gen_ai.request.model": self.model, **self._server()})
        try:
            yield Working()
        except BaseException as error:  # the request failed: its span says how, and ends
            _failed(self.chat, type(error).__name__, self.redact(str(error)) if self.content else
                    "the request failed")  # its error quotes the endpoint's own text
            self.chat = None
            raise

    def reply(self, number: int, limit: int, reply: Reply, prose: str, usage: dict, estimated: bool) -> None:
        if self.chat is None:
            return
        self.chat.set_attributes(_plain({
            **_token_counts(usage), "gen_ai.response.finish_reasons": [self.reason(reply)],
            "gen_ai.response.model": self.model, "agent_demo.round": number,
            "agent_demo.usage_estimated": estimated or None,
            **({"gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": self.redact(reply.content)}]}])} if self.content else {})}))
        self.chat.end()
        self.chat = None

    def reason(self, reply: Reply) -> str:
        """Why the reply ended, as the endpoint said it: one of the known reasons, else "other" (its text)."""
        said = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        return said if self.content or said in FINISH_REASONS else "other"

    def action(self, index: int, count: int, tool: str, args: Any, in_words: bool = False) -> None:
        if tool in ENDINGS or self.tool is not None:
            return
        # A name the model made up is its text: with capture off, a span holds only names the user configured.
        name = self.redact(tool) if self.content or tool in self.tools else UNKNOWN_TOOL
        self.tool = self._child(f"execute_tool {name}", **{
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.type":
            "function", **({"gen_ai.tool.call.arguments": json.dumps(self.redact_values(args))} if self.content else {})})

    def result(self, call: Call, sent: dict) -> None:
        if self.tool is None:
            return
        if call.id and self.content:  # the endpoint's text
            self.tool.set_attribute("gen_ai.tool.call.id", self.redact(call.id))
        if self.content:
            self.tool.set_attribute("gen_ai.tool.call.result", json.dumps(self.redact_values(call.result)))
        if not call.result.get("ok"):
            _failed(self.tool, "tool_error", self.redact(str(call.result.get("error"))) if self.content else
                    "the tool call failed")  # its error may quote the arguments, or what the tool read
        else:
            self.tool.end()
        self.tool = None

    def escalation(self, after_round: int, from_model: str, to_model: str, trigger: str, reason: str,
                   notice: str) -> None:
        self.model, self.url = to_model, self.urls.get(to_model, self.url)
        if self.agent is not None:
            self.agent.add_event("agent_demo.escalation", _plain({
                "agent_demo.after_round": after_round, "agent_demo.from_model": from_model,
                "agent_demo.to_model": to_model, "agent_demo.trigger": trigger,
                "agent_demo.reason": self.redact(reason) if self.content else None}))

    def end(self, outcome: Any) -> None:
        for open_span in (self.tool, self.chat):  # cut short mid-call or mid-request (Ctrl-C, SIGTERM)
            if open_span is not None:
                _failed(open_span, outcome.status, "the run ended first")
        self.tool = self.chat = None
        if self.agent is None:
            return
        usage = outcome.usage or {}
        self.agent.set_attributes(_plain({**_token_counts(usage), "agent_demo.status": outcome.status,
                                          "agent_demo.rounds": outcome.rounds}))
        if outcome.status == "error":
            _failed(self.agent, type(outcome.ending).__name__, self.redact(str(outcome.ending)) if self.content
                    else "the run ended in an error")
        else:
            self.agent.end()
        self.agent = None


def _failed(span: Any, kind: str, message: str) -> None:
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, message[:500]))
    span.end()


def _token_counts(usage: dict) -> Dict[str, Any]:
    """The token counts as attributes: figures only (the endpoint's usage may hold words where a count goes)."""
    return {attribute: usage.get(key) if is_count(usage.get(key)) else None for attribute, key in (
        ("gen_ai.usage.input_tokens", "prompt_tokens"), ("gen_ai.usage.output_tokens", "completion_tokens"),
        ("gen_ai.usage.cache_read.input_tokens", "cached_tokens"))}


def _plain(attributes: Dict[str, Any]) -> Dict[str, Any]:
    """Attributes OpenTelemetry takes: no None, lists of text."""
    return {name: value for name, value in attributes.items() if value is not None}


def traced(settings: Any, environment: Any, tools: Iterable[str], redactor: Any) -> RunEvents:
    """A listener that makes the run's reports into spans (tools: the names of the tools the run was given)."""
    return Traced(settings, environment, tools, redactor)
