"""The endpoint: one session to the chat-completions URL and one loop that decides after each
attempt whether to retry, to change the request's form, or to give up. What comes back is read
into a Reply by replies.py; what went wrong is worded by endpoint_errors.py.

The client owns what it negotiated with the endpoint (`RequestForm`): the mode that
works, schema mode's response_format variant, the reply cap's field name, streaming.
It builds every request body from it, and the trace records each change, so a resume starts there.
"""
import contextlib
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import requests
import requests.auth
import urllib3
from urllib3.exceptions import InvalidHeader, MaxRetryError
from urllib3.util.retry import Retry

from agent_demo_kit import prompts
from agent_demo_kit.records import Reply, RunEvents
from agent_demo_kit.endings import EndpointError, Interrupted
from agent_demo_kit.settings import Settings
from agent_demo_kit.limits import (CHARS_A_TOKEN, CONNECT_SECONDS, MIN_LIMIT_TOKENS, MOST_ABSORBED, PINNED_SHARE,
                                   REPLY_BYTES_A_CHAR, REPLY_CHARS_A_TOKEN)
from agent_demo_kit.endpoint_errors import (RETRY_STATUSES, describe_http_error, describe_network_error,
                                            describe_redirect, proxy_set_up_wrong)
from agent_demo_kit.replies import (CUTOFFS, AttemptFailed, Stalled, TextListener, bounded, past_deadline, pieces_of,
                                    read_stream, reply_from_body)
from agent_demo_kit.urls import base_url, is_local  # noqa: F401  (is_local: agent_demo_kit.client's too)
from agent_demo_kit.windows import QUICK_SECONDS, ModelWindow, known_window



# --- reading a reply --------------------------------------------------------------------------


# --- asking ---------------------------------------------------------------------------------

MIN_REPLY_TOKENS = 128  # the smallest reply a request leaves room for
CAP_FIELD_CHARS = 32  # what the reply cap adds to a request: ', "max_completion_tokens": 4096' and some
# What a streamed request carries besides a plain one: the client sends it, the budget counts it.
STREAM_FIELDS = {"stream": True, "stream_options": {"include_usage": True}}


REPLY_CAP_FIELDS = ("max_tokens", "max_completion_tokens")
JSON_BODY = {"Content-Type": "application/json"}  # what requests says of a json= body


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


Request = Callable[[], List[dict]]  # builds the messages for the current form

# Connections kept open to one endpoint: more runs at once than this open connections of their own for a
# while, and close them after.
MOST_CONNECTIONS_A_HOST = 64
_pool: Optional[requests.adapters.HTTPAdapter] = None
_pool_made = threading.Lock()


def shared_connections() -> requests.adapters.HTTPAdapter:
    """The process's one pool of connections: every run's requests to an endpoint reuse the connections
    kept open to it, whether the runs come from run() in threads, arun() or a batch. (A pool is per
    host, port and TLS setting, so runs with other keys or CA bundles share only the sockets.)"""
    global _pool
    with _pool_made:
        if _pool is None:
            _pool = requests.adapters.HTTPAdapter(pool_maxsize=MOST_CONNECTIONS_A_HOST)
        return _pool


class SharedSession(requests.Session):
    """A session on the shared connections: closing it closes none of them."""

    def __init__(self) -> None:
        super().__init__()
        for prefix in ("https://", "http://"):
            self.mount(prefix, shared_connections())

    def close(self) -> None:
        """Nothing of its own to close: the connections are the process's."""


class ModelClient:
    """Sends the conversation to the endpoint over one session."""

    def __init__(self, settings: Settings, trace: Optional[RunEvents] = None, form: Optional[RequestForm] = None,
                 session: Optional[requests.Session] = None, gate: Any = None):
        self.settings, self.trace = settings, trace or RunEvents()
        self.gate = gate  # a batch's one limit on requests in flight, shared by its tasks (and their stronger models)
        self.form = form or RequestForm.asked_for(settings)
        self.url = settings.endpoint
        self.on_text: Optional[TextListener] = None  # shown each piece of a streamed reply
        self.session = session or SharedSession()  # a batch worker's is reused
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
        local = is_local(self.url)
        self.windowing = ModelWindow(settings, lambda: known_window(self.session, settings) if local else None, local)
        self.cap_shrunk = False  # the reply cap was shrunk to fit, and the trace said so
        self.stop: Optional[threading.Event] = None  # the run's, while it asks
        self.encoded: Tuple[Any, str] = (None, "")  # the last body made, and its JSON as it is sent
        self.encoded_for: tuple = ()  # what it was made of, when its messages were plain

    def body(self, messages: List[dict], tools: Dict[str, Any]) -> dict:
        """The request body, exactly as sent, in the current form, offering `tools` (every tool in use):
        the conversation measures it with this too. Its reply cap is --max-reply-tokens, or what the
        model's window leaves beside the request when that is less."""
        form, settings = self.form, self.settings
        options = prompts.request_options(form.mode, tools, settings.max_calls, form.schema_variant)
        # The system prompt and the task again (the checks that the task fits, then the first request):
        # the body made for them, not written again. Kept as text, which no later change to them reaches.
        same = plain_messages(messages) if len(messages) <= 2 else None, options, form.shape(), settings.model
        if same[0] is not None and same == self.encoded_for:
            return self.encoded[0]
        body = {"model": settings.model, "messages": messages, **options, **(STREAM_FIELDS if form.stream else {})}
        text = json.dumps(body, allow_nan=False)  # as requests writes json=: measured and sent, made once
        cap = self.reply_cap(len(text))
        if cap:  # the field goes last, as a dict that gets it last is written
            body, text = {**body, form.reply_cap_field: cap}, f"{text[:-1]}, {json.dumps(form.reply_cap_field)}: {cap}}}"
        self.encoded, self.encoded_for = (body, text), same
        self.windowing.made(len(text))
        return body

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
        --max-reply-tokens (at most half the window; a quarter when there is no cap). In a window too
        small for the task to take at most PINNED_SHARE of that, the reply gives way, down to
        MIN_REPLY_TOKENS; never more than a request past the window showed it holds."""
        window, wanted = self.window(), self.settings.max_reply_tokens
        reserve = min(wanted, window // 2) if wanted else window // 4
        chars = (window - max(reserve, MIN_REPLY_TOKENS)) * CHARS_A_TOKEN
        needed = int(self.windowing.smallest_request / PINNED_SHARE)
        if chars < needed:
            chars = min(needed, (window - MIN_REPLY_TOKENS) * CHARS_A_TOKEN)
        return self.windowing.held(chars)

    def window_notes(self) -> List[str]:
        """What a run says once, before its first request, about the window: a --max-context it does not hold."""
        asked = self.settings.max_context
        if asked is None or asked <= self.most_chars():
            return []
        return [f"{self.settings.named('max_context')} {asked:,} is more than the model's window of"
                f" {self.window():,} tokens holds: requests are kept under {self.most_chars():,} characters"]

    def window(self) -> int:
        """The model's context window in tokens (windows.ModelWindow)."""
        return self.windowing.tokens()

    def folding(self) -> None:
        """The conversation is folded to fit the budget: the first time that comes of a window the server
        never said, the trace says so, and how to set another."""
        if self.windowing.guess_to_say():
            self.trace.note(f"the server does not say its model's window: requests are kept to what {self.window():,}"
                            f" tokens hold ({self.most_chars():,} characters); --max-context CHARS sets another budget")

    def overflowed(self, failure: AttemptFailed, request_chars: int) -> bool:
        """Did this request fail as one past the model's window does (windows.past_window)? Then, once for
        each size of request, the window (or the budget) is made smaller and the conversation folded to fit
        before the request goes again; when folding cannot mend it (not even the task would fit, or it was
        folded for already), EndpointError at once, naming the window: the same request is not sent again."""
        past, named, folded = self.windowing.past(failure.status, f"{failure} {failure.text or ''}", request_chars,
                                                  self.request_budget)
        if folded:
            self.trace.note(self.windowing.folded(request_chars, failure.status, self.request_budget()))
        elif past:
            error = self.http_error(failure, retried=False) if failure.status else failure
            raise EndpointError(self.windowing.unmended(str(error), request_chars, named), failure.status,
                                failure.said) from None
        return folded

    def ask(self, request: Request, tools: Dict[str, Any], stop: Optional[threading.Event] = None) -> Tuple[
            Reply, List[dict]]:
        """Send the request until it brings a reply: retry what may pass next time (429, 5xx, a
        dropped connection, a timeout), build it again in another form when the endpoint refuses
        this one, and raise EndpointError when neither helps. Returns the reply and the messages sent.
        Once `stop` is set (a cancelled arun), Interrupted instead of the next wait or request."""
        retry = Retry(total=self.settings.retries, backoff_factor=self.settings.backoff_factor,
                      status_forcelist=RETRY_STATUSES, allowed_methods=None)
        started, absorbed, self.stop = time.monotonic(), 0, stop
        while True:
            messages = request()
            if stop is not None and stop.is_set():
                raise Interrupted()
            body = self.body(messages, tools)
            try:
                with self.gate.slot(stop) if self.gate else contextlib.nullcontext((0, 1)) as sent:
                    reply = self.attempt(body)
            except AttemptFailed as failure:
                if self.overflowed(failure, len(self.encoded[1]) if self.encoded[0] is body else len(json.dumps(body))):
                    continue  # request() folds the conversation to the smaller window
                if self.waits_its_turn(failure, sent, absorbed):
                    absorbed += 1
                elif not (failure.status and self.change_form(failure)):
                    retry = self.wait_to_retry(retry, failure)
                continue
            if self.gate:
                self.gate.answered_one()
            self.windowing.answered(len(self.encoded[1]) if self.encoded[0] is body else 0)
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
            raise self.http_error(failure, retried=False)
        raw = getattr(failure.response, "raw", None)
        try:
            retry = retry.increment("POST", self.url, response=raw, error=None if raw else failure)
        except MaxRetryError:
            if failure.status:
                raise self.http_error(failure) from None
            raise EndpointError(f"{failure} (after {retries} retries)" + self.windowing.suspected(
                str(failure), len(self.encoded[1])), unreachable=failure.unreachable) from None
        try:
            wait = retry.get_retry_after(raw) if raw is not None else None
        except InvalidHeader:
            wait = None
        wait = min(self.settings.max_retry_wait, retry.get_backoff_time() if wait is None else wait)
        cause = f"HTTP {failure.status}" if failure.status else re.split(r": | \(| from http", str(failure))[0]
        self.trace.retry(cause, retries - retry.total, retries, wait)
        self.pause(wait)
        return retry

    def http_error(self, failure: AttemptFailed, retried: bool = True) -> EndpointError:
        """The EndpointError of a failed status: in words, and marked when the endpoint is a proxy that is
        not set up for these requests (a batch stops on it)."""
        set_up = proxy_set_up_wrong(failure.status, failure.text, self.settings, self.fails_everything)
        said = set_up + (f" (after {self.settings.retries} retries)" if retried else "") if set_up else \
            describe_http_error(failure.status, failure.text, self.settings, retried)
        return EndpointError(said, failure.status, failure.said, set_up_wrong=bool(set_up))

    def fails_everything(self) -> bool:
        """Does the server answer a plain question (its list of models) with a plain HTTP 500 too?"""
        try:
            response = self.session.get(f"{base_url(self.url)}/models", allow_redirects=False,  # nothing goes elsewhere
                                        timeout=min(QUICK_SECONDS, self.settings.timeout))
            return response.status_code == 500 and response.text.strip() == "Internal Server Error"
        except requests.RequestException:
            return False

    def pause(self, seconds: float) -> None:
        """Wait before sending again; Interrupted at once when the run (or its batch) is told to stop."""
        if self.gate:
            self.gate.sleep(seconds, self.stop)
        elif self.stop is not None and self.stop.wait(seconds):
            raise Interrupted()
        elif self.stop is None:
            time.sleep(seconds)

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
        self.gate.sleep(wait, self.stop)
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
        text = self.encoded[1] if self.encoded[0] is body else json.dumps(body, allow_nan=False)
        try:  # the read timeout is the longest wait for the next bytes, not for the whole reply
            response = self.session.post(self.url, data=text.encode("utf-8"), headers=JSON_BODY, stream=True,
                                         timeout=(min(CONNECT_SECONDS, timeout), timeout), allow_redirects=False)
        except requests.RequestException as error:
            said = describe_network_error(error, self.settings, self.url)
            raise AttemptFailed(said, unanswered=isinstance(error, requests.ReadTimeout),
                                unreachable=said.startswith("cannot reach")) from None
        if 300 <= response.status_code < 400:  # followed, the whole conversation would go where the endpoint says
            response.close()
            raise EndpointError(describe_redirect(response.status_code, response.headers.get("Location"),
                                                  self.settings, self.url))
        streamed = body.get("stream") and response.ok and "text/event-stream" in response.headers.get(
            "Content-Type", "")
        most_chars = max(body.get(self.form.reply_cap_field) or self.window(), MIN_LIMIT_TOKENS) * REPLY_CHARS_A_TOKEN
        allowed = self.settings.reply_deadline
        try:
            with CUTOFFS.at(response, asked_at + allowed) as watched:  # a chunk that never ends is cut then
                pieces = pieces_of(response, whole_chunks=watched)
                if streamed:
                    reply = read_stream(pieces, self.on_text, asked_at + allowed, most_chars,
                                        self.settings.max_calls, allowed)
                else:
                    text = bounded(pieces, most_chars * REPLY_BYTES_A_CHAR, asked_at + allowed, allowed).decode(
                        response.encoding or "utf-8", "replace")
                    if time.monotonic() >= asked_at + allowed:  # a body that ends at its close was cut there
                        raise past_deadline(allowed)
            if streamed:
                let_go(response, pieces, reply.unread)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            response.close()
            if time.monotonic() >= asked_at + allowed:  # cut off inside a chunk (CUTOFFS)
                raise past_deadline(allowed) from None
            if "timed out" in str(error).lower():
                raise AttemptFailed(f"the reply stopped arriving: nothing more came within {timeout:g} s") from None
            raise AttemptFailed(f"the reply stopped arriving: the connection broke mid-reply"
                                f" ({type(error).__name__})") from None
        except (Stalled, Interrupted):  # Interrupted: the run was told to stop mid-reply
            response.close()
            raise
        except (AttemptFailed, EndpointError) as error:
            response.close()
            if time.monotonic() >= asked_at + allowed:  # a stream that ends at its close, cut there
                raise past_deadline(allowed) from None
            raise AttemptFailed(str(error)) from None
        if streamed:
            return reply
        if response.status_code >= 400:
            raise AttemptFailed(f"HTTP {response.status_code}", response.status_code, text, response)
        return reply_from_body(text)

    def record_to(self, trace: RunEvents) -> None:
        """Report what happens (retries, a changed form) to the run's trace, once it is made."""
        self.trace = trace

    def close(self) -> None:
        """The connections stay open in the shared pool, for the next run."""


def plain_messages(messages: List[dict]) -> Optional[Tuple[str, ...]]:
    """The roles and texts of messages that hold nothing else, as they stand now; else None."""
    said: List[str] = []
    for message in messages:
        if len(message) != 2 or not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            return None
        said += (message["role"], message["content"])
    return tuple(said)


LINGER_SECONDS = 1.0  # how long what follows a streamed reply's [DONE] is read, for its connection's sake


def let_go(response: requests.Response, pieces: Iterator[bytes], unread: Optional[str]) -> None:
    """After a whole reply, what follows its [DONE] is read for LINGER_SECONDS at most, so that the
    connection goes back to the pool; a stream that goes on (keep-alives after [DONE]), or a reply cut
    at a limit (`unread`: the rest may never end), loses its connection instead."""
    if unread:
        response.close()
        return
    until = time.monotonic() + LINGER_SECONDS
    try:
        with CUTOFFS.at(response, until) as watched:
            if not watched:  # a connection that closes after this reply: nothing to keep it for
                response.close()
                return
            for _ in pieces:
                if time.monotonic() > until:
                    response.close()
                    return
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
        response.close()


def quota_spent(said: str) -> bool:
    """Does a 429 say the account's quota is spent (OpenAI's insufficient_quota), which no wait mends?"""
    return re.search(r"insufficient_quota|exceeded your current quota|billing", said, re.I) is not None


def refuses_options(status: Optional[int], said: str, mode_worked: bool) -> bool:
    """Did the endpoint refuse response_format or tools (as opposed to failing for another reason)?"""
    names_them = any(name in said for name in ("response_format", "json_schema", "tools", "tool_choice"))
    if status in (400, 422):  # a first request refused, or one that says why
        return names_them or not mode_worked
    return bool(status and status >= 500 and names_them)
