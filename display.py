"""The trace people read on a terminal: colour, shortened think blocks, and a live status line
while the model works. Off a terminal (a pipe, a file, NO_COLOR) it is plain text."""
import contextlib
import re
import shutil
import threading
import time
from typing import Iterator, List, Optional, TextIO

from output import Redactor

_COLOURS = {"header": "1;36", "action": "33", "ok": "32", "error": "31", "note": "35", "dim": "2",
            "finished": "1;32", "stopped": "1;31"}
_THINK_BLOCK = re.compile(r"<(think|thinking)>(.*?)(?:</\1>|$)", re.S | re.I)


def shorten_think(text: str) -> str:
    """Each think block as its first line and its size; the trace file keeps it whole."""
    def short(block: "re.Match") -> str:
        thought = block.group(2).strip()
        first = thought.split("\n", 1)[0]
        first = first if len(first) <= 80 else first[:80] + "…"
        more = f" … ({len(thought):,} chars)" if first != thought else ""
        return f"<{block.group(1)}>{first}{more}</{block.group(1)}>"
    return _THINK_BLOCK.sub(short, text)


def shorten_reasoning(text: str) -> str:
    """A reply's separate reasoning (reasoning_content) as one short line."""
    thought = text.strip()
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

    def _clear_status(self) -> None:
        if self._status is not None:  # spaces, not an escape code: no escape codes at all under NO_COLOR
            self.stream.write("\r" + " " * len(self._status) + "\r")
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
        room = max(0, width - len(head))
        return head + (tail[-room:] if room else "")
