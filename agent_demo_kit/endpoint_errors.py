"""What went wrong with the endpoint, in words a person can act on: a connection that failed, an
HTTP error with the server's own message found in whatever it sent (JSON, an HTML page, a
traceback), without its internals, and the setting to check.

It imports prompts, records, endings, settings and urls.
"""
import html
import json
import math
import re
from typing import Any, Callable, Optional
from urllib.parse import urljoin, urlsplit

import requests

from agent_demo_kit import prompts
from agent_demo_kit.records import to_json
from agent_demo_kit.settings import Settings
from agent_demo_kit.limits import CONNECT_SECONDS, MESSAGE_CHARS, SERVER_TEXT_SCANNED, SNIPPET_CHARS
from agent_demo_kit.urls import display_url, with_v1


RETRY_STATUSES = (429, 500, 502, 503, 504)


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
            return one_line(without_internals(text))
    if HTML_PAGE.match(text):  # a proxy's or a framework's error page: its title, else its first words
        page = _CODE.sub(" ", text[:SERVER_TEXT_SCANNED])
        title = _TITLE.search(page)
        words = " ".join(html.unescape(_TAG.sub(" ", title[1] if title else page)).split())
        return prompts.clip(words, SNIPPET_CHARS) or "(an empty HTML page)"
    return one_line(without_internals(text)) or "(empty body)"


HTML_PAGE = re.compile(r"\s*(<!doctype html|<html|<head|<body|<title|<h1)", re.I)


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


def one_line(text: str) -> str:
    """A server's words fit for a one-line error: whitespace folded, long text cut."""
    return prompts.clip(" ".join(text.split()), MESSAGE_CHARS)


def _given(settings: Settings, name: str, variable: str) -> str:
    """The flag or variable the user gave a setting with, to say what to check; else its usual variable."""
    source = settings.sources.get(name, "default")
    return variable if source in ("default", "the resumed run") else source


def proxy_set_up_wrong(status: Optional[int], text: str, settings: Settings,
                       fails_everything: Callable[[], bool] = lambda: False) -> Optional[str]:
    """What a proxy's 400 or 500 says of its own set-up (no key given, no database to check keys
    against), in words the user can act on; None for any other answer. Every request would get the
    same, so a batch stops on it, as on a refused key. A plain 500 to a request without a key is
    such only when the server fails a plain question too (`fails_everything`): a server that crashed
    on one prompt answers it."""
    key = _given(settings, "api_key", "LLM_API_KEY")
    try:
        error = parse_body(text).get("error") if text.lstrip().startswith("{") else None
    except (ValueError, AttributeError):
        error = None
    said = " ".join(str(error.get(name) or "") for name in ("message", "type")) if isinstance(error, dict) else ""
    if status in (400, 500) and re.search(r"no connected db|no_db_connection", said, re.IGNORECASE):
        return (f"the proxy has no database to check keys against (HTTP {status}: {server_message(text)}): give"
                f" {key} its master key, or connect its database")
    if status == 500 and not settings.api_key and text.strip() == "Internal Server Error" and fails_everything():
        return (f"HTTP 500 to every request without a key (its list of models too): a proxy that wants one"
                f" (LiteLLM's, with a master_key) answers so; set {key}")
    return None


def describe_redirect(status: int, location: Optional[str], settings: Settings, url: str) -> str:
    """Any 3xx, which is never followed: where it pointed (shown as a URL is shown), and that nothing goes there."""
    if not location:
        return (f"the endpoint answered HTTP {status}, a redirect that names no address: a request is not sent on;"
                f" check {_given(settings, 'url', 'LLM_API_URL')}")
    return (f"the endpoint answered HTTP {status}, a redirect to {display_url(urljoin(url, location))}: a request is"
            " not sent on to another address (the whole conversation would go with it); give that URL with --url if"
            " it is where the model is")


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
