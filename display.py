"""The trace people read on a terminal: colour, shortened think blocks, and a live status line
while the model works. Off a terminal (a pipe, a file, NO_COLOR) it is plain text."""
import contextlib
import re
import shutil
import threading
import time
import unicodedata
from typing import Iterator, List, Optional, TextIO

from output import Redactor

_COLOURS = {"header": "1;36", "action": "33", "ok": "32", "error": "31", "note": "35", "dim": "2",
            "finished": "1;32", "stopped": "1;31"}
_THINK_BLOCK = re.compile(r"<(think|thinking)>(.*?)(?:</\1>|$)", re.S | re.I)
_THINK_OPEN = re.compile(r"<think(?:ing)?>", re.I)
_LONE_CLOSE = re.compile(r"</think(?:ing)?>", re.I)


def shorten_think(text: str) -> str:
    """Each think block as its first line and its size; the trace file keeps it whole. Also a block
    whose opening tag the server ate (all before a lone closing tag) and one never closed."""
    lone = _LONE_CLOSE.search(text)
    if lone and not _THINK_OPEN.search(text, 0, lone.start()):
        return f"{_summary(text[:lone.start()])}{lone.group(0)}{shorten_think(text[lone.end():])}"

    def short(block: "re.Match") -> str:
        closing = f"</{block.group(1)}>" if block.group(0).lower().endswith(f"</{block.group(1).lower()}>") else ""
        return f"<{block.group(1)}>{_summary(block.group(2))}{closing}"
    return _THINK_BLOCK.sub(short, text)


def _summary(thought: str) -> str:
    """A thought as its first line (at most 80 characters) and, if that is not all, its size."""
    thought = thought.strip()
    first = thought.split("\n", 1)[0][:80]
    return first + (f" … ({len(thought):,} chars)" if first != thought else "")


def shorten_reasoning(text: str) -> str:
    """A reply's separate reasoning (reasoning_content) as one short line."""
    return _summary(text)


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
