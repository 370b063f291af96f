"""What a person sees, and the one way text leaves the process.

Every stream (stdout, stderr, the trace file, the approval question on the terminal) is a
`SafeStream` over the same `Redactor`, so no output path can forget the key: the key, a
password in the URL, and the forms they take (JSON- and URL-escaped, base64, cut short)
become [redacted]. A stream people read is inert as well: what a terminal would act on
(escape codes, a bare carriage return, bidi controls) is shown as an escape, and only our
own codes act. `Screen` is the round-by-round trace people read: colour, shortened think
blocks and a live status line on a terminal; plain text off one (a pipe, a file, NO_COLOR).
The approval question is asked on the controlling terminal, whatever stdin is.
"""
import base64
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
from typing import Any, Callable, Iterator, List, Optional, Set, TextIO
from urllib.parse import quote, quote_plus

from agent_demo_kit.actions import think_pieces
from agent_demo_kit.records import Working, answer_text, printable, to_json
from agent_demo_kit.endings import OutputClosed
from agent_demo_kit.limits import (CHECK_LINE_CHARS, LAST_WORDS_CHARS, STATUS_KEPT_CHARS, STATUS_SHOWN_CHARS,
                                   THOUGHT_SHOWN_CHARS)
from prompts import ENDINGS, TRUNCATED, clip


# --- redaction: the secrets and the forms they take --------------------------------------------

REDACTED = "[redacted]"
# A key shorter than this is a placeholder ("5", "none"): redacted in text for people only where
# it stands as a whole token, so the result 1536 does not become 1[redacted]36; never in data
# (JSON, what goes to the model).
MIN_SECRET_CHARS = 8
# A cut (a message or a result shortened to a length) can leave a long secret's first or last
# characters: this many of them, or more, are redacted too.
FRAGMENT_CHARS = 12
# Beside the marker prompts.clip leaves, even this few of a secret's characters are redacted:
# a cut is where a secret is most likely to be left in part.
FRAGMENT_AT_A_CUT = 4
_CUT = re.compile(re.escape(f" ...{TRUNCATED}... ").replace(re.escape("{count}"), r"\d+"))
_URL_SAFE = str.maketrans("+/", "-_")


def _json_text(value: Any, indent: Optional[int] = None) -> Optional[str]:
    """value as JSON text, anything else in it as its str() (as values() takes it); None if it cannot be."""
    try:
        return json.dumps(value, ensure_ascii=False, indent=indent, default=str)
    except (TypeError, ValueError, RecursionError):
        return None


def _forms(secret: str) -> List[str]:
    """The ways a secret is written: as is, JSON- and URL-escaped, and, when it is long enough to be
    a real one, in base64 (standard and URL-safe, alone or inside Basic auth's "user:key")."""
    forms = {secret, json.dumps(secret)[1:-1], quote(secret, safe=""), quote_plus(secret)}
    if len(secret) >= MIN_SECRET_CHARS:
        raw = secret.encode("utf-8", "replace")
        whole = base64.b64encode(raw).decode()
        forms |= {whole, whole.translate(_URL_SAFE)}
        for shift in range(3):  # after "user:" the key's bytes start at any offset modulo 3
            shifted = base64.b64encode(b"\0" * shift + raw).decode()
            core = shifted[-(-8 * shift // 6):8 * (shift + len(raw)) // 6]  # made of the key's bits alone
            forms |= {core, core.translate(_URL_SAFE)}
    return sorted(forms, key=len, reverse=True)


def _pattern(form: str, wrapped: bool = False) -> str:
    """A form as a regular expression in which a percent escape matches in either case (%2b, %2B);
    wrapped: and a line may break anywhere in it (base64 -w 12, fold -w 8)."""
    pieces = [f"(?i:{piece})" if len(piece) == 3 else re.escape(piece)
              for piece in re.findall(r"%[0-9A-F]{2}|.", form, re.DOTALL)]
    return (r"(?:\r?\n)?" if wrapped else "").join(pieces)


class Redactor:
    """Replaces each secret (the keys, a password in the URL), and the forms it takes inside JSON,
    URLs and base64, with [redacted]."""

    def __init__(self, *secrets: Optional[str]):
        self.secrets: List[str] = []
        self.forms: List[str] = []  # of every secret: what a stream holds back
        self.long_forms: List[str] = []  # of the real secrets: what a cut may leave in part
        self.pattern: Optional["re.Pattern"] = None
        self.secret_pattern: Optional["re.Pattern"] = None  # the real secrets alone, no placeholder
        self.longest = 0
        self.add(*secrets)

    def add(self, *secrets: Optional[str]) -> None:
        """Redact these too (a URL password known only once the flags are read)."""
        self.secrets += [secret for secret in secrets if secret and secret not in self.secrets]
        real, placeholders = [], []
        self.forms, self.long_forms = [], []
        for secret in self.secrets:
            forms = _forms(secret)
            long = len(secret) >= MIN_SECRET_CHARS
            either = "|".join(_pattern(form, wrapped=long) for form in forms)
            self.forms += forms
            if long:
                self.long_forms += forms
                real.append(either)
            else:
                placeholders.append(rf"(?<![A-Za-z0-9])(?:{either})(?![A-Za-z0-9])")
        self.secret_pattern = re.compile("|".join(f"(?:{p})" for p in real)) if real else None
        # Each form is written in JSON as it is: a form in any string of a value is in its JSON text too.
        self.json_plain = all(json.dumps(form, ensure_ascii=False)[1:-1] == form for form in self.forms)
        every = real + placeholders
        self.pattern = re.compile("|".join(f"(?:{p})" for p in every)) if every else None
        self.longest = max(map(len, self.forms), default=0)

    def __call__(self, text: str, placeholders: bool = True) -> str:
        """text without the secrets; placeholders=False leaves the short placeholder keys in it."""
        pattern = self.pattern if placeholders else self.secret_pattern
        if not pattern:
            return text
        return self._fragments(pattern.sub(REDACTED, text))

    def values(self, value: Any) -> Any:
        """value (what JSON holds, data) with each of its strings redacted, never its numbers or its
        structure. A placeholder key stays: in data the key 5 cannot be told from the number 5, even
        inside a string (a result fed back as JSON text), and it is no secret. A value whose JSON
        text holds nothing to redact is given back as it is (not a copy)."""
        return value if self.nothing_in(value) else self._values(value)

    def dumps(self, value: Any, indent: Optional[int] = None) -> str:
        """value's JSON text (non-ASCII kept) with its strings redacted."""
        text = _json_text(value, indent) if self.json_plain else None
        if text is not None and self(text, placeholders=False) == text:
            return text
        return json.dumps(self._values(value), ensure_ascii=False, indent=indent)

    def nothing_in(self, value: Any) -> bool:
        """Is there surely nothing to redact in this value? Its JSON text is searched once, which is
        enough when every form of the secrets is written in JSON as it is."""
        if isinstance(value, str) or value is None or isinstance(value, (bool, int, float)) or not self.json_plain:
            return False
        text = _json_text(value)
        return text is not None and self(text, placeholders=False) == text

    def _values(self, value: Any) -> Any:
        if isinstance(value, str):
            return self(value, placeholders=False)
        if isinstance(value, dict):
            return {self(key, placeholders=False) if isinstance(key, str) else key: self._values(item)
                    for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._values(item) for item in value]
        if value is None or isinstance(value, (bool, int, float)):
            return value
        return self(str(value), placeholders=False)  # what json.dumps(default=str) would write

    def _fragments(self, text: str) -> str:
        """A long secret's beginning or end left by a cut (a server message or a result shortened to a
        length): FRAGMENT_CHARS or more of its first or last characters anywhere, and
        FRAGMENT_AT_A_CUT or more beside the marker prompts.clip leaves."""
        for form in self.long_forms:
            if len(form) <= FRAGMENT_CHARS:
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
        for cut in reversed(list(_CUT.finditer(text)) if self.long_forms else []):
            head = self._left(lambda part: text.endswith(part, 0, cut.start()), first=True)
            tail = self._left(lambda part: text.startswith(part, cut.end()), first=False)
            text = (text[:cut.start() - head] + (REDACTED if head else "") + cut.group()
                    + (REDACTED if tail else "") + text[cut.end() + tail:])
        return text

    def _left(self, found: Callable[[str], bool], first: bool) -> int:
        """The most characters of a secret's beginning (first) or end that `found` sees, FRAGMENT_AT_A_CUT
        at least; else 0."""
        return max((size for form in self.long_forms for size in range(FRAGMENT_AT_A_CUT, len(form))
                    if found(form[:size] if first else form[-size:])), default=0)

    def unsafe_tail(self, text: str) -> int:
        """How many characters at the end of text could be the start of a secret still being written."""
        for size in range(min(len(text), self.longest - 1), 0, -1):
            tail = text[-size:]
            if any(form.startswith(tail) for form in self.forms):
                return size
        return 0


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
_ACTIVE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
                     "\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                     "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f"
                     "\ud800-\udfff"
                     "\u034f\u115f\u1160\u3164\uffa0\u17b4\u17b5\u2800\u180b-\u180f\ufe00-\ufe0f\U000e0100-\U000e01ef"
                     "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd]|\r(?!\n)")


def inert(text: str) -> str:
    """text a terminal shows and never acts on: each such character as a visible escape (\\x1b,
    \\u202e, \\r); newlines and tabs stay. JSON text stays JSON that means the same, since JSON
    escapes the C0 controls itself and \\uXXXX (a surrogate pair beyond U+FFFF) is its own escape."""
    return _ACTIVE.sub(_escape, text)


def _escape(match: "re.Match") -> str:
    return _escaped(match.group())


def _escaped(character: str) -> str:
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
            self._pending += text
            self._emit(hold=self.redactor.unsafe_tail(self._pending))
        return len(text)

    def flush(self) -> None:
        with self._lock:
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
            self._guarded(lambda: self.stream.write(code))

    def write_json(self, value: Any, indent: Optional[int] = None) -> None:
        """value as JSON and a newline. Its strings are redacted, not its text, so no key, however
        short, changes its structure or its data (a placeholder key 5 and the number 5)."""
        text = self.redactor.dumps(value, indent) + "\n"
        with self._lock:
            self._emit(hold=0)
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
            self.paint(kind, text)
            self.stream.write("\n")
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
        label = "answer in words" if in_words else f"action {index}/{count}" if count > 1 else "action"
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


def _last_columns(text: str, room: int) -> str:
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
        return head + _last_columns(tail, max(0, width - len(head)))


# --- the approval question ------------------------------------------------------------

CONTROLLING_TERMINAL = "/dev/tty"
QUESTION_LINES = 6  # the most one line of a question takes of the terminal: it stays whole on 80x24
_WHITESPACE_RUN = re.compile(r"\s{5,}")
MARKS_ON_ONE = 2  # combining marks shown on one character; more (stacked over the lines around) are escaped


def _hidden(character: str) -> bool:
    """Whether a question shows character as an escape: what the trace escapes (the one rule, _ACTIVE),
    and, since a question's line is what runs, every other character but plain letters, marks,
    digits, punctuation, symbols and the plain space (Unicode's C* and Z* categories: a no-break
    space would make "rm\u00a0-rf" read as "rm -rf")."""
    category = unicodedata.category(character)
    return _ACTIVE.match(character) is not None or category[0] == "C" or category[0] == "Z" and character != " "


def visible(text: str) -> str:
    """text with every character a question must not show raw as its escape (see _hidden), and the
    combining marks past MARKS_ON_ONE on one character too."""
    shown, marks = [], 0
    for character in text:
        marks = marks + 1 if unicodedata.combining(character) else 0
        shown.append(_escaped(character) if marks > MARKS_ON_ONE or _hidden(character) else character)
    return "".join(shown)


def _whitespace_shown(match: "re.Match") -> str:
    run = match.group()
    kind = {" ": "spaces", "\t": "tabs"}.get(run[0], "whitespace characters") if len(set(run)) == 1 \
        else "whitespace characters"
    return f"[{len(run):,} {kind}]"


def question_line(line: str, room: int) -> str:
    """One line of a question in at most `room` columns, whatever it holds: runs of whitespace said
    as such ([4,000 spaces]), what is invisible escaped, and when still too long its head and its
    end with the length of the whole between them, so the tool's name and the end of a command show."""
    whole = len(line)
    line = _WHITESPACE_RUN.sub(_whitespace_shown, line)
    if len(line) <= room:
        shown = visible(line)
        if columns(shown) <= room:
            return shown
    cut = f" [... cut here: {whole:,} characters in all ...] "
    head_room = (room - len(cut)) * 2 // 3
    tail_room = room - len(cut) - head_room
    return (first_columns(visible(line[:head_room]), head_room) + cut
            + _last_columns(visible(line[len(line) - tail_room:]), tail_room))


def terminal_confirm(redactor: Redactor) -> Optional[Callable[[str], bool]]:
    """A y/N question asked on the controlling terminal (default no); None when the process has none."""
    approver = terminal_approver(redactor)
    return None if approver is None else lambda question: approver.ask(question) in ("y", "yes")


def terminal_approver(redactor: Redactor) -> Optional["TerminalApprover"]:
    """The approval question, asked on the controlling terminal whatever stdin is (as sudo and git
    ask for a password); None when the process has no terminal."""
    try:
        os.close(os.open(CONTROLLING_TERMINAL, os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return None
    return TerminalApprover(redactor)


class TerminalApprover:
    """Asks y/N/a about each call: "a" says yes to that tool for the rest of the run."""

    def __init__(self, redactor: Redactor):
        self.redactor = redactor
        self.always: Set[str] = set()

    def __call__(self, call: dict) -> bool:
        if call["tool"] in self.always:
            return True
        # On a line of its own, the call exactly as it will run: JSON keeps the arguments' text
        # exact, and the terminal stream shows anything a terminal would act on escaped.
        warning = f"\nwarning: {call['tool']}: {call['warning']}" if call.get("warning") else ""
        again = " again (it may have run before the run was cut short)" if call.get("may_have_run") else ""
        answer = self.ask(f"{warning}\napprove {call['tool']} {to_json(call['args'])}{again}? [y/N/a] ")
        if answer == "a":
            self.always.add(call["tool"])
        return answer in ("y", "yes", "a")

    def ask(self, question: str) -> str:
        """The answer typed to question on the terminal, lowercase; what was typed before it was
        shown (while the model worked) is dropped, so it cannot answer a question not yet asked."""
        import termios  # POSIX only, like /dev/tty
        descriptor = os.open(CONTROLLING_TERMINAL, os.O_RDWR | os.O_NOCTTY)
        try:
            termios.tcflush(descriptor, termios.TCIFLUSH)
            terminal = SafeStream(open(descriptor, "w", encoding="utf-8", closefd=False), self.redactor, "drop",
                                  inert=True)
            try:
                width = os.get_terminal_size(descriptor).columns or 80
            except OSError:
                width = 80
            # Whole on the screen, whatever the call holds: each line cut to a few of the terminal's lines.
            room = max(width, 40) * QUESTION_LINES - 1
            terminal.write("\n".join(question_line(line, room) for line in self.redactor(question).split("\n")))
            terminal.finish()
            answer = os.read(descriptor, 1024)  # one line: the terminal hands it over on Enter
            if not answer:  # Ctrl-D: end the line the question left open
                terminal.write("\n")
                terminal.finish()
            return answer.decode("utf-8", "replace").strip().lower()
        finally:
            os.close(descriptor)
