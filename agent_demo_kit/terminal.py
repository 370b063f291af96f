"""What a person sees, and the one way text leaves the process.

Every stream (stdout, stderr, the trace file, the approval question on the terminal)
is a `SafeStream` over the same `Redactor` (redaction.py), so no output path can forget
the key. A stream people read is inert as well: what a terminal would act on (escape
codes, a bare carriage return, bidi controls) is shown as an escape, and only our own
codes act. `Screen` is the round-by-round trace people read: colour, shortened think
blocks and a live status line on a terminal; plain text off one (a pipe, a file, NO_COLOR).
The approval question is asked on the controlling terminal.
"""
import contextlib
import json
import os
import re
import shutil
import sys
import threading
import time
import traceback
import unicodedata
from typing import Any, Callable, Iterator, List, Optional, TextIO

from agent_demo_kit.endings import OutputClosed
from agent_demo_kit.redaction import Redactor


def to_json(value: Any) -> str:
    """JSON as people (and the model) read it: compact, non-ASCII kept readable."""
    return json.dumps(value, ensure_ascii=False)


# What a terminal would act on rather than show: C0 controls but newline and tab, a carriage return
# that does not end a line (text after it would overwrite the line), DEL and C1 controls, and the
# invisible and bidirectional format characters that hide or reorder text (not the joiners
# U+200C and U+200D, which Persian text and emoji need).
_ACTIVE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2069"
                     r"\ufeff]|\r(?!\n)")


def inert(text: str) -> str:
    """text a terminal shows and never acts on: each such character as a visible escape (\\x1b,
    \\u202e, \\r); newlines and tabs stay. JSON text stays JSON that means the same, since JSON
    escapes the C0 controls itself and \\uXXXX is its own escape."""
    return _ACTIVE.sub(_escape, text)


def _escape(match: "re.Match") -> str:
    code = ord(match.group())
    return "\\r" if code == 0x0D else f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


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
    An `inert` stream is read by people: what a terminal would act on is shown escaped, and
    only our own codes (`write_code`) act.
    """

    def __init__(self, stream: TextIO, redactor: Redactor, if_broken: str = "raise", inert: bool = False):
        self.stream, self.redactor, self.if_broken, self.inert = stream, redactor, if_broken, inert
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

    def write_code(self, code: str) -> None:
        """One of our own terminal codes (a colour, the carriage return that redraws the status
        line), written as it is after everything before it."""
        self._emit(hold=0)
        self._guarded(lambda: self.stream.write(code))

    def write_json(self, value: Any, indent: Optional[int] = None) -> None:
        """value as JSON and a newline. Its strings are redacted, not its text, so no key, however
        short, changes its structure or its data (a placeholder key 5 and the number 5)."""
        self._emit(hold=0)
        text = json.dumps(self.redactor.values(value), ensure_ascii=False, indent=indent) + "\n"
        self._guarded(lambda: self.stream.write(self._shown(text)))

    def close(self) -> None:
        try:
            self.finish()
        finally:
            self.stream.close()

    def _emit(self, hold: int) -> None:
        cut = len(self._pending) - hold
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        if ready:
            self._guarded(lambda: self.stream.write(self._shown(self.redactor(ready))))

    def _shown(self, text: str) -> str:
        return printable(inert(text) if self.inert else text)

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
    stderr is for people, so it is inert; stdout only on a terminal (elsewhere the answer is data,
    kept exact). A traceback that escapes the block goes through the writer too, and a stream
    that is closed (`>&-`) or cannot be written (`>/dev/full`) costs no traceback."""
    plain = sys.stdout, sys.stderr
    stdout = plain[0] or open(os.devnull, "w")
    sys.stdout = SafeStream(stdout, redactor, if_broken="end", inert=_is_terminal(stdout))
    sys.stderr = SafeStream(plain[1] or open(os.devnull, "w"), redactor, if_broken="drop", inert=True)
    sys.excepthook = _traceback_writer(redactor)  # kept: it prints after the block has ended
    answer = sys.stdout
    try:
        yield answer
    finally:
        for stream in (answer, sys.stderr):
            with contextlib.suppress(OutputClosed):
                stream.finish()
        sys.stdout, sys.stderr = plain


def _traceback_writer(redactor: Redactor) -> Callable[..., None]:
    """An excepthook that writes the traceback through the redacting writer, inert."""
    def write(kind: type, error: BaseException, trace: Any) -> None:
        stream = SafeStream(sys.stderr, redactor, if_broken="drop", inert=True)
        stream.write("".join(traceback.format_exception(kind, error, trace)))
        stream.finish()
    return write


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):  # closed, or a test's stand-in
        return False


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
    """Where the human trace goes: a stream, with colour and a live status line when it is a terminal.
    What others wrote is shown inert; only our own colour codes and carriage returns act."""

    def __init__(self, stream: TextIO, colour: bool = False, live: bool = False,
                 redactor: Optional[Redactor] = None):
        self.redactor = redactor or Redactor()
        self.stream = stream if isinstance(stream, SafeStream) and stream.inert \
            else SafeStream(stream, self.redactor, inert=True)
        self.colour, self.live = colour, live
        self._lock = threading.Lock()
        self._status: Optional[str] = None  # the live line now shown, if any

    def paint(self, kind: Optional[str], text: str) -> None:
        """Write text (made inert by the stream) in the colour of its kind."""
        if not (self.colour and kind in _COLOURS):
            self.stream.write(text)
            return
        body = text.lstrip("\n")  # a blank line before a header stays outside its colour
        self.stream.write(text[:len(text) - len(body)])
        self.stream.write_code(f"\033[{_COLOURS[kind]}m")
        self.stream.write(body)
        self.stream.write_code("\033[0m")

    def say(self, text: str, kind: Optional[str] = None) -> None:
        with self._lock:
            self._clear_status()
            self.paint(kind, text)
            self.stream.write("\n")
            self.stream.flush()

    def show_reply(self, header: str, reply: Any, prose: str) -> None:
        """What the model said besides its actions (its JSON is not echoed: the action lines show it),
        before its calls run and before --approve asks about them."""
        self.say(header, "header")
        from agent_demo_kit.actions import think_pieces
        pieces = think_pieces(prose)
        for thought in [reply.reasoning, *(piece for opening, piece, closing in pieces if opening or closing)]:
            if thought.strip():
                self.say(f"thinking: {_summary(thought)}", "dim")
        said = "".join(piece for opening, piece, closing in pieces if not (opening or closing)).strip()
        if said:
            self.say("model: " + said)
        elif not reply.content.strip() and not reply.tool_calls:
            self.say(f"model: (empty reply, finish_reason {reply.finish_reason})")

    def show_action(self, label: str, tool: str, args: Any) -> None:
        """One action, before it runs: name(arguments)."""
        if isinstance(args, dict) and tool in ("finish", "fail"):  # the answer is printed once, at the end
            args = {name: "..." if name == "result" else value for name, value in args.items()}
        shown = ", ".join(f"{name}={to_json(value)}" for name, value in args.items()) if isinstance(args, dict) \
            else to_json(args)
        self.say(f"{label}: {tool}({shown})", "action")

    def show_result(self, call: Any, result: dict) -> None:
        """What the model was told of one call: the result as sent (cut the same way), text as lines."""
        if call.watchdog:
            self.say(f"watchdog: {call.watchdog}", "note")
        if call.check:  # its output is the result: one line says both
            self.say(check_line(call.check), "ok" if call.check["exit_code"] == 0 else "error")
            return
        if call.ends_run:
            return
        data = result.get("data") if result.get("ok") else result.get("error")
        rest = {name: value for name, value in result.items() if name not in ("ok", "data", "error")}
        kind = "ok" if result.get("ok") else "error"
        if isinstance(data, str) and "\n" in data:
            lines = data.rstrip("\n").split("\n")
            self.say(f"result{'' if result.get('ok') else ' (error)'}: {len(lines)} lines"
                     + (f" {to_json(rest)}" if rest else ""), kind)
            for line in lines:
                self.say(f"  | {line}", kind)
        else:
            self.say(f"result: {to_json(result)}", kind)

    def _clear_status(self) -> None:
        if self._status is not None:  # spaces, not an escape code: no escape codes at all under NO_COLOR
            self.stream.write_code("\r" + " " * sum(map(_columns, self._status)) + "\r")
            self._status = None

    @contextlib.contextmanager
    def working(self, label: str = "model working") -> Iterator["Status"]:
        """While the model (or a tool, or a check) works: a status line with the seconds so far and,
        for the model, the reply's latest words."""
        status = Status(label)
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
                self.paint("dim", line)
                self.stream.flush()
                self._status = line


def check_line(check: dict) -> str:
    """What --check said, in one line: the command, how it ended, and the start of its output."""
    seconds = f"{check['ms'] / 1000:.1f} s"
    ended = f"exit {check['exit_code']} after {seconds}" if check["exit_code"] is not None \
        else f"still running after {seconds}, stopped"
    command = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in check["command"])
    output = " ".join(check["output"].split())
    return f"check: {command} -> {ended}" + (f": {to_json(output[:200])}" if output else "")


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

    def __init__(self, label: str = "model working") -> None:
        self.label = label
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
        head = f"{self.label} {time.monotonic() - self.started:.0f} s"
        if not self.size:
            return (head + " …")[:width]
        tail = redactor(" ".join("".join(self.pieces)[-600:].split()))
        tail = inert(tail[:len(tail) - redactor.unsafe_tail(tail)])  # never the start of a key still arriving
        head += f" ({self.size:,} chars): "
        return head + _last_columns(tail, max(0, width - len(head)))


def on_terminal(stream: Any) -> bool:
    try:
        return bool(stream and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
