"""The endpoint: one session to the chat-completions URL, one loop that decides after each
attempt whether to retry, to change the request's form, or to give up, and the reading of
what comes back into one Reply, from a plain JSON body or from server-sent events.

Servers differ: CRLF or LF line ends, comments and `event:` lines, a `data:` field split over
several lines, a usage chunk with no choices, `[DONE]` or just the end of the stream, tool-call
arguments in pieces. All of it is folded into the same Reply a plain request gives.

The client owns what it negotiated with the endpoint (`RequestForm`): the mode that
works, schema mode's response_format variant, the reply cap's field name, streaming.
It builds every request body from it, and the trace records each change, so a resume starts there.
"""
import contextlib
import html
import ipaddress
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import requests
import requests.auth
import urllib3
from urllib3.exceptions import InvalidHeader, MaxRetryError
from urllib3.util.retry import Retry

import prompts
from agent_demo_kit.records import MOST_TOKENS_A_ROUND, Reply, RunEvents, json_size, to_json
from agent_demo_kit.endings import EndpointError
from agent_demo_kit.request_gate import MOST_ABSORBED, RequestGate
from agent_demo_kit.settings import (CHARS_A_TOKEN, DEFAULT_WINDOW_TOKENS, MESSAGE_CHARS, MIN_LIMIT_TOKENS,
                                     REPLY_BYTES_A_CHAR, REPLY_CHARS_A_TOKEN, SERVER_TEXT_SCANNED, SNIPPET_CHARS,
                                     Settings)
from agent_demo_kit.urls import base_path, base_url, display_url, server_root

TextListener = Callable[[str], None]  # gets each piece of a streamed reply as it arrives


# --- reading a reply --------------------------------------------------------------------------

def parse_body(text: str) -> Any:
    """A body's JSON, made safe to print and to send back: NaN and Infinity become null, and
    lone surrogates (from \\ud800-style escapes) become "?". ValueError if it is not JSON."""
    try:
        body = _DECODER.decode(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not _SURROGATE_ESCAPE.search(text):  # the usual case, each piece of a stream: nothing to mend
        return body
    return json.loads(json.dumps(body, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8"))


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_DECODER = json.JSONDecoder(parse_constant=lambda name: None,
                            parse_float=lambda number: float(number) if math.isfinite(float(number)) else None)


class _LineTooLong(Exception):
    """An event's line is longer than any reply within the cap could make it."""


def events(chunks: Iterator[bytes], max_line: Optional[int] = None) -> Iterator[str]:
    """The data of each server-sent event, in order (comments and other fields skipped). A line that
    comes in many pieces is joined once, when it ends: the work stays linear in its length, and the
    memory too, since a line longer than max_line bytes is not kept (_LineTooLong)."""
    started: List[bytes] = []  # the pieces of a line not ended yet
    started_size = 0
    data: List[str] = []
    for chunk in chunks:
        if b"\n" not in chunk:
            started.append(chunk)
            started_size += len(chunk)
            if max_line is not None and started_size > max_line:
                raise _LineTooLong
            continue
        *lines, rest = chunk.split(b"\n")
        lines[0] = b"".join([*started, lines[0]])
        started, started_size = [rest], len(rest)
        if max_line is not None and max(started_size, len(lines[0])) > max_line:
            raise _LineTooLong
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:  # a blank line ends an event
                if data:
                    yield "\n".join(data)
                data = []
            elif line.startswith("data:"):
                data.append(line[5:][1:] if line[5:6] == " " else line[5:])
    tail = b"".join(started).rstrip(b"\r").decode("utf-8", errors="replace")
    if tail.startswith("data:"):
        data.append(tail[5:].lstrip(" "))
    if data:  # a stream that ended without its last blank line
        yield "\n".join(data)


class _Enough(Exception):
    """A streamed reply has reached a limit: the rest is not read."""


class Stalled(EndpointError):
    """A reply that did not end by --reply-deadline (keep-alives, or pieces, kept coming): not tried
    again, since it would only hold the run as long again."""


class StreamedReply:
    """The pieces of a streamed reply, put back together, within limits: at most `max_chars` of
    text (the content, the reasoning and the calls together; past them it is cut, as at the length
    limit) and `max_calls` calls (the ones after are not read)."""

    def __init__(self, on_text: Optional[TextListener] = None, max_chars: Optional[int] = None,
                 max_calls: Optional[int] = None):
        self.on_text, self.max_chars, self.max_calls = on_text, max_chars, max_calls
        self.size = 0
        self.unread: Optional[str] = None
        self.content: List[str] = []
        self.reasoning: List[str] = []
        self.tool_calls: Dict[int, dict] = {}
        self.arguments: Dict[int, List[str]] = {}  # each call's pieces, joined once at the end
        self.last_index: Optional[int] = None
        self.finish_reason: Optional[str] = None
        self.usage: Optional[dict] = None
        self.model: Any = None

    def add(self, chunk: Any) -> None:
        """Fold one chunk (a parsed event) into the reply."""
        if not isinstance(chunk, dict):
            return
        if chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise EndpointError(f"the endpoint reported an error mid-reply: {_one_line(str(message))}")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else choice.get("message")
        if not isinstance(delta, dict):
            return
        for name, pieces in (("reasoning_content", self.reasoning), ("content", self.content)):
            piece = delta.get(name)
            if isinstance(piece, str) and piece:
                pieces.append(self._counted(piece))
                if self.on_text:
                    self.on_text(piece)
        for position, call in enumerate(delta.get("tool_calls") or []):
            if isinstance(call, dict):
                self._add_call(call, position)

    def _add_call(self, call: dict, position: int) -> None:
        index = call.get("index")
        last = self.last_index
        if not isinstance(index, int):  # some servers send no index: a new id starts a new call
            fresh = last is None or call.get("id") and call.get("id") != self.tool_calls[last]["id"]
            index = (position if last is None else last + 1) if fresh else last
        if self.max_calls is not None and index not in self.tool_calls and len(self.tool_calls) > self.max_calls:
            self.unread = f"its calls after the first {len(self.tool_calls):,}"  # one more than run, to say so
            self.finish_reason = self.finish_reason or "tool_calls"
            raise _Enough
        self.last_index = index if last is None else max(last, index)
        known = self.tool_calls.setdefault(index, {"id": None, "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
        if call.get("id"):
            known["id"] = call["id"]
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if isinstance(function.get("name"), str):
            known["function"]["name"] += self._counted(function["name"])
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            self.arguments.setdefault(index, []).append(self._counted(arguments))
        elif arguments is not None:  # a server that sends the arguments whole, as an object
            known["function"]["arguments"] = arguments
            self.arguments.pop(index, None)

    def _counted(self, piece: str) -> str:
        """A piece of text that came, within max_chars, else the reply is cut here."""
        self.size += len(piece)
        if self.max_chars is not None and self.size > self.max_chars:
            self.unread = f"all after its first {self.max_chars:,} characters"
            self.finish_reason = "length"
            raise _Enough
        return piece

    def reply(self) -> Reply:
        """The same Reply a plain request would have given."""
        for index, pieces in self.arguments.items():
            self.tool_calls[index]["function"]["arguments"] = "".join(pieces)
        calls = [self.tool_calls[index] for index in sorted(self.tool_calls)]
        return Reply(content="".join(self.content), usage=self.usage, finish_reason=self.finish_reason,
                     tool_calls=[{**call, "id": call["id"] or f"call_{n}"} for n, call in enumerate(calls, 1)],
                     reasoning="".join(self.reasoning), unread=self.unread)


def read_stream(chunks: Iterator[bytes], on_text: Optional[TextListener] = None, deadline: Optional[float] = None,
                max_chars: Optional[int] = None, max_calls: Optional[int] = None, allowed: float = 0.0) -> Reply:
    """Read an event stream into a Reply, up to its end or a limit (see StreamedReply); EndpointError
    if it ends before the reply is complete, Stalled if it has not ended by `deadline` (time.monotonic;
    `allowed`: the seconds it stands for, to say): keep-alives and pieces alike keep a reply alive
    until then, and silence is the socket's --timeout."""
    reply, done = StreamedReply(on_text, max_chars, max_calls), False

    def watched() -> Iterator[bytes]:
        for chunk in chunks:
            if deadline is not None and time.monotonic() > deadline:
                raise Stalled(f"the reply did not end within --reply-deadline {allowed:g} s (its server kept"
                              " sending, keep-alives or pieces): cut off")
            yield chunk
    max_line = None if max_chars is None else max_chars * REPLY_BYTES_A_CHAR
    try:
        for data in events(watched(), max_line):
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = parse_body(data)
            except ValueError:
                continue  # a line of some other dialect: the next events still count
            reply.add(chunk)
    except _Enough:
        done = True
    except _LineTooLong:
        reply.unread, reply.finish_reason, done = f"an event of more than {max_line:,} bytes and all after it", \
            "length", True
    if not done and reply.finish_reason is None:  # neither [DONE] nor a finish_reason: it was cut off
        raise EndpointError("the reply stopped arriving: the stream ended before the reply was complete")
    return reply.reply()


# --- asking ---------------------------------------------------------------------------------

RETRY_STATUSES = (429, 500, 502, 503, 504)
CONNECT_SECONDS = 10.0  # the longest wait for a connection (less when --timeout is shorter)
WINDOW_ASK_SECONDS = 2.0  # the longest wait for a local server to say its model's window
MIN_WINDOW_TOKENS = 256  # a window said smaller than this is not taken for one
MIN_REPLY_TOKENS = 128  # the smallest reply a request leaves room for
CAP_FIELD_CHARS = 32  # what the reply cap adds to a request: ', "max_completion_tokens": 4096' and some
# What a streamed request carries besides a plain one: the client sends it, the budget counts it.
STREAM_FIELDS = {"stream": True, "stream_options": {"include_usage": True}}


REPLY_CAP_FIELDS = ("max_tokens", "max_completion_tokens")


@dataclass
class RequestForm:
    """The form of request the endpoint takes, as found out during the run (and recorded)."""

    mode: str
    stream: bool
    schema_variant: str = prompts.SCHEMA_VARIANTS[0]
    reply_cap_field: str = REPLY_CAP_FIELDS[0]  # max_completion_tokens once the endpoint asks for that
    mode_worked: bool = False  # the endpoint has answered a request in this form

    @classmethod
    def asked_for(cls, settings: Settings) -> "RequestForm":
        """The form a new run starts with: the mode and streaming the settings ask for."""
        return cls(mode=settings.mode, stream=settings.stream)

    @classmethod
    def resumed(cls, settings: Settings, start: dict, rounds_in_mode: bool) -> "RequestForm":
        """The form a resumed run starts from: what the endpoint took before (as recorded in `start`, with
        what later records changed), for the mode in force; rounds_in_mode: a round was answered in it."""
        form = cls(mode=settings.mode, stream=settings.stream and start.get("stream") is not False)
        if settings.mode == start.get("mode") and start.get("schema_variant") in prompts.SCHEMA_VARIANTS:
            form.schema_variant = start["schema_variant"]
        if start.get("reply_cap_field") in REPLY_CAP_FIELDS:
            form.reply_cap_field = start["reply_cap_field"]
        form.mode_worked = rounds_in_mode
        return form

    def shape(self) -> tuple:
        """What the request's messages depend on: a change rebuilds them."""
        return self.mode, self.schema_variant, self.reply_cap_field, self.stream

    def record(self) -> dict:
        return {"mode": self.mode, "schema_variant": self.schema_variant,
                "reply_cap_field": self.reply_cap_field, "stream": self.stream}


class BearerAuth(requests.auth.AuthBase):
    """The key as a bearer token."""

    def __init__(self, key: str):
        self.key = key

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.key}"
        return request


class AttemptFailed(Exception):
    """One attempt did not bring a reply: an HTTP error (status, the server's words, the
    response) or no usable answer at all (a network error, a reply cut off)."""

    def __init__(self, message: str, status: Optional[int] = None, text: str = "", response: Any = None,
                 unanswered: bool = False, unreachable: bool = False):
        super().__init__(message)
        self.status, self.text, self.response = status, text, response
        self.unanswered = unanswered  # the server took the request and said nothing within --timeout
        self.unreachable = unreachable  # no connection at all: a wrong URL, or a server that is down
        self.said = server_message(text) if status else ""


Request = Callable[[], List[dict]]  # builds the messages for the current form


class ModelClient:
    """Sends the conversation to the endpoint over one session."""

    def __init__(self, settings: Settings, trace: Optional[RunEvents] = None, form: Optional[RequestForm] = None,
                 session: Optional[requests.Session] = None):
        self.settings, self.trace = settings, trace or RunEvents()
        self.form = form or RequestForm.asked_for(settings)
        self.url = settings.endpoint
        self.on_text: Optional[TextListener] = None  # shown each piece of a streamed reply
        self.session, self.own_session = session or requests.Session(), session is None  # a batch worker's is reused
        if getattr(self.session, "environment_of", None) != self.url:
            # What the environment says about this one URL (proxies, NO_PROXY, a CA bundle, ~/.netrc), read
            # once, not on every request: requests would read the whole environment twice a request.
            found = self.session.merge_environment_settings(self.url, {}, None, None, None)
            self.session.trust_env = False
            self.session.proxies, self.session.verify, self.session.cert = found["proxies"], found["verify"], \
                found["cert"]
            self.session.netrc_auth = requests.utils.get_netrc_auth(self.url)
            self.session.environment_of = self.url
        # As auth, not a header: a user:password in the URL must not replace it.
        self.session.auth = BearerAuth(settings.api_key) if settings.api_key else self.session.netrc_auth
        self.learned_window: Optional[int] = None  # the model's window in tokens, once asked
        self.window_said = False  # the server said it (else it is DEFAULT_WINDOW_TOKENS)
        self.cap_shrunk = False  # the reply cap was shrunk to fit, and the trace said so
        self.gate: Optional[RequestGate] = None  # the limit on requests in flight a batch's tasks share

    def body(self, messages: List[dict], tools: Dict[str, Any]) -> dict:
        """The request body, exactly as sent, in the current form, offering `tools` (every tool in use):
        the conversation measures it with this too. Its reply cap is --max-reply-tokens, or what the
        model's window leaves beside the request when that is less."""
        form, settings = self.form, self.settings
        options = prompts.request_options(form.mode, tools, settings.max_calls, form.schema_variant)
        body = {"model": settings.model, "messages": messages, **options, **(STREAM_FIELDS if form.stream else {})}
        cap = self.reply_cap(json_size(body))
        return {**body, form.reply_cap_field: cap} if cap else body

    def reply_cap(self, request_chars: int) -> int:
        """The reply cap a request of this size gets: --max-reply-tokens (0: none), shrunk to what the
        model's window leaves, counting CHARS_A_TOKEN characters a token (the trace says so once)."""
        wanted = self.settings.max_reply_tokens
        left = self.window() - -(-(request_chars + CAP_FIELD_CHARS) // CHARS_A_TOKEN)
        if not wanted or left >= wanted:
            return wanted
        cap = max(1, left)
        if not self.cap_shrunk:
            self.cap_shrunk = True
            self.trace.note(f"the reply cap is {cap:,} tokens, not {wanted:,}: the request takes about"
                            f" {request_chars // CHARS_A_TOKEN:,} of the model's {self.window():,}")
        return cap

    def request_budget(self) -> int:
        """The characters a request may take: --max-context when given, else what the model's window holds
        beside a reply of --max-reply-tokens (at most half the window); never more than the window holds
        beside the smallest reply."""
        asked = self.settings.max_context
        return self.most_chars() if asked is None else min(asked, self.most_chars())

    def most_chars(self) -> int:
        """The most characters a request may take in the model's window beside a reply of
        --max-reply-tokens (at most half the window; a quarter when there is no cap)."""
        window, wanted = self.window(), self.settings.max_reply_tokens
        reserve = min(wanted, window // 2) if wanted else window // 4
        return (window - max(reserve, MIN_REPLY_TOKENS)) * CHARS_A_TOKEN

    def window_notes(self) -> List[str]:
        """What a run says once, before its first request, about the window: a --max-context it does not hold."""
        asked = self.settings.max_context
        if asked is None or asked <= self.most_chars():
            return []
        return [f"{self.settings.named('max_context')} {asked:,} is more than the model's window of"
                f" {self.window():,} tokens holds: requests are kept under {self.most_chars():,} characters"]

    def window(self) -> int:
        """The model's context window in tokens: what its server says (llama.cpp's /props, vLLM's
        /v1/models, Ollama's /api/show; asked once, local servers only), else DEFAULT_WINDOW_TOKENS."""
        if self.learned_window is None:
            known = getattr(self.session, "known_windows", {})  # a batch's workers share what they learned
            key = (self.url, self.settings.model)
            if key not in known:
                known[key] = ask_window(self.session, self.settings) if is_local(self.url) else None
            self.learned_window = known[key] or DEFAULT_WINDOW_TOKENS
            self.window_said = self.learned_window != DEFAULT_WINDOW_TOKENS
        return self.learned_window

    def ask(self, request: Request, tools: Dict[str, Any]) -> Tuple[Reply, List[dict]]:
        """Send the request until it brings a reply: retry what may pass next time (429, 5xx, a
        dropped connection, a timeout), build it again in another form when the endpoint refuses
        this one, and raise EndpointError when neither helps. Returns the reply and the messages sent."""
        retry = Retry(total=self.settings.retries, backoff_factor=self.settings.backoff_factor,
                      status_forcelist=RETRY_STATUSES, allowed_methods=None)
        started, absorbed = time.monotonic(), 0
        while True:
            messages = request()
            try:
                with self.gate.slot() if self.gate else contextlib.nullcontext((0, 1)) as sent:
                    reply = self.attempt(self.body(messages, tools))
            except AttemptFailed as failure:
                if self.waits_its_turn(failure, sent, absorbed):
                    absorbed += 1
                elif not (failure.status and self.change_form(failure)):
                    retry = self.wait_to_retry(retry, failure)
                continue
            if self.gate:
                self.gate.answered_one()
            self.form.mode_worked = True
            reply.latency_ms = int((time.monotonic() - started) * 1000)
            kept = self.settings.max_calls + 1  # one past the cap, so the model is told of the cap
            if len(reply.tool_calls) > kept:  # before anything works through the calls one by one
                reply.tool_calls = reply.tool_calls[:kept]
                reply.unread = reply.unread or f"its calls after the first {kept:,}"
            return reply, messages

    def wait_to_retry(self, retry: Retry, failure: AttemptFailed) -> Retry:
        """Sleep before the next attempt, as Retry-After or the backoff says; EndpointError when
        the failure is not worth retrying or the retries are spent."""
        retries = self.settings.retries
        if failure.unanswered and is_local(self.url):  # a copy would queue behind the first: never stack them
            raise EndpointError(f"{failure}; a local server may still be working on it, so it is not sent again"
                                " (give it longer with --timeout)")
        if failure.status and (failure.status not in RETRY_STATUSES  # a 500 that names response_format refuses it
                               or refuses_options(failure.status, failure.said, mode_worked=True)):
            raise EndpointError(describe_http_error(failure.status, failure.text, self.settings, retried=False),
                                failure.status, failure.said)
        raw = getattr(failure.response, "raw", None)
        try:
            retry = retry.increment("POST", self.url, response=raw, error=None if raw else failure)
        except MaxRetryError:
            if failure.status:
                raise EndpointError(describe_http_error(failure.status, failure.text, self.settings),
                                    failure.status, failure.said) from None
            raise EndpointError(f"{failure} (after {retries} retries)", unreachable=failure.unreachable) from None
        try:
            wait = retry.get_retry_after(raw) if raw is not None else None
        except InvalidHeader:
            wait = None
        wait = min(self.settings.max_retry_wait, retry.get_backoff_time() if wait is None else wait)
        cause = f"HTTP {failure.status}" if failure.status else re.split(r": | \(| from http", str(failure))[0]
        self.trace.retry(cause, retries - retry.total, retries, wait)
        self.gate.sleep(wait) if self.gate else time.sleep(wait)
        return retry

    def waits_its_turn(self, failure: AttemptFailed, sent: Tuple[int, int], absorbed: int) -> bool:
        """A 429 in a batch, whose tasks share a limit on requests in flight: the limit is lowered (once a
        wave) and the request waits, Retry-After or a wait that doubles up to a rate limit's usual
        window (twice AGENT_MAX_RETRY_WAIT: a minute), and goes again without spending a --retries, so a
        proxy's rate limit costs a wait, never a task. False for anything else, a 429 that says the quota
        is spent, and past MOST_ABSORBED such 429s in a row."""
        if self.gate is None or failure.status != 429 or absorbed >= MOST_ABSORBED or quota_spent(failure.said):
            return False
        header = getattr(failure.response, "headers", {}).get("Retry-After")
        try:
            retry_after = Retry().parse_retry_after(header) if header else None
        except InvalidHeader:
            retry_after = None
        window = 2 * self.settings.max_retry_wait
        self.gate.too_many(sent, None if retry_after is None else min(retry_after, window))
        wait = min(window, self.settings.backoff_factor * 2 ** absorbed if retry_after is None else retry_after)
        self.trace.retry(f"HTTP 429 with {sent[1]} request(s) allowed in flight (now {self.gate.limit}): a rate"
                         " limit, waited out", 0, self.settings.retries, wait)
        self.gate.sleep(wait)
        return True

    def change_form(self, failure: AttemptFailed) -> bool:
        """After a refusal of the request's form, the next form to try; False if the refusal is not about it."""
        status, said, form = failure.status, failure.said, self.form
        if form.stream and status in (400, 415, 422) and re.search(r"\bstream", said, re.I):
            form.stream = False  # for the rest of the run, and a resume
            self.trace.setting("stream", False, f"the endpoint refused streaming ({said}); asking without it"
                                                " from now on")
        elif status == 400 and "max_completion_tokens" in said and form.reply_cap_field == "max_tokens" \
                and self.settings.max_reply_tokens:  # OpenAI's reasoning models, for one
            form.reply_cap_field = "max_completion_tokens"
            self.trace.setting("reply_cap_field", "max_completion_tokens", "the endpoint takes no max_tokens;"
                               " sending the reply cap as max_completion_tokens from now on")
        elif form.mode != "json" and refuses_options(status, said, form.mode_worked):
            self.step_down(f"HTTP {status}: {said}")
        else:
            return False
        return True

    def step_down(self, refusal: str) -> None:
        """The next form after a refusal: schema mode's next response_format variant, else json mode."""
        form, variants = self.form, prompts.SCHEMA_VARIANTS
        variant = form.schema_variant if form.mode == "schema" else None
        if variant in variants[:-1]:
            form.schema_variant = variants[variants.index(variant) + 1]
            self.trace.fallback("schema", "schema", refusal, variant, form.schema_variant)
        else:
            self.trace.fallback(form.mode, "json", refusal, variant)
            form.mode = "json"
        form.mode_worked = False  # the new form has yet to be answered

    def attempt(self, body: dict) -> Reply:
        """One POST and its whole reply; AttemptFailed if the server stays silent for --timeout (no first
        byte, or no next piece): a slow model that keeps writing is never cut off."""
        timeout, asked_at = self.settings.timeout, time.monotonic()
        try:  # the read timeout is the longest wait for the next bytes, not for the whole reply
            response = self.session.post(self.url, json=body, stream=True, timeout=(min(CONNECT_SECONDS, timeout), timeout))
        except requests.RequestException as error:
            said = describe_network_error(error, self.settings, self.url)
            raise AttemptFailed(said, unanswered=isinstance(error, requests.ReadTimeout),
                                unreachable=said.startswith("cannot reach")) from None
        streamed = body.get("stream") and response.ok and "text/event-stream" in response.headers.get(
            "Content-Type", "")
        pieces = _pieces(response)
        most_chars = max(body.get(self.form.reply_cap_field) or self.window(), MIN_LIMIT_TOKENS) * REPLY_CHARS_A_TOKEN
        allowed = self.settings.reply_deadline
        try:
            if streamed:
                reply = read_stream(pieces, self.on_text, asked_at + allowed, most_chars, self.settings.max_calls,
                                    allowed)
                if reply.unread:  # a limit was reached: the rest may never end
                    response.close()
                else:
                    for _ in pieces:  # what follows [DONE], so the connection goes back to the pool
                        pass
            else:
                text = _bounded(pieces, most_chars * REPLY_BYTES_A_CHAR, asked_at + allowed, allowed).decode(
                    response.encoding or "utf-8", "replace")
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            response.close()
            if "timed out" in str(error).lower():
                raise AttemptFailed(f"the reply stopped arriving: nothing more came within {timeout:g} s") from None
            raise AttemptFailed(f"the reply stopped arriving: the connection broke mid-reply"
                                f" ({type(error).__name__})") from None
        except Stalled:
            response.close()
            raise
        except (AttemptFailed, EndpointError) as error:
            response.close()
            raise AttemptFailed(str(error)) from None
        if streamed:
            return reply
        if response.status_code >= 400:
            raise AttemptFailed(f"HTTP {response.status_code}", response.status_code, text, response)
        return reply_from_body(text)

    def close(self) -> None:
        if self.own_session:
            self.session.close()


def ask_window(session: requests.Session, settings: Settings) -> Optional[int]:
    """The context window a local server says its model has, in tokens, or None: llama.cpp's /props
    (n_ctx), vLLM's /v1/models (max_model_len), Ollama's /api/show (num_ctx, else the model's
    context_length). Each is asked briefly; one that does not answer is passed by."""
    root, base = server_root(settings.endpoint), base_url(settings.endpoint)
    quick = min(WINDOW_ASK_SECONDS, settings.timeout)
    asks = [("GET", f"{root}/props", None), ("GET", f"{base}/models", None),
            ("POST", f"{root}/api/show", {"model": settings.model})]
    for method, url, body in asks:
        try:  # each ask ends by its deadline, whatever the server sends meanwhile (keep-alives, forever)
            response = session.request(method, url, json=body, timeout=quick, stream=True)
            try:  # read whole, so that the connection goes back to the pool
                text = _within(_pieces(response), time.monotonic() + quick, WINDOW_BODY_BYTES)
            except BaseException:
                response.close()
                raise
            found = window_in(parse_body(text.decode("utf-8", "replace")), settings.model) \
                if response.ok and text else None
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError, ValueError, _TooLong):
            continue
        if found:
            return found
    return None


WINDOW_BODY_BYTES = 1 << 20  # a server's answer about its model is smaller than this


class _TooLong(Exception):
    """A body that did not end by its deadline, or within its size."""


def _within(pieces: Iterator[bytes], deadline: float, most_bytes: int) -> bytes:
    """A whole body that ends by the deadline and within most_bytes; _TooLong otherwise."""
    kept, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > most_bytes or time.monotonic() > deadline:
            raise _TooLong()
        kept.append(piece)
    return b"".join(kept)


def window_in(body: Any, model: str) -> Optional[int]:
    """The window a server's answer names, if it names one that can be true."""
    if not isinstance(body, dict):
        return None
    found: List[Any] = [body.get("n_ctx"), (body.get("default_generation_settings") or {}).get("n_ctx")
                        if isinstance(body.get("default_generation_settings"), dict) else None]
    models = [entry for entry in body.get("data") or [] if isinstance(entry, dict)] \
        if isinstance(body.get("data"), list) else []
    found += [entry.get("max_model_len") for entry in models if entry.get("id") == model or len(models) == 1]
    parameters = body.get("parameters") if isinstance(body.get("parameters"), str) else ""
    found += [int(match) for match in re.findall(r"^num_ctx\s+(\d+)", parameters, re.M)]
    if isinstance(body.get("model_info"), dict):
        found += [value for key, value in body["model_info"].items() if key.endswith(".context_length")]
    return next((value for value in found if isinstance(value, int) and not isinstance(value, bool)
                 and MIN_WINDOW_TOKENS <= value <= MOST_TOKENS_A_ROUND), None)


def quota_spent(said: str) -> bool:
    """Does a 429 say the account's quota is spent (OpenAI's insufficient_quota), which no wait mends?"""
    return re.search(r"insufficient_quota|exceeded your current quota|billing", said, re.I) is not None


def refuses_options(status: Optional[int], said: str, mode_worked: bool) -> bool:
    """Did the endpoint refuse response_format or tools (as opposed to failing for another reason)?"""
    names_them = any(name in said for name in ("response_format", "json_schema", "tools", "tool_choice"))
    if status in (400, 422):  # a first request refused, or one that says why
        return names_them or not mode_worked
    return bool(status and status >= 500 and names_them)


def _bounded(pieces: Iterator[bytes], most_bytes: int, deadline: float, allowed: float) -> bytes:
    """A whole body, or AttemptFailed once it passes most_bytes (no reply is that long), Stalled once
    it has not ended by the deadline."""
    kept: List[bytes] = []
    size = 0
    for piece in pieces:
        if time.monotonic() > deadline:
            raise Stalled(f"the reply did not end within --reply-deadline {allowed:g} s (its server kept sending):"
                          " cut off")
        size += len(piece)
        if size > most_bytes:
            raise AttemptFailed(f"the reply was longer than {most_bytes:,} bytes, more than any reply within the cap;"
                                " it was not read")
        kept.append(piece)
    return b"".join(kept)


def _pieces(response: requests.Response) -> Iterator[bytes]:
    """The body as it arrives, each piece as soon as it does (the socket's read timeout is --timeout)."""
    read_some = getattr(response.raw, "read1", None)  # what has arrived, without waiting for a full buffer
    return (iter(lambda: read_some(65536, decode_content=True), b"") if read_some
            else response.iter_content(1024))  # urllib3 1.x has no read1


def is_local(url: str) -> bool:
    """Is the endpoint on this machine or this network (a server the user runs, busy with one request at a time)?"""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".local"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


def describe_network_error(error: Exception, settings: Settings, url: str) -> str:
    """What happened, in words: no connection, no reply in time, or a reply that stopped arriving."""
    text = str(error)  # the number of retries is added once they are spent
    shown = display_url(url)
    if isinstance(error, (requests.ReadTimeout, requests.exceptions.ConnectionError)) and "Read timed out" in text:
        return f"no reply within {settings.timeout:g} s from {shown}: the server is busy or still generating"
    if isinstance(error, requests.ConnectTimeout):
        return f"cannot reach {shown}: no connection within {min(CONNECT_SECONDS, settings.timeout):g} s"
    if isinstance(error, requests.exceptions.ChunkedEncodingError):
        return f"the reply stopped arriving from {shown}: the connection broke mid-reply"
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return f"the server closed the connection without replying ({shown})"
    if "Connection refused" in text:
        return f"cannot reach {shown}: connection refused"
    if "Name or service not known" in text or "NameResolution" in text or "nodename nor servname" in text:
        return f"cannot reach {shown}: host name not found"
    if isinstance(error, requests.ConnectionError):
        without_reprs = prompts.clip(re.sub(r"<[^>]*>:?\s*", "", text), SNIPPET_CHARS)
        return f"cannot reach {shown}: {without_reprs}"
    return f"request to {shown} failed: {type(error).__name__}"


def server_message(text: str) -> str:
    """The endpoint's own words about an error, however it shapes them, in one clean line."""
    try:
        body = parse_body(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body.get("message", body.get("detail")))
        if isinstance(error, dict):
            error = error.get("message") or error
        if isinstance(error, list) and error and all(isinstance(item, dict) and "msg" in item for item in error):
            error = "; ".join(_field_message(item.get("loc"), item["msg"]) for item in error)  # FastAPI's 422
        if error:
            text = error if isinstance(error, str) else to_json(error)
            return _one_line(without_internals(text))
    if _HTML.match(text):  # a proxy's or a framework's error page: its title, else its first words
        page = _CODE.sub(" ", text[:SERVER_TEXT_SCANNED])
        title = _TITLE.search(page)
        words = " ".join(html.unescape(_TAG.sub(" ", title[1] if title else page)).split())
        return prompts.clip(words, SNIPPET_CHARS) or "(an empty HTML page)"
    return _one_line(without_internals(text)) or "(empty body)"


_HTML = re.compile(r"\s*(<!doctype html|<html|<head|<body|<title|<h1)", re.I)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)
_TAG = re.compile(r"<[^>]*>")
_CODE = re.compile(r"<(script|style)\b.*?</\1\s*>", re.I | re.S)


# pydantic's errors as Python reprs: {'type': ..., 'loc': ('body', 'response_format', 'type'), 'msg': "...", ...}
_PYDANTIC_ERROR = re.compile(r"""'loc':\s*\(([^)]{0,300})\),\s*"""
                             r"""'msg':\s*('(?:[^'\\]|\\.){0,500}'|"(?:[^"\\]|\\.){0,500}")""")
_FILE_LINE = re.compile(r'File "[^"]*", line \d+(?:, in [^\s,]+)?')
_PATH = re.compile(r"(?<![\w:/.])/(?:[\w.@+-]+/)+([\w.@+-]+\.[A-Za-z0-9]+)\b")  # not a URL's path


def _field_message(loc: Any, message: Any) -> str:
    """One validation error as "field.path: message" ("body", where FastAPI found it, left out)."""
    parts = [str(part) for part in loc] if isinstance(loc, (list, tuple)) else []
    if parts[:1] == ["body"]:
        parts = parts[1:]
    return f"{'.'.join(parts)}: {message}" if parts else str(message)


def without_internals(text: str) -> str:
    """A server's message without its framework's internals: pydantic's error dumps become
    "field: message", a traceback its last line, a file path the file's name."""
    text = text[:SERVER_TEXT_SCANNED]  # the line shown is much shorter; a huge body is not worth scanning
    found = _PYDANTIC_ERROR.findall(text)
    if found:
        return "; ".join(_field_message([a or b for a, b in re.findall(r"'([^']*)'|(\d+)", loc)],
                                        message[1:-1].replace("\\'", "'")) for loc, message in found)
    if "Traceback (most recent call last)" in text:
        text = [line for line in text.splitlines() if line.strip()][-1]
    return _PATH.sub(r"\1", _FILE_LINE.sub("", text))


def _one_line(text: str) -> str:
    """A server's words fit for a one-line error: whitespace folded, long text cut."""
    return prompts.clip(" ".join(text.split()), MESSAGE_CHARS)


def _given(settings: Settings, name: str, variable: str) -> str:
    """The flag or variable the user gave a setting with, to say what to check; else its usual variable."""
    source = settings.sources.get(name, "default")
    return variable if source in ("default", "the resumed run") else source


def describe_http_error(status: int, text: str, settings: Settings, retried: bool = True) -> str:
    """Name the failed status, what the user can do, and what the server said."""
    message = server_message(text)
    if status in (401, 403):
        return f"authentication failed (HTTP {status}): {message} - check {_given(settings, 'api_key', 'LLM_API_KEY')}"
    if status == 404:
        said = (f"not found (HTTP 404): {message} - check {_given(settings, 'model', 'LLM_MODEL')} ({settings.model})"
                f" and {_given(settings, 'url', 'LLM_API_URL')}")
        return said + (f"; its path has no /v1, which most servers want (Ollama's among them): try"
                       f" {display_url(with_v1(settings.url))}" if "/v1" not in urlsplit(settings.endpoint).path else "")
    if status in RETRY_STATUSES and retried:
        return f"HTTP {status} after {settings.retries} retries: {message}"
    return f"request rejected (HTTP {status}): {message}"


def with_v1(url: str) -> str:
    """A base URL with /v1 where the path has none: http://localhost:11434 -> http://localhost:11434/v1."""
    parts = urlsplit(url.strip())
    return urlunsplit(parts._replace(path=base_path(parts.path) + "/v1"))


def reply_from_body(text: str) -> Reply:
    """Pull the message out of a chat-completions body, or say why it is unusable."""
    try:
        body = parse_body(text)
    except ValueError:
        if _HTML.match(text):  # a proxy's login page, say
            raise EndpointError(f"the endpoint's reply is an HTML page, not JSON: {server_message(text)}") from None
        snippet = prompts.clip(" ".join(text.split()), SNIPPET_CHARS)
        raise EndpointError(f"the endpoint's reply is not JSON: {snippet or '(empty body)'}") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        detail = f": {server_message(text)}" if isinstance(body, dict) and "error" in body else ""
        raise EndpointError(f"the endpoint's reply has no choices{detail}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise EndpointError("the endpoint's reply has no message in its first choice")
    content = message.get("content")
    if isinstance(content, list):  # some servers send content as a list of parts
        content = "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise EndpointError("the endpoint's reply has tool_calls that are not a list")
    usage, finish_reason, reasoning = body.get("usage"), choices[0].get("finish_reason"), message.get("reasoning_content")
    return Reply(content=content if isinstance(content, str) else "",
                 tool_calls=[call for call in raw_calls if isinstance(call, dict)],
                 usage=usage if isinstance(usage, dict) else None,
                 finish_reason=finish_reason if isinstance(finish_reason, str) else None,
                 reasoning=reasoning if isinstance(reasoning, str) else "")

