"""The endpoint: one session to the chat-completions URL, one loop that decides after each
attempt whether to retry, to change the request's form, or to give up, and the reading of
what comes back (a plain body or server-sent events) into one Reply.

The client owns what it negotiated with the endpoint (`RequestForm`): the mode that
works, schema mode's response_format variant, the reply cap's field name, streaming.
The conversation asks it, and the trace records each change, so a resume starts there.
"""
import ipaddress
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Tuple

import requests
import requests.auth
import urllib3
from urllib3.exceptions import InvalidHeader, MaxRetryError
from urllib3.util.retry import Retry
from urllib.parse import urlsplit

import prompts
from agent_demo_kit.endings import EndpointError
from agent_demo_kit.settings import Settings, chat_completions_url, display_url
from agent_demo_kit.stream import Reply, TextListener, parse_body, read_stream

RETRY_STATUSES = (429, 500, 502, 503, 504)
# What a streamed request carries besides a plain one: the client sends it, the budget counts it.
STREAM_FIELDS = {"stream": True, "stream_options": {"include_usage": True}}


@dataclass
class RequestForm:
    """The form of request the endpoint takes, as found out during the run (and recorded)."""

    mode: str = "json"
    schema_variant: str = prompts.SCHEMA_VARIANTS[0]
    reply_cap_field: str = "max_tokens"  # max_completion_tokens once the endpoint asks for that
    stream: bool = False
    mode_worked: bool = False  # the endpoint has answered a request in this form

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
                 unanswered: bool = False):
        super().__init__(message)
        self.status, self.text, self.response = status, text, response
        self.unanswered = unanswered  # the server took the request and said nothing within --timeout
        self.said = server_message(text) if status else ""


Request = Callable[[], Tuple[List[dict], dict]]  # builds (messages, options) for the current form


class ModelClient:
    """Sends the conversation to the endpoint over one session."""

    def __init__(self, settings: Settings, trace: Any = None, form: Optional[RequestForm] = None):
        if trace is None:
            from agent_demo_kit.trace import RunLog
            trace = RunLog()
        self.settings, self.trace = settings, trace
        self.form = form or RequestForm(mode=settings.mode, stream=settings.stream)
        self.url = chat_completions_url(settings.url)
        self.on_text: Optional[TextListener] = None  # shown each piece of a streamed reply
        self.session = requests.Session()
        if settings.api_key:  # as auth, not a header: a user:password in the URL must not replace it
            self.session.auth = BearerAuth(settings.api_key)

    def body(self, messages: List[dict], options: dict) -> dict:
        """The request body, exactly as sent: the conversation measures it with this too."""
        cap = {self.form.reply_cap_field: self.settings.max_reply_tokens} if self.settings.max_reply_tokens else {}
        return {"model": self.settings.model, "messages": messages, **cap, **options,
                **(STREAM_FIELDS if self.form.stream else {})}

    def ask(self, request: Request) -> Tuple[Reply, List[dict]]:
        """Send the request until it brings a reply: retry what may pass next time (429, 5xx, a
        dropped connection, a timeout), build it again in another form when the endpoint refuses
        this one, and raise EndpointError when neither helps. Returns the reply and the messages sent."""
        retry = Retry(total=self.settings.retries, backoff_factor=self.settings.backoff_factor,
                      status_forcelist=RETRY_STATUSES, allowed_methods=None)
        started = time.monotonic()
        while True:
            messages, options = request()
            try:
                reply = self.attempt(self.body(messages, options))
            except AttemptFailed as failure:
                if not (failure.status and self.change_form(failure)):
                    retry = self.wait_to_retry(retry, failure)
                continue
            self.form.mode_worked = True
            reply.latency_ms = int((time.monotonic() - started) * 1000)
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
            raise EndpointError(f"{failure} (after {retries} retries)") from None
        try:
            wait = retry.get_retry_after(raw) if raw is not None else None
        except InvalidHeader:
            wait = None
        wait = min(self.settings.max_retry_wait, retry.get_backoff_time() if wait is None else wait)
        cause = f"HTTP {failure.status}" if failure.status else re.split(r": | \(| from http", str(failure))[0]
        self.trace.retry(cause, retries - retry.total, retries, wait)
        time.sleep(wait)
        return retry

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
        timeout = self.settings.timeout
        try:  # the read timeout is the longest wait for the next bytes, not for the whole reply
            response = self.session.post(self.url, json=body, stream=True, timeout=(min(10.0, timeout), timeout))
        except requests.RequestException as error:
            raise AttemptFailed(describe_network_error(error, self.settings, self.url),
                                unanswered=isinstance(error, requests.ReadTimeout)) from None
        streamed = body.get("stream") and response.ok and "text/event-stream" in response.headers.get(
            "Content-Type", "")
        pieces = _pieces(response)
        try:
            if streamed:
                reply = read_stream(pieces, self.on_text)
                for _ in pieces:  # what follows [DONE], so the connection goes back to the pool
                    pass
            else:
                text = b"".join(pieces).decode(response.encoding or "utf-8", "replace")
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            response.close()
            if "timed out" in str(error).lower():
                raise AttemptFailed(f"the reply stopped arriving: nothing more came within {timeout:g} s") from None
            raise AttemptFailed(f"the reply stopped arriving: the connection broke mid-reply"
                                f" ({type(error).__name__})") from None
        except (AttemptFailed, EndpointError) as error:
            response.close()
            raise AttemptFailed(str(error)) from None
        if streamed:
            return reply
        if response.status_code >= 400:
            raise AttemptFailed(f"HTTP {response.status_code}", response.status_code, text, response)
        return reply_from_body(text)

    def close(self) -> None:
        self.session.close()


def refuses_options(status: Optional[int], said: str, mode_worked: bool) -> bool:
    """Did the endpoint refuse response_format or tools (as opposed to failing for another reason)?"""
    names_them = any(name in said for name in ("response_format", "json_schema", "tools", "tool_choice"))
    if status in (400, 422):  # a first request refused, or one that says why
        return names_them or not mode_worked
    return bool(status and status >= 500 and names_them)


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
        return f"cannot reach {shown}: no connection within {min(10.0, settings.timeout):g} s"
    if isinstance(error, requests.exceptions.ChunkedEncodingError):
        return f"the reply stopped arriving from {shown}: the connection broke mid-reply"
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return f"the server closed the connection without replying ({shown})"
    if "Connection refused" in text:
        return f"cannot reach {shown}: connection refused"
    if "Name or service not known" in text or "NameResolution" in text or "nodename nor servname" in text:
        return f"cannot reach {shown}: host name not found"
    if isinstance(error, requests.ConnectionError):
        without_reprs = prompts.clip(re.sub(r"<[^>]*>:?\s*", "", text), 200)
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
    return prompts.clip(" ".join(text.split()), limit)


def _given(settings: Settings, name: str, variable: str) -> str:
    """The flag or variable the user gave a setting with, to say what to check; else its usual variable."""
    source = settings.sources.get(name, "")
    return source if source.startswith(("-", "LLM_", "OPENAI_")) else variable


def describe_http_error(status: int, text: str, settings: Settings, retried: bool = True) -> str:
    """Name the failed status, what the user can do, and what the server said."""
    message = server_message(text)
    if status in (401, 403):
        return f"authentication failed (HTTP {status}): {message} - check {_given(settings, 'api_key', 'LLM_API_KEY')}"
    if status == 404:
        return (f"not found (HTTP 404): {message} - check {_given(settings, 'model', 'LLM_MODEL')} ({settings.model})"
                f" and {_given(settings, 'url', 'LLM_API_URL')}")
    if status in RETRY_STATUSES and retried:
        return f"HTTP {status} after {settings.retries} retries: {message}"
    return f"request rejected (HTTP {status}): {message}"


def reply_from_body(text: str) -> Reply:
    """Pull the message out of a chat-completions body, or say why it is unusable."""
    try:
        body = parse_body(text)
    except ValueError:
        snippet = prompts.clip(" ".join(text.split()), 200)
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

