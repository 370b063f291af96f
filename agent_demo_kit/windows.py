"""What a local server says of its model's context window (llama.cpp's /props, vLLM's /v1/models,
Ollama's /api/show), each asked within a deadline whatever the server sends, and kept for every run
of the process a while: a batch's tasks, run() in threads and arun() ask once.

It imports records, settings, urls, endpoint_errors and replies.
"""
import re
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import requests
import urllib3

from agent_demo_kit.endpoint_errors import parse_body
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
