"""What a person sees, and the one way text leaves the process.

Every stream (stdout, stderr, the trace file, the approval question on the terminal) is a
`SafeStream` over the same Redactor (redaction.py), so no output path can forget the key. A
stream people read is inert as well: what a terminal would act on (escape codes, a bare carriage
return, bidi controls, characters that show nothing) is shown as an escape, and only our own codes
act. `Screen` is the round-by-round trace people read: colour, shortened think blocks and a live
status line on a terminal; plain text off one (a pipe, a file, NO_COLOR).

It imports records, endings, limits, actions, redaction and prompts.
"""
import contextlib
import os
import re
import shutil
import sys
import threading
import time
import traceback
import unicodedata
from typing import Any, Callable, Iterator, List, Optional, TextIO

from agent_demo_kit.actions import think_pieces
from agent_demo_kit.records import Working, answer_text, printable, to_json
from agent_demo_kit.endings import OutputClosed
from agent_demo_kit.limits import (CHECK_LINE_CHARS, LAST_WORDS_CHARS, STATUS_KEPT_CHARS, STATUS_SHOWN_CHARS,
                                   THOUGHT_SHOWN_CHARS)
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.prompts import ENDINGS, clip


# --- redaction: the secrets and the forms they take --------------------------------------------


# --- the inert writer ------------------------------------------------------------------

# What a terminal would act on rather than show: C0 controls but newline and tab, a carriage return
# that does not end a line (text after it would overwrite the line), DEL and C1 controls, and every
# format character (Unicode's Cf: bidi controls that reorder text, invisible ones that hide it, the
# tag block), line and paragraph separators and lone surrogates; not the joiners U+200C and U+200D,
# which Persian text and emoji need. (Cf as of Unicode 15.1; a test holds it to the running Python's.)
# Besides, what shows nothing or changes the character before and could make text read other than it
# is (the same the approval question escapes): the combining grapheme joiner, Hangul fillers,
# Khmer's invisible vowels, the braille blank, Mongolian and other variation selectors, and
# private-use characters, which a font may draw as anything.
CONTROLLING_TERMINAL = "/dev/tty"  # where a question is asked, whatever stdin is (as sudo asks)

ACTIVE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
                     "\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                     "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f"
                     "\ud800-\udfff"
                     "\u034f\u115f\u1160\u3164\uffa0\u17b4\u17b5\u2800\u180b-\u180f\ufe00-\ufe0f\U000e0100-\U000e01ef"
                     "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]|\r(?!\n)")


# What ACTIVE can match in ASCII text, a carriage return before a newline too: ASCII text without
# any of these holds nothing to escape (most lines), found without ACTIVE's long alternatives.
_ASCII_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def inert(text: str) -> str:
    """text a terminal shows and never acts on: each such character as a visible escape (\\x1b,
    \\u202e, \\r); newlines and tabs stay. JSON text stays JSON that means the same, since JSON
    escapes the C0 controls itself and \\uXXXX (a surrogate pair beyond U+FFFF) is its own escape."""
    if text.isascii() and not _ASCII_CONTROLS.search(text):
        return text
    return ACTIVE.sub(_escape, text)


def _escape(match: "re.Match") -> str:
    return escaped(match.group())


def escaped(character: str) -> str:
    code = ord(character)
    if code > 0xFFFF:  # as JSON writes it: a surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code) or (
        f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}")


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
        self._lock = threading.RLock()  # a tool worker's or a server's prints arrive from their own threads

    def write(self, text: str) -> int:
        with self._lock:
            if not self.redactor.secrets and not self._pending:  # no secret to hold back or redact (a page's)
                self._put(self._shown(text))
                return len(text)
            self._pending += text
            self._emit(hold=self.redactor.unsafe_tail(self._pending))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._emit(hold=self.redactor.unsafe_tail(self._pending))
            self._guarded(self.stream.flush)

    def finish(self) -> None:
        """Write out everything held back: nothing more is coming, so it cannot be a key's start."""
        with self._lock:
            self._emit(hold=0)
            self._guarded(self.stream.flush)

    def write_code(self, code: str) -> None:
        """One of our own terminal codes (a colour, the carriage return that redraws the status
        line), written as it is after everything before it."""
        with self._lock:
            self._emit(hold=0)
            self._put(code)

    def write_json(self, value: Any, indent: Optional[int] = None) -> None:
        """value as JSON and a newline. Its strings are redacted, not its text, so no key, however
        short, changes its structure or its data (a placeholder key 5 and the number 5)."""
        self.write_line(self.redactor.dumps(value, indent))

    def write_line(self, text: str) -> None:
        """A line of JSON its writer has redacted already (Redactor.redacted), and a newline."""
        text += "\n"
        with self._lock:
            self._emit(hold=0)
            self._put(self._shown(text))

    def close(self) -> None:
        try:
            self.finish()
        finally:
            self.stream.close()

    def _emit(self, hold: int) -> None:
        cut = len(self._pending) - hold
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        if ready:
            self._put(self._shown(self.redactor(ready)))

    def _shown(self, text: str) -> str:
        return inert(text) if self.inert else printable(text)  # inert text holds no lone surrogate

    def _put(self, text: str) -> None:
        if self.broken:
            return
        try:
            self.stream.write(text)
        except (OSError, ValueError) as error:  # ValueError: the stream was closed under us
            self._broke(error)

    def _guarded(self, write) -> None:
        if self.broken:
            return
        try:
            write()
        except (OSError, ValueError) as error:
            self._broke(error)

    def _broke(self, error: Exception) -> None:
        if self.if_broken == "raise":
            raise error
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
    sys.stdout = SafeStream(stdout, redactor, if_broken="end", inert=is_terminal(stdout))
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


def is_terminal(stream: Any) -> bool:
    """Is this stream a terminal (not a pipe, a file, a closed stream or a test's stand-in)?"""
    try:
        return bool(stream and stream.isatty())
    except (AttributeError, ValueError, OSError):
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


def _summary(thought: str) -> str:
    """A thought as its first line (at most 80 characters) and, if that is not all, its size."""
    thought = thought.strip()
    first = thought.split("\n", 1)[0][:THOUGHT_SHOWN_CHARS]
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
            if self.colour and kind in _COLOURS or text.endswith("\r"):  # a "\r" that ends text is shown
                self.paint(kind, text)
                self.stream.write("\n")
            else:
                self.stream.write(text + "\n")
            self.stream.flush()

    def show_reply(self, number: int, limit: int, reply: Any, prose: str, usage: dict, estimated: bool) -> None:
        """The round's header (its time and tokens), then what the model said besides its actions (its
        JSON is not echoed: the action lines show it), before its calls run and --approve asks about them."""
        tokens = f", {'~' if estimated else ''}{usage['total_tokens']:,} tokens" if "total_tokens" in usage else ""
        self.say(f"\n--- round {number}/{limit} --- {reply.latency_ms / 1000:.1f} s{tokens}", "header")
        pieces = think_pieces(prose)
        for thought in [reply.reasoning, *(piece for opening, piece, closing in pieces if opening or closing)]:
            if thought.strip():
                self.say(f"thinking: {_summary(thought)}", "dim")
        said = "".join(piece for opening, piece, closing in pieces if not (opening or closing)).strip()
        if said:
            self.say("model: " + said)
        elif not reply.content.strip() and not reply.tool_calls:
            self.say(f"model: (empty reply, finish_reason {reply.finish_reason})")

    def show_action(self, index: int, count: int, tool: str, args: Any, in_words: bool = False) -> None:
        """One action of `count` in the reply, before it runs: name(arguments)."""
        if in_words:  # no action at all: its words stand as the answer, which is printed once, at the end
            self.say("answer in words: the reply held no action, so its words are taken as the answer"
                     " (not a finish call)", "action")
            return
        label = f"action {index}/{count}" if count > 1 else "action"
        if isinstance(args, dict) and tool in ENDINGS:  # the answer is printed once, at the end
            args = {name: "..." if name == "result" else value for name, value in args.items()}
        shown = ", ".join(f"{name}={to_json(value)}" for name, value in args.items()) if isinstance(args, dict) \
            else to_json(args)
        self.say(f"{label}: {tool}({shown})", "action")

    def show_result(self, call: Any, result: dict) -> None:
        """What the model was told of one call: the result as sent (cut the same way), text as lines."""
        if call.watchdog:
            self.say(f"watchdog: {call.watchdog}", "note")
        if call.check:  # its output is the result: one line says both
            if call.check["exit_code"] != 0 and isinstance(call.args, dict):  # what it rejected, in full view
                answer = answer_text(call.args.get("result"))
                self.say(f"answer: {clip(answer, LAST_WORDS_CHARS)}", "error")
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
    command = check["command"].replace("\r", "\\r").replace("\n", "\\n")  # on one line
    output = " ".join(check["output"].split())
    return f"check: {command} -> {ended}" + (f": {to_json(clip(output, CHECK_LINE_CHARS))}" if output else "")


def _columns(character: str) -> int:
    """How many terminal columns a character takes: two for wide (CJK) ones."""
    return 2 if unicodedata.east_asian_width(character) in "WF" else 1


def columns(text: str) -> int:
    """How many terminal columns text takes."""
    return sum(map(_columns, text))


def first_columns(text: str, room: int) -> str:
    """The beginning of text that fits in `room` terminal columns."""
    used, end = 0, 0
    while end < len(text) and used + _columns(text[end]) <= room:
        used += _columns(text[end])
        end += 1
    return text[:end]


def last_columns(text: str, room: int) -> str:
    """The end of text that fits in `room` terminal columns."""
    used, start = 0, len(text)
    while start > 0 and used + _columns(text[start - 1]) <= room:
        start -= 1
        used += _columns(text[start])
    return text[start:]


class Status(Working):
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
            self.pieces = ["".join(self.pieces)[-STATUS_KEPT_CHARS:]]

    def line(self, width: int, redactor: Redactor) -> str:
        """One line that fits the terminal: 'model working 12 s (340 chars): ...the latest words'."""
        head = f"{self.label} {time.monotonic() - self.started:.0f} s"
        if not self.size:
            return (head + " …")[:width]
        tail = redactor(" ".join("".join(self.pieces)[-STATUS_SHOWN_CHARS:].split()))
        tail = inert(tail[:len(tail) - redactor.unsafe_tail(tail)])  # never the start of a key still arriving
        head += f" ({self.size:,} chars): "
        return head + last_columns(tail, max(0, width - len(head)))


# --- the approval question ------------------------------------------------------------


