"""Scoring, after a run and never shown to the model: does an answer match what its task expected,
and what a count of right answers says (an interval, a paired test of two configurations, pass^k).

The default match is forgiving where people are: case, surrounding whitespace, quotes and final
punctuation do not count, and a numeric expectation is compared with the answer's final number
("The result is 1,536." matches 1536). `exact`, `includes`, `number` and `regex` say otherwise.
A promptfoo test's asserts are judged as promptfoo judges them (all must pass): the output as it
is, text, or a typed answer as JSON; but a regex by Python's re, not JavaScript's.
It imports records and settings.
"""
import atexit
import contextlib
import json
import math
import re
import select
import statistics
import subprocess
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from agent_demo_kit.records import answer_text
from agent_demo_kit.settings import MATCHES  # noqa: F401  (scoring.MATCHES too)

RELATIVE_TOLERANCE = 1e-6  # two numbers this close are equal (1/3 written as 0.333333 is not)
SCORED_CHARS = 100_000  # of an answer, what is scored: a regex runs on no more
_NUMBER = re.compile(r"(?:(?<![\w.])[-+])?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+|(?=\.\d))(?:\.\d+)?(?:[eE][-+]?\d+)?")
_QUOTES = "\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb"
_FINAL_PUNCTUATION = ".!?;:,\u3002\uff01\uff1f"


class BadExpectation(ValueError):
    """What a task expects cannot be scored (a regex that does not compile, a list of nothing)."""


def expected_values(expected: Any) -> List[Any]:
    """The values an `expected` allows (a list means any of them); BadExpectation for an empty list or
    a value that is neither text nor a number."""
    values = expected if isinstance(expected, list) else [expected]
    if not values:
        raise BadExpectation('"expected" is an empty list: nothing could be right')
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) \
                or isinstance(value, float) and not math.isfinite(value):
            raise BadExpectation(f'"expected" must be a text, a number or a list of them, got {json.dumps(value)}')
    return values


def check_expectation(expected: Any, match: Optional[str]) -> None:
    """BadExpectation if this expectation cannot be scored with this match."""
    for value in expected_values(expected):
        if match == "regex":
            problem = REGEX.problem(str(value))
            if problem:
                raise BadExpectation(f'"expected" {problem}')
        if match == "number" and as_number(value) is None:
            raise BadExpectation(f'"expected" {json.dumps(value)} is not a number, as --match number needs')


def expected_text(expected: Any) -> str:
    """What a check gets as AGENT_EXPECTED: text as it is, anything else as JSON."""
    return expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)


def score(answer: Any, expected: Any, match: Optional[str] = None) -> bool:
    """Does the answer match any of the expected values, by `match` (None: the default)?"""
    said = answer_text(answer)[:SCORED_CHARS] if answer is not None else ""
    return any(matches(said, value, match) for value in expected_values(expected))


def matches(answer: str, expected: Any, match: Optional[str]) -> bool:
    """One expected value against an answer."""
    wanted = expected if isinstance(expected, str) else json.dumps(expected)
    if match == "exact":
        return answer.strip() == wanted.strip()
    if match == "includes":
        return normalized(wanted) in normalized(answer)
    if match == "regex":
        return REGEX.search(wanted, answer) is True  # not searched in time: not a match
    number = as_number(expected)
    if match == "number" or number is not None:
        final = final_number(answer)
        return number is not None and final is not None and math.isclose(final, number, rel_tol=RELATIVE_TOLERANCE,
                                                                          abs_tol=1e-12)
    return normalized(answer) == normalized(wanted)


# promptfoo's assert types judged here (each also with "not-" before it, which turns its verdict).
ASSERTS = ("equals", "contains", "icontains", "starts-with", "regex", "contains-any", "contains-all",
           "icontains-any", "icontains-all")


def check_assert(kind: str, value: Any) -> None:
    """BadExpectation if promptfoo's assert of this type and value cannot be scored here: a type it
    scores with code, a model or a service (javascript, llm-rubric, similar, ...), a value of the
    wrong kind, a regex that does not compile."""
    base = kind[4:] if kind.startswith("not-") else kind
    if base not in ASSERTS:
        raise BadExpectation(f"{kind} cannot be scored here (only {', '.join(ASSERTS)} and their not- forms)")
    if value is None:
        raise BadExpectation(f"a {kind} assert has no value")
    if base.endswith(("-any", "-all")):
        if not isinstance(value, list) or not value or not all(_text_or_number(each) for each in value):
            raise BadExpectation(f"a {kind} assert's value must be a list of texts or numbers")
    elif base in ("starts-with", "regex"):
        if not isinstance(value, str) or not value:
            raise BadExpectation(f"a {kind} assert's value must be a text")
    elif base in ("contains", "icontains") and not (_text_or_number(value) and value != ""):
        raise BadExpectation(f"a {kind} assert's value must be a text or a number")
    elif base == "equals" and not (_text_or_number(value) or isinstance(value, (dict, list))):
        raise BadExpectation(f"a {kind} assert's value must be a text, a number, or JSON to compare with")
    if base == "regex":
        problem = REGEX.problem(value)
        if problem:
            raise BadExpectation(f'"regex" {problem}: {value[:80]!r}')


def _text_or_number(value: Any) -> bool:
    return isinstance(value, str) or isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def assert_passes(answer: Any, kind: str, value: Any) -> bool:
    """Does the answer pass promptfoo's assert (checked by check_assert)? As promptfoo judges it: on
    the output as it is (a typed answer as its JSON text), case counting but for icontains."""
    inverse, base = kind.startswith("not-"), kind[4:] if kind.startswith("not-") else kind
    output = output_string(answer)
    if base == "equals" and isinstance(value, (dict, list)):
        try:
            passed = _same_json(value, json.loads(output))
        except ValueError:  # not JSON: as promptfoo, no verdict to turn, not-equals fails too
            return False
    elif base == "equals":
        passed = output == js_string(value)
    elif base == "regex":
        found = REGEX.search(value, output[:SCORED_CHARS])
        if found is None:  # not searched in time: no verdict to turn, a not-regex fails too
            return False
        passed = found
    elif base == "starts-with":
        passed = output.startswith(value)
    else:
        folded = base.startswith("i")
        said = output.lower() if folded else output
        wanted = [js_string(each).lower() if folded else js_string(each)
                  for each in (value if isinstance(value, list) else [value])]
        found = (wanted_one in said for wanted_one in wanted)
        passed = all(found) if base.endswith("-all") else any(found)
    return passed != inverse


def output_string(answer: Any) -> str:
    """An answer as promptfoo's asserts read an output: text as it is, anything else as compact JSON
    (JavaScript's JSON.stringify); nothing as ""."""
    if answer is None:
        return ""
    if isinstance(answer, str):
        return answer
    return json.dumps(_js_numbers(answer), ensure_ascii=False, separators=(",", ":"))


def js_string(value: Any) -> str:
    """A value as JavaScript's String() writes it: 1.0 as "1"."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _js_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {key: _js_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_js_numbers(item) for item in value]
    return value


def _same_json(one: Any, other: Any) -> bool:
    """Deep equality as JavaScript's isDeepStrictEqual sees parsed JSON: true is no number, 1 is 1.0."""
    if isinstance(one, bool) or isinstance(other, bool):
        return type(one) is type(other) and one == other
    if isinstance(one, dict) and isinstance(other, dict):
        return one.keys() == other.keys() and all(_same_json(one[key], other[key]) for key in one)
    if isinstance(one, list) and isinstance(other, list):
        return len(one) == len(other) and all(map(_same_json, one, other))
    if isinstance(one, (int, float)) and isinstance(other, (int, float)):
        return one == other
    return type(one) is type(other) and one == other


def asserts_said(asserts: Any, failed_only: bool = False) -> str:
    """A line of a results line's asserts for people: "icontains 'paris', not-contains 'London'"."""
    said = [f"{each.get('type')} {each.get('value')!r}" for each in asserts if isinstance(each, dict)
            and (not failed_only or each.get("pass") is False)]
    return ", ".join(said)


class RegexJudge:
    """re.search of a pattern a task file gave, with a time limit: a pattern such as ^(a|a)+$ takes
    exponential time on some answers, and Python's re holds the interpreter meanwhile (no Ctrl-C, no
    other task). So each search runs in a child process, started when needed and reused; one that
    takes longer than REGEX_SECONDS is stopped, and the answer counts as not matching. Searches at the
    same time (a batch's tasks ending together) each get a child of their own, so as many run at once
    as the batch runs tasks."""

    def __init__(self) -> None:
        self.idle: List[subprocess.Popen] = []  # children waiting for a search
        self.children: set = set()  # every child, searching or idle: what close() ends
        self.closes = 0  # times close() ended them all
        self.lock = threading.Lock()  # over the above: a search holds no lock while it runs
        self.checked: Dict[str, Optional[str]] = {}  # a task file's patterns, and what is wrong with each

    def problem(self, pattern: str) -> Optional[str]:
        """What is wrong with a task file's pattern (None: nothing), compiled in a child as a search is:
        compiling a long pattern of case-folded ranges takes minutes too. Too long, or not compiled in
        time, is a problem; each pattern is checked once."""
        if len(pattern) > MOST_PATTERN_CHARS:
            return f"is a regular expression of {len(pattern):,} characters; at most {MOST_PATTERN_CHARS:,}"
        with self.lock:
            if pattern in self.checked:
                return self.checked[pattern]
        said = self.search(pattern, None)
        problem = None if said is True else "is not a regular expression" + (
            f" ({said})" if isinstance(said, str) else f" compiled within {REGEX_SECONDS:g} s")
        with self.lock:
            if len(self.checked) < MOST_CHECKED:
                self.checked[pattern] = problem
        return problem

    def search(self, pattern: str, text: Optional[str]) -> Any:
        """re.search in a child: True or False; None when it was not searched in time (or the child was
        ended). With text None, only compiled: True, or what re said is wrong (or None)."""
        with self.lock:
            closes = self.closes
        for _ in range(2):  # a child that died meanwhile (Ctrl-C reaches it too) is started again once
            with self.lock:
                process = self.idle.pop() if self.idle else None
            try:
                return self._ask(process or self._start(), pattern, text)
            except (OSError, ValueError):
                with self.lock:
                    if self.closes != closes:  # ended by close(): no verdict, and not searched again
                        return None
        return None

    def _start(self) -> subprocess.Popen:
        # Isolated (-I: neither the current folder nor PYTHON* variables reach its sys.path), from /, with
        # no environment: a json.py beside a task file must not run, and the judge needs no key.
        process = subprocess.Popen([sys.executable, "-I", "-c", _SEARCHER], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, start_new_session=False, cwd="/", env={})
        with self.lock:
            self.children.add(process)
        return process

    def _ask(self, process: subprocess.Popen, pattern: str, text: Optional[str]) -> Any:
        try:
            process.stdin.write(json.dumps([pattern, text]).encode() + b"\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], REGEX_SECONDS)
            said = process.stdout.readline() if ready else None
        except BaseException:
            self._end(process)
            raise
        if said is None:  # out of time: stopped, no verdict
            self._end(process)
            return None
        if not said:
            self._end(process)
            raise ValueError("the searcher ended")
        with self.lock:
            self.idle.append(process)
        return True if said.strip() == b"1" else False if said.strip() == b"0" else json.loads(said)

    def close(self) -> None:
        """End every child, a search still running included (it then counts as not matching)."""
        with self.lock:
            children, self.idle, self.closes = list(self.children), [], self.closes + 1
        for process in children:
            self._end(process)

    def _end(self, process: subprocess.Popen) -> None:
        with self.lock:
            self.children.discard(process)
        process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


REGEX_SECONDS = 2.0  # the longest one regex search of an answer (or one compile of a pattern) may take
MOST_PATTERN_CHARS = 4_000  # a task file's pattern
MOST_CHECKED = 10_000  # patterns whose check is remembered
_SEARCHER = ("import json, re, sys\nfor line in sys.stdin:\n    pattern, text = json.loads(line)\n"
             "    try:\n        found = re.search(pattern, text) if text is not None else re.compile(pattern)\n"
             "    except re.error as error:\n        said = json.dumps(str(error))\n"
             "    else:\n        said = '1' if found else '0'\n"
             "    sys.stdout.write(said + '\\n')\n    sys.stdout.flush()\n")
REGEX = RegexJudge()
atexit.register(REGEX.close)


def normalized(text: str) -> str:
    """text without what people do not count: case, surrounding whitespace and quotes, final punctuation,
    runs of whitespace."""
    text = " ".join(text.split()).casefold()
    while True:
        before = text
        text = text.strip().rstrip(_FINAL_PUNCTUATION).strip()
        if len(text) >= 2 and text[0] in _QUOTES and text[-1] in _QUOTES:
            text = text[1:-1]
        if text == before:
            return text


def as_number(value: Any) -> Optional[float]:
    """value as a number when it is one, written plainly or with thousands separators ("1,536"); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    text = normalized(str(value))
    return _to_float(text) if _NUMBER.fullmatch(text) else None


def final_number(text: str) -> Optional[float]:
    """The last number written in text, or None."""
    found = _NUMBER.findall(text)
    for written in reversed(found):
        number = _to_float(written)
        if number is not None:
            return number
    return None


def _to_float(written: str) -> Optional[float]:
    try:
        number = float(written.replace(",", ""))
    except ValueError:
        return None
    return number if math.isfinite(number) else None


# --- what the counts say ------------------------------------------------------------------------

def interval(right: int, total: int, z: float = 1.96) -> Optional[Tuple[float, float]]:
    """The 95% Wilson score interval of right/total, or None when nothing was counted."""
    if total <= 0:
        return None
    share = right / total
    centre = (share + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


def paired_test(only_first: int, only_second: int) -> float:
    """The two-sided exact McNemar test of two configurations on the same tasks: the chance of a split
    at least this uneven among the tasks where they differ (only_first: right with the first alone),
    if either was as likely to win each of them. 1.0 when they never differ."""
    differ = only_first + only_second
    if differ == 0:
        return 1.0
    tail = sum(math.comb(differ, k) for k in range(min(only_first, only_second) + 1))
    return min(1.0, 2 * tail / 2 ** differ)


def repeats(outcomes: Sequence[Sequence[bool]], tries: int) -> dict:
    """pass@1 (the share of all tries that succeeded), pass^k (the share of tasks whose k tries all
    succeeded) and the spread of the share per try, for tasks each tried `tries` times (a task with
    fewer tries so far counts what it has; pass^k needs all k)."""
    tasks = len(outcomes)
    done = [task for task in outcomes if task]
    per_try = [[task[n] for task in outcomes if len(task) > n] for n in range(tries)]
    shares = [sum(results) / len(results) for results in per_try if results]
    return {"tries": tries, "tasks": tasks,
            "pass_at_1": round(sum(map(sum, done)) / sum(map(len, done)), 4) if done else None,
            "pass_all": round(sum(len(task) == tries and all(task) for task in outcomes) / tasks, 4) if tasks else None,
            "per_try": [round(share, 4) for share in shares],
            "spread": round(statistics.pstdev(shares), 4) if len(shares) > 1 else 0.0}
