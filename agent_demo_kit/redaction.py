"""The secrets that must never be shown or sent back, and the forms they take: the key, a password
or a secret query value in the URL, each also JSON- and URL-escaped, base64, cut short at a
truncation, or split over lines, becomes [redacted], in text and in JSON data alike.

It imports records and prompts.
"""
import base64
import functools
import json
import re
from typing import Any, Callable, FrozenSet, List, NamedTuple, Optional, Tuple
from urllib.parse import quote, quote_plus

from agent_demo_kit.prompts import TRUNCATED


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


@functools.lru_cache(maxsize=64)  # a batch builds a redactor a task for the same few secrets
def _forms(secret: str) -> Tuple[str, ...]:
    """The ways a secret is written: as is, JSON- and URL-escaped, and, when it is long enough to be
    a real one, in base64 (standard and URL-safe, alone or inside Basic auth's "user:key")."""
    raw = _bytes_of(secret)
    forms = {secret, json.dumps(secret)[1:-1], quote(raw, safe=""), quote_plus(raw)}
    if len(secret) >= MIN_SECRET_CHARS:
        whole = base64.b64encode(raw).decode()
        forms |= {whole, whole.translate(_URL_SAFE)}
        for shift in range(3):  # after "user:" the key's bytes start at any offset modulo 3
            shifted = base64.b64encode(b"\0" * shift + raw).decode()
            core = shifted[-(-8 * shift // 6):8 * (shift + len(raw)) // 6]  # made of the key's bits alone
            forms |= {core, core.translate(_URL_SAFE)}
    return tuple(sorted(forms, key=len, reverse=True))


def _bytes_of(secret: str) -> bytes:
    """The bytes a secret stands for: a byte of the environment that is not UTF-8 is the lone surrogate
    Python reads it as (surrogateescape), which is turned back into that byte; any other lone surrogate
    is kept as UTF-8 would write it, so that no secret, however odd, makes the redactor fail."""
    try:
        return secret.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return secret.encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=512)
def _pattern(form: str, wrapped: bool = False) -> str:
    """A form as a regular expression in which a percent escape matches in either case (%2b, %2B);
    wrapped: and a line may break anywhere in it (base64 -w 12, fold -w 8), with any line ending, a
    blank line between too."""
    pieces = [f"(?i:{piece})" if len(piece) == 3 else re.escape(piece)
              for piece in re.findall(r"%[0-9A-F]{2}|.", form, re.DOTALL)]
    # A character class, not alternatives: "\r\n" can be read one way only, so a near miss costs no
    # backtracking (with (?:\r?\n|\r){0,2} a key's start, one character a CRLF line, took seconds).
    return ("[\r\n]{0,4}" if wrapped else "").join(pieces)


class _Searches(NamedTuple):
    forms: Tuple[str, ...]
    long_forms: Tuple[str, ...]
    secret_pattern: Optional["re.Pattern"]
    json_plain: bool
    pattern: Optional["re.Pattern"]
    seed_pattern: Optional["re.Pattern"]
    seeds: Tuple[str, ...]
    unbroken: bool  # no form holds a line break: a text without forms, once its breaks are gone, holds none
    longest: int
    first_characters: FrozenSet[str]


@functools.lru_cache(maxsize=64)  # a batch builds redactors for the same few secrets, task after task
def _searches(secrets: Tuple[str, ...]) -> _Searches:
    """What a Redactor of these secrets looks for: every form, the real secrets' forms, the patterns of
    the real secrets and of all, whether JSON writes every form as it is, the pattern of the long
    forms' first and last characters, the longest form, and the characters forms start with."""
    real, placeholders = [], []
    forms: List[str] = []
    long_forms: List[str] = []
    for secret in secrets:
        its = list(_forms(secret))
        long = len(secret) >= MIN_SECRET_CHARS
        either = "|".join(_pattern(form, wrapped=long) for form in its)
        forms += its
        if long:
            long_forms += its
            real.append(either)
        else:
            placeholders.append(rf"(?<![A-Za-z0-9])(?:{either})(?![A-Za-z0-9])")
    secret_pattern = re.compile("|".join(f"(?:{p})" for p in real)) if real else None
    # Each form is written in JSON as it is: a form in any string of a value is in its JSON text too.
    json_plain = all(json.dumps(form, ensure_ascii=False)[1:-1] == form for form in forms)
    every = real + placeholders
    pattern = re.compile("|".join(f"(?:{p})" for p in every)) if every else None
    seeds = {piece for form in long_forms if len(form) > FRAGMENT_CHARS
             for piece in (form[:FRAGMENT_CHARS], form[-FRAGMENT_CHARS:])}
    # One search for them all first: most texts hold none, and need no look per form.
    seed_pattern = re.compile("|".join(map(re.escape, sorted(seeds)))) if seeds else None
    return _Searches(tuple(forms), tuple(long_forms), secret_pattern, json_plain, pattern,
                     seed_pattern, tuple(sorted(seeds)), not any("\r" in form or "\n" in form for form in forms),
                     max(map(len, forms), default=0), frozenset(form[0] for form in forms if form))


_CUT_OPENING = f" ...{TRUNCATED}".split("{count}")[0]  # what every cut marker starts with


WRAPPED_FIRST_CHARS = 4  # a key wrapped across lines has at least this many characters before its first break
# How much longer than itself a wrapped key may be: a break of up to four characters ("\r\n\r\n") after
# every WRAPPED_FIRST_CHARS of it, or a one-character break after each.
WRAPPED_TIMES = 3
_LINE_BREAK = re.compile("[\r\n]")


class Redactor:
    """Replaces each secret (the keys, a password in the URL), and the forms it takes inside JSON,
    URLs and base64, with [redacted]."""

    def __init__(self, *secrets: Optional[str]):
        self.secrets: List[str] = []
        self.forms: Tuple[str, ...] = ()  # of every secret: what a stream holds back
        self.long_forms: Tuple[str, ...] = ()  # of the real secrets: what a cut may leave in part
        self.pattern: Optional["re.Pattern"] = None
        self.json_plain = True  # JSON text shows every form as it is
        self.secret_pattern: Optional["re.Pattern"] = None  # the real secrets alone, no placeholder
        self.seed_pattern: Optional["re.Pattern"] = None  # a long secret's first or last characters
        self.seeds: Tuple[str, ...] = ()  # those characters
        self.unbroken = True
        self.longest = 0
        self.first_characters: FrozenSet[str] = frozenset()
        self.add(*secrets)

    def add(self, *secrets: Optional[str]) -> None:
        """Redact these too (a URL password known only once the flags are read)."""
        new = [secret for secret in dict.fromkeys(secrets) if secret and secret not in self.secrets]
        if not new and self.pattern is not None:
            return
        (self.forms, self.long_forms, self.secret_pattern, self.json_plain, self.pattern,
         self.seed_pattern, self.seeds, self.unbroken, self.longest,
         self.first_characters) = _searches((*self.secrets, *new))
        self.secrets += new  # last: a stream that sees a secret finds the searches for it made

    def __call__(self, text: str, placeholders: bool = True) -> str:
        """text without the secrets; placeholders=False leaves the short placeholder keys in it."""
        pattern = self.pattern if placeholders else self.secret_pattern
        if not pattern or self._surely_clean(text, placeholders):
            return text
        return self._fragments(pattern.sub(REDACTED, text))

    def _surely_clean(self, text: str, placeholders: bool) -> bool:
        """Does text hold nothing to redact, as plain substring searches show (most texts, at a fraction
        of the patterns' cost)? No form, nor a long one's first or last characters, in it once its line
        breaks are gone (a wrapped key is whole again), no percent escape (which matches in either
        case), and no cut marker (beside which a few characters are redacted)."""
        if not self.unbroken or "%" in text or _CUT_OPENING in text:
            return False
        joined = text.replace("\r", "").replace("\n", "") if "\n" in text or "\r" in text else text
        return not any(form in joined for form in (self.forms if placeholders else self.long_forms)) \
            and not any(seed in joined for seed in self.seeds)

    def values(self, value: Any) -> Any:
        """value (what JSON holds, data) with each of its strings redacted, never its numbers or its
        structure. A placeholder key stays: in data the key 5 cannot be told from the number 5, even
        inside a string (a result fed back as JSON text), and it is no secret. A value whose JSON
        text holds nothing to redact is given back as it is (not a copy)."""
        return value if self.nothing_in(value) else self._values(value)

    def dumps(self, value: Any, indent: Optional[int] = None) -> str:
        """value's JSON text (non-ASCII kept) with its strings redacted."""
        return self.redacted(value, indent)[0]

    def redacted(self, value: Any, indent: Optional[int] = None) -> Tuple[str, Any]:
        """dumps(value) and values(value) at once, the JSON written and searched once: a record is
        written and kept alike."""
        text = _json_text(value, indent) if self.json_plain else None
        if text is not None and self._none_in_json(text):
            return text, value
        clean = self._values(value)
        return json.dumps(clean, ensure_ascii=False, indent=indent), clean

    def ascii_dumps(self, value: Any) -> str:
        """value's JSON text, every non-ASCII character escaped, with its strings redacted (NaN refused,
        what JSON cannot hold written as its str()): written and searched once when nothing in it is secret."""
        text = json.dumps(value, allow_nan=False, default=str)
        # json_plain holds for ASCII keys alone: a non-ASCII key's forms include its \u spelling.
        if self.json_plain and self._none_in_json(text):
            return text
        return json.dumps(self._values(value), allow_nan=False, default=str)

    def nothing_in(self, value: Any) -> bool:
        """Is there surely nothing to redact in this value? Its JSON text is searched once, which is
        enough when every form of the secrets is written in JSON as it is."""
        if isinstance(value, str) or value is None or isinstance(value, (bool, int, float)) or not self.json_plain:
            return False
        text = _json_text(value)
        return text is not None and self._none_in_json(text)

    def _none_in_json(self, text: str) -> bool:
        """Does a value's JSON text show no secret in any of its strings? Its escaped line breaks are
        searched as the breaks they stand for: a key a string holds across lines (fold -w 8, base64
        -w 76) is a key, which JSON writes as pieces joined by "\\n"."""
        probe = text.replace("\\r", "\r").replace("\\n", "\n") if "\\" in text else text
        return self(probe, placeholders=False) == probe

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
        for form in self.long_forms if self.seed_pattern is not None and self.seed_pattern.search(text) else ():
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
        """How many characters at the end of text could be the start of a secret still being written,
        a long one with line breaks in it too (base64 -w 12, fold -w 8)."""
        window = text[-WRAPPED_TIMES * self.longest:]
        wrapped = "\n" in window or "\r" in window
        most = min(len(text), WRAPPED_TIMES * self.longest if wrapped else self.longest - 1)
        for size in range(most, 0, -1):
            tail = text[-size:]
            if tail[0] not in self.first_characters:  # most ends of a text: none starts a form
                continue
            if any(form.startswith(tail) for form in self.forms):
                return size
            bare = tail.replace("\r", "").replace("\n", "") if wrapped else tail
            first_line = _LINE_BREAK.split(tail, 1)[0]
            # A line break after a key's first few characters is no wrapping anyone does (fold -w 8,
            # base64 -w 76): a line that ends in "s" is not held back as the start of "sk-...".
            if bare != tail and len(first_line) >= WRAPPED_FIRST_CHARS and any(
                    form.startswith(bare) for form in self.long_forms):
                return size
        return 0
