"""The HTTP client: one session to the chat-completions endpoint, with retries, and the
checks that turn whatever comes back into a Reply or one clear EndpointError."""
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional

import requests
import requests.auth
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

import prompts
from endings import EndpointError, ReplyCutOff
from settings import STREAM_FIELDS, Settings, chat_completions_url, display_url
from streaming import TextListener, read_stream

RETRY_STATUSES = (429, 500, 502, 503, 504)


class CappedRetry(Retry):
    """urllib3's Retry, but a Retry-After longer than the cap is shortened to it, and the
    moment each new attempt starts is noted, so each attempt gets its own --timeout."""

    retry_after_cap = 30.0
    attempt: dict = {}  # shared by the copies urllib3 makes; {"started": monotonic seconds}

    def get_retry_after(self, response):
        seconds = super().get_retry_after(response)
        return None if seconds is None else min(seconds, self.retry_after_cap)

    def sleep(self, response=None):
        super().sleep(response)
        self.attempt["started"] = time.monotonic()


@dataclass
class Reply:
    """What the model said in one round."""

    content: str
    tool_calls: List[dict] = field(default_factory=list)
    usage: Optional[dict] = None
    latency_ms: int = 0
    finish_reason: Optional[str] = None  # "length" when the reply was cut off
    reasoning: str = ""  # reasoning_content, which some servers send beside the content


class BearerAuth(requests.auth.AuthBase):
    """The key as a bearer token."""

    def __init__(self, key: str):
        self.key = key

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.key}"
        return request


class ModelClient:
    """Sends the conversation to the endpoint over one session, with retries."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.url = chat_completions_url(settings.url)
        self.stream = settings.stream  # ask for server-sent events, until the endpoint refuses them
        self.on_text: Optional[TextListener] = None  # shown each piece of a streamed reply
        self.on_note: Callable[[str], None] = lambda text: None  # told when streaming is given up
        self.attempt: dict = {}
        retry_class = type("Retry", (CappedRetry,), {"retry_after_cap": settings.retry_after_cap,
                                                     "attempt": self.attempt})
        retry = retry_class(total=settings.retries, backoff_factor=settings.backoff_factor,
                            status_forcelist=RETRY_STATUSES, allowed_methods=None, raise_on_status=False)
        self.session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if settings.api_key:  # as auth, not a header: a user:password in the URL must not replace it
            self.session.auth = BearerAuth(settings.api_key)

    def ask(self, messages: List[dict], **extra: Any) -> Reply:
        """Send one chat-completions request and return the reply, or raise EndpointError. A reply
        cut off after its headers is asked for again, as urllib3 retries one that never began."""
        for retries_left in range(self.settings.retries, -1, -1):
            try:
                return self._ask_once(messages, **extra)
            except ReplyCutOff as error:
                if not retries_left:
                    raise ReplyCutOff(f"{error} (after {self.settings.retries} retries)") from None
        raise AssertionError("unreachable")

    def _ask_once(self, messages: List[dict], **extra: Any) -> Reply:
        body = {"model": self.settings.model, "messages": messages, **extra}
        streaming = self.stream
        if streaming:
            body.update(STREAM_FIELDS)
        started = self.attempt["started"] = time.monotonic()
        timeout = self.settings.timeout
        try:
            response = self.session.post(self.url, json=body, stream=True, timeout=(min(10.0, timeout), timeout))
            deadline = self.attempt["started"] + timeout  # each attempt gets the whole timeout
            if streaming and response.ok and "text/event-stream" in response.headers.get("Content-Type", ""):
                text = read_body(response, deadline, timeout, lambda chunks: json.dumps(
                    read_stream(chunks, deadline, timeout, parse_body, self.on_text), ensure_ascii=False))
            else:  # not streamed (an error, or a server that ignores stream): one JSON body
                text = read_body(response, deadline, timeout)
        except requests.RequestException as error:
            raise EndpointError(describe_network_error(error, self.settings, self.url)) from None
        latency_ms = int((time.monotonic() - started) * 1000)
        if response.status_code >= 400:
            said = server_message(text)
            if streaming and response.status_code in (400, 415, 422) and re.search(r"\bstream", said, re.I):
                self.stream = False  # once, for the rest of the run
                self.on_note(f"the endpoint refused streaming ({said}); asking without it from now on")
                return self._ask_once(messages, **extra)
            raise EndpointError(describe_http_error(response.status_code, text, self.settings),
                                response.status_code, said)
        reply = read_reply(text)
        reply.latency_ms = latency_ms
        return reply

    def close(self) -> None:
        self.session.close()


def describe_network_error(error: Exception, settings: Settings, url: str) -> str:
    """What happened, in words: no connection, no reply in time, or a reply that stopped arriving."""
    text, tries = str(error), f" (after {settings.retries} retries)"
    shown = display_url(url)
    if isinstance(error, (requests.ReadTimeout, requests.exceptions.ConnectionError)) and "Read timed out" in text:
        return f"no reply within {settings.timeout:g} s from {shown}: the server is busy or still generating{tries}"
    if isinstance(error, requests.ConnectTimeout):
        return f"cannot reach {shown}: no connection within {min(10.0, settings.timeout):g} s{tries}"
    if isinstance(error, requests.exceptions.ChunkedEncodingError):
        return f"the reply stopped arriving from {shown}: the connection broke mid-reply{tries}"
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return f"the server closed the connection without replying ({shown}){tries}"
    if "Connection refused" in text:
        return f"cannot reach {shown}: connection refused{tries}"
    if "Name or service not known" in text or "NameResolution" in text or "nodename nor servname" in text:
        return f"cannot reach {shown}: host name not found{tries}"
    if isinstance(error, requests.ConnectionError):
        without_reprs = re.sub(r"<[^>]*>:?\s*", "", text)[:200]
        return f"cannot reach {shown}: {without_reprs}{tries}"
    return f"request to {shown} failed: {type(error).__name__}"


def read_body(response: requests.Response, deadline: float, seconds: float,
              consume: Optional[Callable[[Iterator[bytes]], str]] = None) -> str:
    """The whole body as text, unless it is still arriving at the deadline (a server trickling its
    reply); `consume` reads the pieces as they arrive instead (a streamed reply)."""
    read_some = getattr(response.raw, "read1", None)  # what has arrived, without waiting for a full buffer
    pieces = (iter(lambda: read_some(65536, decode_content=True), b"") if read_some
              else response.iter_content(1024))  # urllib3 1.x has no read1

    def gather(arriving: Iterator[bytes]) -> str:
        chunks = []
        for chunk in arriving:
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise ReplyCutOff(f"the reply did not finish arriving within {seconds:g} s"
                                    " (the server is sending too slowly)")
        return b"".join(chunks).decode(response.encoding or "utf-8", errors="replace")
    try:
        text = (consume or gather)(pieces)
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
        response.close()
        if "timed out" in str(error).lower():
            raise ReplyCutOff(f"the reply stopped arriving: nothing more came within {seconds:g} s") from None
        raise ReplyCutOff(f"the reply stopped arriving: the connection broke mid-reply"
                          f" ({type(error).__name__})") from None
    except EndpointError as error:
        response.close()
        raise ReplyCutOff(str(error)) from None
    try:
        for _ in pieces:  # what follows a stream's [DONE], so the connection can be reused
            if time.monotonic() > deadline:
                response.close()
                return text
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
        response.close()
        return text
    response.raw.release_conn()  # the whole body is read: the connection goes back to the pool
    return text


def parse_body(text: str) -> Any:
    """A body's JSON, made safe to print and to send back: NaN and Infinity become null, and
    lone surrogates (from \\ud800-style escapes) become "?". ValueError if it is not JSON."""
    try:
        body = json.loads(text, parse_constant=lambda name: None,
                          parse_float=lambda number: float(number) if math.isfinite(float(number)) else None)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return json.loads(json.dumps(body, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8"))


def server_message(text: str) -> str:
    """The endpoint's own words about an error, however it shapes them."""
    try:
        body = parse_body(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body.get("message", body.get("detail")))
        if isinstance(error, dict):
            error = error.get("message") or error
        if error:
            text = error if isinstance(error, str) else prompts.to_json(error)
            return _one_line(text)
    return _one_line(text) or "(empty body)"


def _one_line(text: str, limit: int = 300) -> str:
    """A server's words fit for a one-line error: whitespace folded, long text cut."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def describe_http_error(status: int, text: str, settings: Settings) -> str:
    """Name the failed status, what the user can do, and what the server said."""
    message = server_message(text)
    if status in (401, 403):
        return f"authentication failed (HTTP {status}): {message} - check LLM_API_KEY"
    if status == 404:
        return f"not found (HTTP 404): {message} - check LLM_MODEL ({settings.model}) and LLM_API_URL"
    if status in RETRY_STATUSES:
        return f"HTTP {status} after {settings.retries} retries: {message}"
    return f"request rejected (HTTP {status}): {message}"


def read_reply(text: str) -> Reply:
    """Pull the message out of a chat-completions body, or say why it is unusable."""
    try:
        body = parse_body(text)
    except ValueError:
        snippet = " ".join(text.split())[:200]
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
    content = content if isinstance(content, str) else ""
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise EndpointError("the endpoint's reply has tool_calls that are not a list")
    tool_calls = [call for call in raw_calls if isinstance(call, dict)]
    usage, finish_reason = body.get("usage"), choices[0].get("finish_reason")
    reasoning = message.get("reasoning_content")
    return Reply(content=content, tool_calls=tool_calls, usage=usage if isinstance(usage, dict) else None,
                 finish_reason=finish_reason if isinstance(finish_reason, str) else None,
                 reasoning=reasoning if isinstance(reasoning, str) else "")
