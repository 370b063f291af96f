"""The HTTP client: one session to the chat-completions endpoint, with retries, and the
checks that turn whatever comes back into a Reply or one clear EndpointError."""
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Tuple

import requests
import requests.auth
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

import prompts
from endings import REFUSABLE_OPTIONS, EndpointError, ReplyCutOff, RequestChanged, names_request_options
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
        self.attempt: dict = {}
        retry_class = type("Retry", (CappedRetry,), {"retry_after_cap": settings.retry_after_cap,
                                                     "attempt": self.attempt})
        self.retry = retry_class(total=settings.retries, backoff_factor=settings.backoff_factor,
                                 status_forcelist=RETRY_STATUSES, allowed_methods=None, raise_on_status=False)
        # Some servers refuse response_format or tools with a 500 (llama-cpp-python does). A request
        # carrying them is first sent without retrying a 500, so a refusal is seen at once instead
        # of being waited out as an outage; a 500 that does not name them is then retried as usual.
        self.first_try = self.retry.new(status_forcelist=tuple(s for s in RETRY_STATUSES if s != 500))
        self.session = requests.Session()
        self.adapter = HTTPAdapter(max_retries=self.retry)
        self.session.mount("http://", self.adapter)
        self.session.mount("https://", self.adapter)
        if settings.api_key:  # as auth, not a header: a user:password in the URL must not replace it
            self.session.auth = BearerAuth(settings.api_key)

    def ask(self, messages: List[dict], **extra: Any) -> Reply:
        """Send one chat-completions request and return the reply, or raise EndpointError. A reply
        cut off after its headers is asked for again, as urllib3 retries one that never began."""
        for retries_left in range(self.settings.retries, -1, -1):
            try:
                return self.send_capped(messages, extra)
            except ReplyCutOff as error:
                if not retries_left:
                    raise ReplyCutOff(f"{error} (after {self.settings.retries} retries)") from None
        raise AssertionError("unreachable")

    def send_capped(self, messages: List[dict], extra: dict) -> Reply:
        """The reply cap goes as max_tokens, or as max_completion_tokens from when the endpoint asks for that."""
        try:
            return self.send(messages, extra)
        except EndpointError as error:
            if not (error.http_status == 400 and "max_completion_tokens" in error.server_said
                    and self.settings.reply_cap_field == "max_tokens" and self.settings.max_reply_tokens):
                raise
        self.settings.reply_cap_field = "max_completion_tokens"  # OpenAI's reasoning models, for one
        raise RequestChanged("reply_cap_field", "max_completion_tokens", "the endpoint takes no max_tokens;"
                             " sending the reply cap as max_completion_tokens from now on")

    def send(self, messages: List[dict], extra: dict) -> Reply:
        """One request with its retries, as the endpoint takes it."""
        cap = {self.settings.reply_cap_field: self.settings.max_reply_tokens} if self.settings.max_reply_tokens else {}
        body = {"model": self.settings.model, "messages": messages, **cap, **extra}
        streaming = self.stream
        if streaming:
            body.update(STREAM_FIELDS)
        started = time.monotonic()
        refusable = any(name in extra for name in REFUSABLE_OPTIONS)
        response, text = self.post(body, self.first_try if refusable else self.retry, streaming)
        refused = refusable and response.status_code == 500 and names_request_options(server_message(text))
        if refusable and response.status_code == 500 and not refused:
            left = getattr(getattr(response.raw, "retries", None), "total", None)
            left = left if isinstance(left, int) else self.settings.retries
            if left > 0:  # an outage after all: the retries it would have had, less the try just made
                response, text = self.post(body, self.retry.new(total=left - 1), streaming)
        latency_ms = int((time.monotonic() - started) * 1000)
        if response.status_code >= 400:
            said = server_message(text)
            if streaming and response.status_code in (400, 415, 422) and re.search(r"\bstream", said, re.I):
                self.stream = self.settings.stream = False  # once, for the rest of the run (and a resume)
                raise RequestChanged("stream", False, f"the endpoint refused streaming ({said});"
                                     " asking without it from now on")
            raise EndpointError(describe_http_error(response.status_code, text, self.settings, retried=not refused),
                                response.status_code, said)
        reply = read_reply(text)
        reply.latency_ms = latency_ms
        return reply

    def post(self, body: dict, retry: Retry, streaming: bool) -> Tuple[requests.Response, str]:
        """POST the body with this retry policy; the response and its whole text (a streamed reply
        read into the body a plain one has). Each attempt gets the whole --timeout."""
        self.adapter.max_retries = retry  # requests takes no retry policy per request, its adapter does
        timeout = self.settings.timeout
        self.attempt["started"] = time.monotonic()
        try:
            response = self.session.post(self.url, json=body, stream=True, timeout=(min(10.0, timeout), timeout))
            deadline = self.attempt["started"] + timeout
            if streaming and response.ok and "text/event-stream" in response.headers.get("Content-Type", ""):
                return response, read_body(response, deadline, timeout, lambda chunks: json.dumps(
                    read_stream(chunks, deadline, timeout, parse_body, self.on_text), ensure_ascii=False))
            return response, read_body(response, deadline, timeout)  # an error, or a server ignoring stream
        except requests.RequestException as error:
            raise EndpointError(describe_network_error(error, self.settings, self.url)) from None

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
            text = error if isinstance(error, str) else prompts.to_json(error)
            return _one_line(without_internals(text))
    return _one_line(without_internals(text)) or "(empty body)"


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
    text = text[:20_000]  # the line shown is 300 characters; a huge body is not worth scanning
    found = _PYDANTIC_ERROR.findall(text)
    if found:
        return "; ".join(_field_message([a or b for a, b in re.findall(r"'([^']*)'|(\d+)", loc)],
                                        message[1:-1].replace("\\'", "'")) for loc, message in found)
    if "Traceback (most recent call last)" in text:
        text = [line for line in text.splitlines() if line.strip()][-1]
    return _PATH.sub(r"\1", _FILE_LINE.sub("", text))


def _one_line(text: str, limit: int = 300) -> str:
    """A server's words fit for a one-line error: whitespace folded, long text cut."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def describe_http_error(status: int, text: str, settings: Settings, retried: bool = True) -> str:
    """Name the failed status, what the user can do, and what the server said."""
    message = server_message(text)
    if status in (401, 403):
        return f"authentication failed (HTTP {status}): {message} - check LLM_API_KEY"
    if status == 404:
        return f"not found (HTTP 404): {message} - check LLM_MODEL ({settings.model}) and LLM_API_URL"
    if status in RETRY_STATUSES and retried:
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
