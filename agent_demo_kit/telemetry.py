"""OpenTelemetry (pip install 'agent-demo[otel]'; --otel URL or OTEL_EXPORTER_OTLP_ENDPOINT): each run
is an `invoke_agent` span, with a `chat {model}` span per request and an `execute_tool {name}` span
per tool call, carrying the GenAI semantic conventions' attributes. Imported only when a run asks
for it, so nothing else pays for it.

Spans are made from the run's own reports (records.RunEvents), passed on to the trace unchanged,
from values already redacted: no key reaches a span. Message contents are recorded only when
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT is true. Spans go out in batches and are flushed
at exit (Ctrl-C and SIGTERM end a run like any ending; a batch's second Ctrl-C flushes first).

It imports records, prompts, tools, replies, urls and the opentelemetry SDK.
"""
import atexit
import contextlib
import json
import threading
import time
from typing import Any, Dict, Iterable, Iterator, Optional
from urllib.parse import urlsplit

import requests
import urllib3
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from agent_demo_kit.prompts import ENDINGS
from agent_demo_kit.records import Call, Reply, RunEvents, Working, is_count
from agent_demo_kit.replies import CUTOFFS, pieces_of
from agent_demo_kit.tools import CONTROL_ACTIONS
from agent_demo_kit.urls import display_url

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
UNKNOWN_TOOL = "unknown_tool"  # a span's name for a call of a tool the run does not have, with capture off
FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter", "function_call"}
_own: Optional[TracerProvider] = None
_made = threading.Lock()


EXPORT_SECONDS = 3.0  # the longest an export (and so exit, for the spans still waiting) may take
COLLECTOR_REPLY_BYTES = 64 << 10  # what of a collector's answer is read: it says "ok" or why not, briefly


class BoundedSession(requests.Session):
    """The exporter's session: a collector's answer is read within EXPORT_SECONDS and COLLECTOR_REPLY_BYTES,
    like every answer agent-demo reads, so an endless, huge or dripping body costs neither memory nor
    time (requests would read the whole body, as long as it keeps coming)."""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:
        deadline = time.monotonic() + EXPORT_SECONDS
        kwargs.update(stream=True, allow_redirects=False)  # a collector's redirect takes no spans elsewhere
        kwargs["timeout"] = min(kwargs.get("timeout") or EXPORT_SECONDS, EXPORT_SECONDS)
        response = super().request(method, url, *args, **kwargs)
        kept = bytearray()
        try:
            with CUTOFFS.at(response, deadline):  # a read that waits inside one piece is cut then too
                for piece in pieces_of(response):
                    kept += piece[:COLLECTOR_REPLY_BYTES - len(kept)]
                    if len(kept) >= COLLECTOR_REPLY_BYTES or time.monotonic() >= deadline:
                        break
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
            pass  # what came is what there is: the status says whether the spans were taken
        finally:
            response.close()
        response._content, response._content_consumed = bytes(kept), True  # what requests keeps a read body in
        return response


def provider(endpoint: str) -> Any:
    """The application's own tracer provider when it set one up (its exporters, its sampling), else
    agent-demo's: OTLP/HTTP to endpoint/v1/traces, flushed at exit."""
    global _own
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    with _made:
        if _own is None:
            _own = TracerProvider(resource=Resource.create({"service.name": "agent-demo"}))
            _own.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
                endpoint=endpoint.rstrip("/") + "/v1/traces", timeout=EXPORT_SECONDS, session=BoundedSession()),
                export_timeout_millis=EXPORT_SECONDS * 1000))
            atexit.register(_own.shutdown)
        return _own


def flush() -> None:
    """Send what is waiting now (before an exit that skips atexit)."""
    if _own is not None:
        _own.force_flush(int(EXPORT_SECONDS * 1000))


class Traced(RunEvents):
    """The run's trace, with each report also made into spans (after the trace took it)."""

    def __init__(self, inner: RunEvents, settings: Any, environment: Any, tools: Iterable[str] = ()):
        self.inner = inner
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def redact(self, text: str) -> str:
        return self.inner.redact(text)

    def redact_values(self, value: Any) -> Any:
        return self.inner.redact_values(value)

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
        self.inner.start(task, model, url, kept)
        self._begin(task, model, url)

    def resume(self, task: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self.inner.resume(task, model, url, done_rounds, kept)
        self._begin(task, model, url)

    def follow_up(self, text: str, model: str, url: str, done_rounds: int, kept: dict) -> None:
        self.inner.follow_up(text, model, url, done_rounds, kept)
        self._begin(text, model, url)

    @contextlib.contextmanager
    def working(self, label: str = "model working") -> Iterator[Working]:
        if label != "model working":
            with self.inner.working(label) as status:
                yield status
            return
        self.chat = self._child(f"chat {self.model}", **{"gen_ai.operation.name": "chat", "gen_ai.provider.name":
                                                       "openai", "gen_ai.request.model": self.model, **self._server()})
        try:
            with self.inner.working(label) as status:
                yield status
        except BaseException as error:  # the request failed: its span says how, and ends
            _failed(self.chat, type(error).__name__, self.redact(str(error)) if self.content else
                    "the request failed")  # its error quotes the endpoint's own text
            self.chat = None
            raise

    def reply(self, number: int, limit: int, reply: Reply, prose: str, usage: dict, estimated: bool) -> None:
        self.inner.reply(number, limit, reply, prose, usage, estimated)
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
        self.inner.action(index, count, tool, args, in_words)
        if tool in ENDINGS or self.tool is not None:
            return
        # A name the model made up is its text: with capture off, a span holds only names the user configured.
        name = self.redact(tool) if self.content or tool in self.tools else UNKNOWN_TOOL
        self.tool = self._child(f"execute_tool {name}", **{
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.type":
            "function", **({"gen_ai.tool.call.arguments": json.dumps(self.redact_values(args))} if self.content else {})})

    def result(self, call: Call, sent: dict) -> None:
        self.inner.result(call, sent)
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
        self.inner.escalation(after_round, from_model, to_model, trigger, reason, notice)
        self.model, self.url = to_model, self.urls.get(to_model, self.url)
        if self.agent is not None:
            self.agent.add_event("agent_demo.escalation", _plain({
                "agent_demo.after_round": after_round, "agent_demo.from_model": from_model,
                "agent_demo.to_model": to_model, "agent_demo.trigger": trigger,
                "agent_demo.reason": self.redact(reason) if self.content else None}))

    def end(self, outcome: Any) -> None:
        self.inner.end(outcome)
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


def traced(log: RunEvents, settings: Any, environment: Any, tools: Iterable[str] = ()) -> RunEvents:
    """The run's trace, made into spans too (tools: the names of the tools the run was given)."""
    return Traced(log, settings, environment, tools)
