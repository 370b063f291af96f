"""The one way text leaves the process: every stream is wrapped so the API key never shows.

stdout, stderr, the trace file and the approval question on the terminal are
all `SafeStream`s over the same `Redactor`, so no output path can forget it.
"""
import contextlib
import json
import os
import re
import sys
from typing import Iterator, List, Optional, TextIO
from urllib.parse import quote, quote_plus

from endings import OutputClosed

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
