"""The one way text leaves the process: every stream is wrapped so the API key never shows.

stdout, stderr, the trace file and the approval question on the terminal are
all `SafeStream`s over the same `Redactor`, so no output path can forget it.
"""
import json
import re
from typing import Optional, TextIO
from urllib.parse import quote, quote_plus

REDACTED = "[redacted]"
# A key shorter than this is a placeholder ("5", "none"): redacted only where it stands
# as a whole token, so the result 1536 does not become 1[redacted]36.
MIN_SECRET_CHARS = 8


class Redactor:
    """Replaces the key, and the forms it takes inside JSON and URLs, with [redacted]."""

    def __init__(self, secret: Optional[str]):
        self.forms = sorted({form for form in (secret, json.dumps(secret or "")[1:-1], quote(secret or "", safe=""),
                                               quote_plus(secret or "")) if form}, key=len, reverse=True)
        if not self.forms:
            self.pattern = None
        elif len(secret) >= MIN_SECRET_CHARS:
            self.pattern = re.compile("|".join(map(re.escape, self.forms)))
        else:
            self.pattern = re.compile(rf"(?<![A-Za-z0-9])(?:{'|'.join(map(re.escape, self.forms))})(?![A-Za-z0-9])")

    def __call__(self, text: str) -> str:
        return self.pattern.sub(REDACTED, text) if self.pattern else text

    def unsafe_tail(self, text: str) -> int:
        """How many characters at the end of text could be the start of a key still being written."""
        for size in range(min(len(text), max(map(len, self.forms), default=1) - 1), 0, -1):
            if any(form.startswith(text[-size:]) for form in self.forms):
                return size
        return 0


def redact(text: str, secret: Optional[str]) -> str:
    """text with the key removed."""
    return Redactor(secret)(text)


class SafeStream:
    """A text stream that redacts everything written to it.

    A key written in pieces (a reply streamed token by token) is still caught: the
    end of what was written is held back while it could be the start of the key.
    """

    def __init__(self, stream: TextIO, redactor: Redactor):
        self.stream, self.redactor = stream, redactor
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        self._emit(hold=self.redactor.unsafe_tail(self._pending))
        return len(text)

    def flush(self) -> None:
        self._emit(hold=self.redactor.unsafe_tail(self._pending))
        self.stream.flush()

    def close(self) -> None:
        try:
            self._emit(hold=0)
            self.stream.flush()
        finally:
            self.stream.close()

    def _emit(self, hold: int) -> None:
        ready, self._pending = self._pending[:len(self._pending) - hold], self._pending[len(self._pending) - hold:]
        if ready:
            self.stream.write(self.redactor(ready))

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ... of the stream underneath
        return getattr(self.stream, name)
