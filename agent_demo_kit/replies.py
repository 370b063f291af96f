"""Reading what the endpoint sends back into one Reply, from a plain JSON body or from server-sent
events, within limits on its size and its time.

Servers differ: CRLF or LF line ends, comments and `event:` lines, a `data:` field split over
several lines, a usage chunk with no choices, `[DONE]` or just the end of the stream, tool-call
arguments in pieces. All of it is folded into the same Reply a plain request gives.

It imports prompts, records, endings, settings and endpoint_errors.
"""
import contextlib
import heapq
import itertools
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import requests

from agent_demo_kit import prompts
from agent_demo_kit.endings import EndpointError
from agent_demo_kit.endpoint_errors import HTML_PAGE, one_line, parse_body, server_message
from agent_demo_kit.records import Reply
from agent_demo_kit.limits import REPLY_BYTES_A_CHAR, SNIPPET_CHARS

TextListener = Callable[[str], None]  # gets each piece of a streamed reply as it arrives


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
            raise EndpointError(f"the endpoint reported an error mid-reply: {one_line(str(message))}")
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
                raise past_deadline(allowed)
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


def past_deadline(allowed: float) -> "Stalled":
    return Stalled(f"the reply did not end within --reply-deadline {allowed:g} s (its server kept sending,"
                   " keep-alives or pieces): cut off")


def bounded(pieces: Iterator[bytes], most_bytes: int, deadline: float, allowed: float) -> bytes:
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


def pieces_of(response: requests.Response, whole_chunks: bool = False) -> Iterator[bytes]:
    """The body as it arrives, each piece as soon as it does (the socket's read timeout is --timeout).
    whole_chunks: a chunked body a chunk at a time (each event of a stream is one, or a few), which
    costs a third of a read per arrival; a chunk that never ends is then the caller's to cut (CUTOFFS)."""
    raw = response.raw
    if whole_chunks and getattr(raw, "chunked", False) and getattr(raw, "supports_chunked_reads", bool)():
        return raw.read_chunked(65536, decode_content=True)
    read_some = getattr(raw, "read1", None)  # what has arrived, without waiting for a full buffer
    return (iter(lambda: read_some(65536, decode_content=True), b"") if read_some
            else response.iter_content(1024))  # urllib3 1.x has no read1


class Cutoffs:
    """Ends the connection of a reply still being read once its deadline has passed: a read that waits
    inside one chunk (a server that says a long one is coming, then sends it a byte at a time, each
    within --timeout) returns, and the reader finds the time past. One thread for the process looks
    each CUTOFF_TICK, while replies are being read: a reply costs two turns of a lock, no wake-up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: List[list] = []  # a heap of [when, n, the response (None: it owns the socket), its socket
        # (None once read)]
        self._watched = 0  # entries of _due still being read
        self._numbers = itertools.count()
        self._thread: Optional[threading.Thread] = None

    @contextlib.contextmanager
    def at(self, response: requests.Response, when: float) -> Iterator[bool]:
        """While the body is read, its connection is cut once `when` (time.monotonic) has passed. Gives
        whether it can be (when no socket is found, the body must be read a piece as it arrives, each
        piece timed)."""
        pooled = getattr(getattr(response.raw, "connection", None), "sock", None)
        sock = pooled if pooled is not None else _owned_socket(response.raw)
        entry = [when, next(self._numbers), response.raw if pooled is not None else None, sock]
        if sock is not None:
            with self._lock:
                while self._due and self._due[0][3] is None:  # the replies read since: let go of them
                    heapq.heappop(self._due)
                heapq.heappush(self._due, entry)
                self._watched += 1
                if self._thread is None or not self._thread.is_alive():  # none yet, idle, or a forked child's
                    self._thread = threading.Thread(target=self._watch, daemon=True, name="reply-deadlines")
                    self._thread.start()
        try:
            yield sock is not None
        finally:
            if sock is not None:
                with self._lock:
                    entry[3] = None
                    self._watched -= 1

    def _watch(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(CUTOFF_TICK)
            now = time.monotonic()
            with self._lock:
                if len(self._due) > 2 * self._watched + 64:  # read ones behind a long one still being read
                    self._due = [entry for entry in self._due if entry[3] is not None]
                    heapq.heapify(self._due)
                while self._due and (self._due[0][3] is None or self._due[0][0] <= now):
                    _, _, raw, sock = heapq.heappop(self._due)
                    if sock is None:
                        continue
                    if raw is None:  # the reply's own socket: no other request will use it
                        _shut(sock)
                        continue
                    connection = getattr(raw, "connection", None)  # None once the reply was read whole
                    if connection is not None and getattr(connection, "sock", None) is sock:  # not back in the pool
                        _shut(sock)
                if self._due:
                    idle_since = now
                elif now - idle_since > CUTOFF_IDLE:  # nothing read for a while: the next reply starts another
                    self._thread = None
                    return


def _owned_socket(raw: Any) -> Any:
    """The socket of a reply that says "Connection: close": http.client hands it from the connection
    to the response, which closes it after the body; it is reached through the response's file
    (private attributes of http.client and socket, the same from Python 3.6 to 3.13), or None."""
    try:
        return raw._fp.fp.raw._sock
    except AttributeError:
        return None


def _shut(sock: Any) -> None:
    """Shut a connection's socket both ways; through a proxy, HTTPS inside HTTPS is urllib3's
    SSLTransport, which has none of its own: the socket it wraps is shut."""
    shutdown = getattr(sock, "shutdown", None) or getattr(getattr(sock, "socket", None), "shutdown", None)
    try:
        if shutdown is not None:
            shutdown(socket.SHUT_RDWR)
    except Exception:  # noqa: BLE001 - whatever a socket says, the watcher goes on for the other replies
        pass


CUTOFF_TICK = 0.1  # how late past its deadline a reply waiting inside a chunk is cut, at most
CUTOFF_IDLE = 60.0  # seconds with no reply being read before the thread that cuts them ends


CUTOFFS = Cutoffs()


def reply_from_body(text: str) -> Reply:
    """Pull the message out of a chat-completions body, or say why it is unusable."""
    try:
        body = parse_body(text)
    except ValueError:
        if HTML_PAGE.match(text):  # a proxy's login page, say
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
