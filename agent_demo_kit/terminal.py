"""What a person sees, and the one way text leaves the process.

Every stream (stdout, stderr, the trace file, the approval question on the terminal)
is a `SafeStream` over the same `Redactor`, so no output path can forget the key.
`Screen` is the round-by-round trace people read: colour, shortened think blocks and
a live status line on a terminal; plain text off one (a pipe, a file, NO_COLOR).
"""
import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time
import unicodedata
from typing import Any, Callable, Iterator, List, Optional, TextIO
from urllib.parse import quote, quote_plus

from agent_demo_kit.endings import OutputClosed

def to_json(value: Any) -> str:
    """JSON as people (and the model) read it: compact, non-ASCII kept readable."""
    return json.dumps(value, ensure_ascii=False)


REDACTED = "[redacted]"
# A key shorter than this is a placeholder ("5", "none"): redacted only where it stands
# as a whole token, so the result 1536 does not become 1[redacted]36.
MIN_SECRET_CHARS = 8
# A cut (a message or a result shortened to a length) can leave a long secret's first or last
# characters: this many of them, or more, are redacted too.
FRAGMENT_CHARS = 12


class Redactor:
    """Replaces each secret (the keys, a password in the URL), and the forms it takes inside JSON
    and URLs, with [redacted]."""

    def __init__(self, *secrets: Optional[str]):
        self.secrets: List[str] = []
        self.forms: List[str] = []
        self.pattern: Optional["re.Pattern"] = None
        self.longest = 0
        self.add(*secrets)

    def add(self, *secrets: Optional[str]) -> None:
        """Redact these too (a URL password known only once the flags are read)."""
        self.secrets += [secret for secret in secrets if secret and secret not in self.secrets]
        self.forms, patterns = [], []
        for secret in self.secrets:
            forms = sorted({secret, json.dumps(secret)[1:-1], quote(secret, safe=""), quote_plus(secret)},
                           key=len, reverse=True)
            self.forms += forms
            either = "|".join(map(re.escape, forms))
            patterns.append(either if len(secret) >= MIN_SECRET_CHARS
                            else rf"(?<![A-Za-z0-9])(?:{either})(?![A-Za-z0-9])")
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
        self.longest = max(map(len, self.forms), default=0)

    def __call__(self, text: str) -> str:
        if not self.pattern:
            return text
        return self._fragments(self.pattern.sub(REDACTED, text))

    def _fragments(self, text: str) -> str:
        """A long secret's beginning or end left by a cut (a server message or a result shortened to a
        length, "...[truncated N chars]..."): FRAGMENT_CHARS or more of its first or last characters."""
        for form in self.forms:
            if len(form) < 2 * FRAGMENT_CHARS:
                continue
            head, tail = form[:FRAGMENT_CHARS], form[-FRAGMENT_CHARS:]
            for seed, forward in ((head, True), (tail, False)):
                start = text.find(seed)
                while start != -1:
                    if forward:  # as much of the secret as follows its first characters
                        end = start + FRAGMENT_CHARS
                        while end < len(text) and end - start < len(form) and text[end] == form[end - start]:
                            end += 1
                    else:  # as much of the secret as comes before its last characters
                        end, start = start + FRAGMENT_CHARS, start
                        while start > 0 and end - start < len(form) and text[start - 1] == form[-(end - start) - 1]:
                            start -= 1
                    text = text[:start] + REDACTED + text[end:]
                    start = text.find(seed, start + len(REDACTED))
        return text

    def unsafe_tail(self, text: str) -> int:
        """How many characters at the end of text could be the start of a secret still being written."""
        for size in range(min(len(text), self.longest - 1), 0, -1):
            tail = text[-size:]
            if any(form.startswith(tail) for form in self.forms):
                return size
        return 0


def printable(text: str) -> str:
    """text that any UTF-8 stream takes: a lone surrogate (from a "\\ud83d" escape) becomes "?"."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


class SafeStream:
    """A text stream that redacts everything written to it and never raises on odd text.

    A secret written in pieces (a reply streamed token by token) is still caught: the
    end of what was written is held back while it could be the start of a secret.
    When the stream cannot be written (its reader went away, a full disk), `if_broken`
    says what follows: "end" raises OutputClosed once (stdout: the answer is lost),
    "drop" drops this and later writes (the trace on stderr: the run goes on), and
    "raise" lets the OSError through (the trace file: its owner decides).
    """

    def __init__(self, stream: TextIO, redactor: Redactor, if_broken: str = "raise"):
        self.stream, self.redactor, self.if_broken = stream, redactor, if_broken
        self._pending = ""
        self.broken = False

    def write(self, text: str) -> int:
        self._pending += text
        self._emit(hold=self.redactor.unsafe_tail(self._pending))
        return len(text)

    def flush(self) -> None:
        self._emit(hold=self.redactor.unsafe_tail(self._pending))
        self._guarded(self.stream.flush)

    def finish(self) -> None:
        """Write out everything held back: nothing more is coming, so it cannot be a key's start."""
        self._emit(hold=0)
        self._guarded(self.stream.flush)

    def close(self) -> None:
        try:
            self.finish()
        finally:
            self.stream.close()

    def _emit(self, hold: int) -> None:
        cut = len(self._pending) - hold
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        if ready:
            self._guarded(lambda: self.stream.write(printable(self.redactor(ready))))

    def _guarded(self, write) -> None:
        if self.broken:
            return
        try:
            write()
        except (OSError, ValueError) as error:  # ValueError: the stream was closed under us
            if self.if_broken == "raise":
                raise
            self.broken = True
            _silence(self.stream)
            if self.if_broken == "end":
                raise OutputClosed(f"the output could not be written: {error}") from None

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ... of the stream underneath
        return getattr(self.stream, name)


@contextlib.contextmanager
def protected(redactor: Redactor) -> Iterator[SafeStream]:
    """stdout and stderr through the redacting writer while the block runs; yields stdout.
    A stream that is closed (`>&-`) or cannot be written (`>/dev/full`) costs no traceback."""
    plain = sys.stdout, sys.stderr
    sys.stdout = SafeStream(plain[0] or open(os.devnull, "w"), redactor, if_broken="end")
    sys.stderr = SafeStream(plain[1] or open(os.devnull, "w"), redactor, if_broken="drop")
    answer = sys.stdout
    try:
        yield answer
    finally:
        for stream in (answer, sys.stderr):
            with contextlib.suppress(OutputClosed):
                stream.finish()
        sys.stdout, sys.stderr = plain


@contextlib.contextmanager
def stray_prints_to_stderr() -> Iterator[None]:
    """While the run lasts, a print() that is not the answer (a user's tool) goes to stderr,
    so stdout holds only the answer."""
    saved = sys.stdout
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = saved


def _silence(stream: TextIO) -> None:
    """Point a stream whose reader is gone at /dev/null, so the interpreter's last flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, AttributeError, ValueError):  # not a real file (a test's capture)
        pass


# --- the screen -------------------------------------------------------------------------

_COLOURS = {"header": "1;36", "action": "33", "ok": "32", "error": "31", "note": "35", "dim": "2",
            "finished": "1;32", "stopped": "1;31"}


def shorten_think(text: str) -> str:
    """Each thought as its first line and its size, tags kept; the trace file keeps it whole."""
    from agent_demo_kit.actions import think_pieces
    return "".join(opening + (_summary(piece) if opening or closing else piece) + closing
                   for opening, piece, closing in think_pieces(text))


def _summary(thought: str) -> str:
    """A thought as its first line (at most 80 characters) and, if that is not all, its size."""
    thought = thought.strip()
    first = thought.split("\n", 1)[0][:80]
    return first + (f" … ({len(thought):,} chars)" if first != thought else "")


class Screen:
    """Where the human trace goes: a stream, with colour and a live status line when it is a terminal."""

    def __init__(self, stream: TextIO, colour: bool = False, live: bool = False,
                 redactor: Optional[Redactor] = None):
        self.stream, self.colour, self.live = stream, colour, live
        self.redactor = redactor or Redactor()
        self._lock = threading.Lock()
        self._status: Optional[str] = None  # the live line now shown, if any

    def paint(self, kind: str, text: str) -> str:
        if not (self.colour and kind in _COLOURS):
            return text
        body = text.lstrip("\n")  # a blank line before a header stays outside its colour
        return text[:len(text) - len(body)] + f"\033[{_COLOURS[kind]}m{body}\033[0m"

    def say(self, text: str, kind: Optional[str] = None) -> None:
        with self._lock:
            self._clear_status()
            print(self.paint(kind, text) if kind else text, file=self.stream, flush=True)

    def show_reply(self, header: str, reply: Any) -> None:
        """What the model said, before its calls run (and before --approve asks about them)."""
        self.say(header, "header")
        if reply.reasoning.strip():
            self.say(f"thinking: {_summary(reply.reasoning)}", "dim")
        shown = shorten_think(reply.content.strip()) or (to_json(reply.tool_calls) if reply.tool_calls
                                                         else f"(empty reply, finish_reason {reply.finish_reason})")
        self.say("model: " + shown)

    def show_round(self, record: Any) -> None:
        """The round's calls, with the watchdog's word and each result."""
        for number, call in enumerate(record.calls, 1):
            label = f"action {number}/{len(record.calls)}" if len(record.calls) > 1 else "action"
            self.say(f"{label}: {call.tool} {to_json(call.args)}", "action")
            if call.watchdog:
                self.say(f"watchdog: {call.watchdog}", "note")
            if not call.ends_run:
                self.say(f"result: {to_json(call.result)}", "ok" if call.result.get("ok") else "error")
        if not record.calls:
            self.say(f"result: {to_json(record.result)}", "error")

    def _clear_status(self) -> None:
        if self._status is not None:  # spaces, not an escape code: no escape codes at all under NO_COLOR
            self.stream.write("\r" + " " * sum(map(_columns, self._status)) + "\r")
            self._status = None

    @contextlib.contextmanager
    def working(self) -> Iterator["Status"]:
        """While the model works: a status line with the seconds so far and the reply's latest words."""
        status = Status()
        if not self.live:
            yield status
            return
        stop = threading.Event()
        thread = threading.Thread(target=self._show, args=(status, stop), daemon=True, name="live-status")
        thread.start()
        try:
            yield status
        finally:
            stop.set()
            thread.join()
            with self._lock:
                self._clear_status()
                self.stream.flush()

    def _show(self, status: "Status", stop: threading.Event) -> None:
        while not stop.wait(0.2):
            width = shutil.get_terminal_size((80, 24)).columns - 1
            line = status.line(width, self.redactor)
            with self._lock:
                self._clear_status()
                self.stream.write(self.paint("dim", line))
                self.stream.flush()
                self._status = line


def _columns(character: str) -> int:
    """How many terminal columns a character takes: two for wide (CJK) ones."""
    return 2 if unicodedata.east_asian_width(character) in "WF" else 1


def _last_columns(text: str, room: int) -> str:
    """The end of text that fits in `room` terminal columns."""
    used, start = 0, len(text)
    while start > 0 and used + _columns(text[start - 1]) <= room:
        start -= 1
        used += _columns(text[start])
    return text[start:]


class Status:
    """What the live line shows: seconds since the request went out, and the reply as it arrives."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.pieces: List[str] = []
        self.size = 0

    def feed(self, piece: str) -> None:
        """A piece of a streamed reply (called from the thread that reads it)."""
        self.pieces.append(piece)
        self.size += len(piece)
        if len(self.pieces) > 256:  # only the end is shown: keep the list short
            self.pieces = ["".join(self.pieces)[-2000:]]

    def line(self, width: int, redactor: Redactor) -> str:
        """One line that fits the terminal: 'model working 12 s (340 chars): ...the latest words'."""
        head = f"model working {time.monotonic() - self.started:.0f} s"
        if not self.size:
            return (head + " …")[:width]
        tail = redactor(" ".join("".join(self.pieces)[-600:].split()))
        tail = tail[:len(tail) - redactor.unsafe_tail(tail)]  # never the start of a key still arriving
        head += f" ({self.size:,} chars): "
        return head + _last_columns(tail, max(0, width - len(head)))


# --- the approval question ------------------------------------------------------------------

def terminal_approver(redactor: Redactor) -> Optional[Callable[[dict], bool]]:
    """Ask y/N about each call on the terminal the user types into; None when stdin is no terminal."""
    if sys.stdin is None or not sys.stdin.isatty():
        return None

    def approve(call: dict) -> bool:
        try:  # the terminal itself, so the question shows even with stdout and stderr redirected
            terminal = SafeStream(open(os.ttyname(sys.stdin.fileno()), "w", encoding="utf-8"), redactor, "drop")
        except OSError:
            terminal = sys.stderr
        again = " again (it may have run before the run was cut short)" if call.get("may_have_run") else ""
        terminal.write(f"approve {call['tool']} {to_json(call['args'])}{again}? [y/N] ")
        terminal.flush()
        answer = sys.stdin.readline()
        if not answer:  # Ctrl-D: end the line the question left open
            terminal.write("\n")
        if terminal is not sys.stderr:
            terminal.close()
        return answer.strip().lower() in ("y", "yes")
    return approve
