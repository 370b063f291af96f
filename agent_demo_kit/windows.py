"""What a local server says of its model's context window (llama.cpp's /props, vLLM's /v1/models,
Ollama's /api/show), each asked within a deadline whatever the server sends, and kept for every run
of the process a while: a batch's tasks, run() in threads and arun() ask once.

It imports limits, records, settings, urls, endpoint_errors and replies.
"""
import re
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import requests
import urllib3

from agent_demo_kit.endpoint_errors import parse_body
from agent_demo_kit.limits import CHARS_A_TOKEN, DEFAULT_WINDOW_TOKENS, PINNED_SHARE, UNSAID_LOCAL_WINDOW_TOKENS
from agent_demo_kit.records import MOST_TOKENS_A_ROUND
from agent_demo_kit.replies import pieces_of
from agent_demo_kit.settings import Settings
from agent_demo_kit.urls import base_url, server_root

QUICK_SECONDS = 2.0  # the longest wait for a local server to say its model's window (or answer a plain question)
WINDOW_KEPT_SECONDS = 300.0  # asked again after this: the server may have restarted with another window
UNSAID_KEPT_SECONDS = 10.0  # a server that did not say (still starting, perhaps) is asked again sooner
MIN_WINDOW_TOKENS = 256  # a window said smaller than this is not taken for one
_windows: Dict[Tuple[str, str], Tuple[Optional[int], float]] = {}  # (URL, model) -> the window said, and when
_windows_kept = threading.Lock()


def known_window(session: requests.Session, settings: Settings) -> Optional[int]:
    """The window the local server of these settings said its model has (asked now, or a while ago by
    another run of this process), or None."""
    key = (settings.endpoint, settings.model)
    with _windows_kept:
        said, when = _windows.get(key, (None, -WINDOW_KEPT_SECONDS))
    if time.monotonic() - when >= (WINDOW_KEPT_SECONDS if said else UNSAID_KEPT_SECONDS):
        said = ask_window(session, settings)
        with _windows_kept:
            _windows[key] = said, time.monotonic()
    return said


def ask_window(session: requests.Session, settings: Settings) -> Optional[int]:
    """The context window a local server says its model has, in tokens, or None: llama.cpp's /props
    (n_ctx), vLLM's /v1/models (max_model_len), Ollama's /api/show (num_ctx, else the model's
    context_length). Each is asked briefly; one that does not answer is passed by."""
    root, base = server_root(settings.endpoint), base_url(settings.endpoint)
    quick = min(QUICK_SECONDS, settings.timeout)
    asks = [("GET", f"{root}/props", None), ("GET", f"{base}/models", None),
            ("POST", f"{root}/api/show", {"model": settings.model})]
    for method, url, body in asks:
        try:  # each ask ends by its deadline, whatever the server sends meanwhile (keep-alives, forever)
            response = session.request(method, url, json=body, timeout=quick, stream=True, allow_redirects=False)
            try:  # read whole, so that the connection goes back to the pool
                text = _within(pieces_of(response), time.monotonic() + quick, WINDOW_BODY_BYTES)
            except BaseException:
                response.close()
                raise
            found = window_in(parse_body(text.decode("utf-8", "replace")), settings.model) \
                if response.status_code == 200 and text else None  # a redirect's body says nothing of this server
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


# What a server says when a request is past its model's window: llama.cpp ("exceeds the available context size"),
# llama-cpp-python ("exceed context window of 8192"), vLLM and OpenAI ("maximum context length is 8192 tokens",
# "longer than the maximum model length of 8192"), Ollama and LM Studio ("n_ctx", "context length", "too many tokens").
OVERFLOW_WORDS = re.compile(r"context[ _](window|length|size)|n_ctx|too many tokens|maximum (context|tokens|length)"
                            r"|max(imum)?[ _]model[ _]len|longer than the maximum|prompt is too long|input length"
                            r"|exceeds? (the )?(context|max|maximum|available|limit)", re.I)
# Words that may be about a request's size, taken so only right after a request grew past any answered.
SIZE_WORDS = re.compile(r"\btokens?\b|\blength\b|too (long|large|big)|exceed", re.I)
WINDOW_NUMBER = re.compile(r"(?:context[ _](?:window|length|size)|n_ctx|maximum context length"
                           r"|max(?:imum)?[ _]model[ _]len(?:gth)?)\D{0,24}?(\d{3,7})", re.I)
CUT_OFF = re.compile(r"stream ended before the reply was complete|connection broke mid-reply"
                     r"|closed the connection without replying")


def past_window(status: Optional[int], said: str, guessed: bool, grew: bool) -> Tuple[bool, Optional[int]]:
    """Does a failed request read as one past the model's window, and which window does the error name?
    An HTTP 400, 413 or 500 whose text names a context window (or, right after the request grew past any
    answered, its tokens, length or size); or, right after it grew, a reply cut off or a connection closed
    by a local server that never said its window (guessed)."""
    if status in (400, 413, 500):
        named = bool(OVERFLOW_WORDS.search(said))
        number = WINDOW_NUMBER.search(said) if named else None
        return named or grew and bool(SIZE_WORDS.search(said)), int(number.group(1)) if number else None
    return not status and guessed and grew and bool(CUT_OFF.search(said)), None


class ModelWindow:
    """What a client knows of its model's window, in tokens: what the server said (asked once), else for
    a local server that says nothing UNSAID_LOCAL_WINDOW_TOKENS (or what --max-context asks beside a reply)
    until a request shows less, for a hosted one DEFAULT_WINDOW_TOKENS."""

    def __init__(self, settings: Settings, ask: Callable[[], Optional[int]], local: bool):
        self.settings, self.ask, self.local = settings, ask, local
        self.learned: Optional[int] = None
        self.said = self.guessed = False  # the server said it; it is a guess for a local server that did not
        self.guess_said = False  # the guess was said (when it first folded the conversation, or a request past it)
        self.largest_answered = 0  # characters of the largest request answered: it fits the window
        self.smallest_request = 0  # characters of the smallest request made (the first): no fold goes under it
        self.answered_since_fold = True  # a fold for a request past the window is made once till one is answered
        self.fits: Optional[int] = None  # characters: the most a request may take, after one past the window named none

    def tokens(self) -> int:
        if self.learned is None:
            said = self.ask()
            self.said, self.guessed = said is not None, said is None and self.local
            asked = -(-self.settings.max_context // 3) + (self.settings.max_reply_tokens or 0) \
                if self.settings.max_context else 0  # the user's word for it
            self.learned = said or (max(UNSAID_LOCAL_WINDOW_TOKENS, asked) if self.guessed else DEFAULT_WINDOW_TOKENS)
        return self.learned

    def held(self, chars: int) -> int:
        """A request budget of `chars` characters, kept to what a request past the window showed."""
        return chars if self.fits is None else min(chars, self.fits)

    def made(self, request_chars: int) -> None:
        self.smallest_request = min(self.smallest_request or request_chars, request_chars)

    def answered(self, request_chars: int) -> None:
        self.largest_answered = max(self.largest_answered, request_chars)
        self.answered_since_fold = True

    def guess_to_say(self) -> bool:
        """Is the guess to be said now (once, and not when --max-context set the budget)?"""
        first = self.guessed and not self.guess_said and self.settings.max_context is None
        self.guess_said = self.guess_said or first
        return first

    def past(self, status: Optional[int], said: str, request_chars: int, budget: Callable[[], int]) -> Tuple[
            bool, Optional[int], bool]:
        """Does a failed request read as one past the window (past_window), which window does it name, and is
        the conversation to be folded for it? When it reads so and folding can mend it, the window becomes the
        one named (kept for the next runs of the process); when none is named, or the request fit that one by
        our count, requests are kept to the largest one answered (at least three quarters of this one; halfway
        when that leaves the task no room for rounds). Once, until a request is answered again; left as it was
        when even the first request would not fit."""
        grew = 0 < self.largest_answered < request_chars  # a first request that fails did not grow: retried
        past, named = past_window(status, said, self.guessed, grew)
        if not past or not self.answered_since_fold:
            return past, named, False
        before = self.learned, self.said, self.guessed, self.fits
        if named and MIN_WINDOW_TOKENS <= named < self.tokens():
            self.learned, self.said, self.guessed = named, True, False
        if budget() >= request_chars:  # no window named, or one this request fits by our count: it is what failed
            answered = self.largest_answered  # it fit; this request did not: the window lies in between
            shown = max(answered, request_chars * 3 // 4)
            if shown * PINNED_SHARE < self.smallest_request:  # no room for rounds beside the task: try halfway
                shown = (answered + request_chars) // 2
            self.fits = min(self.fits or shown, shown)
        if budget() < self.smallest_request:  # not even the task would fit: folding cannot mend it
            self.learned, self.said, self.guessed, self.fits = before
            return past, named, False
        if self.said and self.learned == named and self.local:
            keep_window(self.settings, named)
        self.answered_since_fold, self.guess_said = False, True
        return past, named, True

    def folded(self, request_chars: int, status: Optional[int], budget: int) -> str:
        """The note that says a request past the window was folded to fit, and the budget from now on."""
        why = f"the server says it holds {self.learned:,} tokens" if self.said and self.fits is None \
            else f"HTTP {status}" if status \
            else "the server cut it off and says no window" if self.guessed else "the server cut it off"
        return (f"the request of about {request_chars // CHARS_A_TOKEN:,} tokens seems past the model's window"
                f" ({why}): requests are kept to {budget:,} characters from now on, and this one is folded to fit"
                " and sent again; --max-context sets the budget")

    def unmended(self, error: str, request_chars: int, named: Optional[int]) -> str:
        """The error of a request past the window that folding cannot mend: what the server said, the window
        and what to change."""
        window = f"window of {named or self.learned:,} tokens" if named or self.said else \
            "window, which the server does not say" if self.guessed else "window"
        larger = "give the server a larger window (llama.cpp: --ctx-size; llama-cpp-python: --n_ctx)"
        return (f"{error}: the request of about {request_chars // CHARS_A_TOKEN:,} tokens seems past the model's"
                f" {window}, and " + (f"folding the conversation did not make it fit: {larger}, or --max-context a"
                                      " smaller budget" if not self.answered_since_fold else
                                      f"even the task takes about {self.smallest_request // CHARS_A_TOKEN:,}:"
                                      f" {larger}, or a shorter task"))

    def suspected(self, said: str, request_chars: int) -> str:
        """What to add to the error of a request a local server that says no window kept cutting off."""
        if not self.guessed or not CUT_OFF.search(said):
            return ""
        return (f"; a server that does not say its window may cut off a request past it: this one took about"
                f" {request_chars // CHARS_A_TOKEN:,} tokens (give the server a larger window, or --max-context a"
                " smaller budget)")


def keep_window(settings: Settings, tokens: int) -> None:
    """A window the local server named (in an error) is kept as if it had said it, for the next runs."""
    with _windows_kept:
        _windows[(settings.endpoint, settings.model)] = tokens, time.monotonic()
