"""A batch's task file: JSON Lines of tasks (or lines of plain text), read as data, a line at a
time: a task, its id, what its answer should be and how that is matched, and a check the user may
choose to run. Nothing in it runs or decides anything on its own.

It imports endings and scoring.
"""
import hashlib
import io
import json
import re
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

from agent_demo_kit import scoring
from agent_demo_kit.endings import ConfigError

Key = Tuple[str, int]  # a task's id and which of its tries (--repeat)


TASK_KEYS = ("id", "task", "check", "expected", "match")


class BatchTask(NamedTuple):
    """One line of the task file (a tuple: ten thousand of them stay small)."""

    line: int
    id: str
    task: str
    check: Optional[str] = None
    expected: Any = None  # a text, a number, or a list of them (any one is right); None: nothing to score
    file: str = ""  # its trace's name in traces/, made from the id (and the try)
    match: Optional[str] = None  # how the answer is scored against expected (None: the default)
    repeat: int = 1  # which try of the task (--repeat)

    @property
    def key(self) -> Key:
        return self.id, self.repeat


MAX_TASK_LINE_BYTES = 16 << 20  # a task line longer than this is no task someone wrote


def text_lines(tasks: Any, source: str) -> Iterator[Tuple[int, str]]:
    """The numbered lines of a task file (a binary stream, or text), split at "\\n" alone: a U+2028 in a
    JSON string or a U+0085 in a line is part of it. ConfigError for a file that is not text (a NUL
    byte, bytes that are not UTF-8) or a line past MAX_TASK_LINE_BYTES, read no further than that."""
    stream = io.BytesIO(tasks.encode("utf-8", "surrogatepass")) if isinstance(tasks, str) else tasks
    number = 0
    while True:
        raw = stream.readline(MAX_TASK_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if b"\0" in raw:
            raise ConfigError(f"{source} is not text (line {number} holds a NUL byte): give a JSON Lines file of tasks")
        if len(raw) > MAX_TASK_LINE_BYTES:
            raise ConfigError(f"{source} line {number} is longer than {MAX_TASK_LINE_BYTES >> 20} MB: not a task file")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{source} is not text (line {number} holds bytes that are not UTF-8): give a JSON"
                              " Lines file of tasks") from None
        yield number, (line[1:] if number == 1 and line.startswith("\ufeff") else line)  # an editor's byte order mark


def read_tasks(tasks: Any, source: str, notes: Optional[List[str]] = None) -> List[BatchTask]:
    """The tasks of a JSON Lines file (a binary stream, or text): a JSON object a line ({"id", "task",
    "check", "expected", "match"}; only task is needed), or a line of plain text that is a task; blank
    lines are passed by. The id is the line number when none is given. ConfigError naming the line
    for anything else, for an id used twice and for a file that is not text. notes, when given, gets a
    line about keys no task line knows (a typo such as "chek" is no check)."""
    found: List[BatchTask] = []
    unknown: Dict[str, int] = {}
    seen: set = set()
    files: set = set()  # the trace names taken, as a file system that ignores case sees them
    for number, raw in text_lines(tasks, source):  # number: the line's
        line = raw.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                item = json.loads(line)
            except ValueError as error:
                raise ConfigError(f"{source} line {number}: not a JSON object ({error})") from None
            task = item.get("task")
            if not isinstance(task, str) or not task.strip():
                raise ConfigError(f'{source} line {number}: "task" must be a text that is not empty')
            if item.get("check") is not None and (not isinstance(item["check"], str) or not item["check"].strip()):
                raise ConfigError(f'{source} line {number}: "check" must be a command line (a text that is not empty)')
            ident = item.get("id", number)
            if not isinstance(ident, (str, int)) or isinstance(ident, bool) or str(ident).strip() == "" \
                    or re.search(r"[\x00-\x1f\x7f]", str(ident)):
                raise ConfigError(f'{source} line {number}: "id" must be a whole number or a text of one line')
            for key in item.keys() - set(TASK_KEYS):
                unknown.setdefault(key, number)
            expected, match = item.get("expected"), item.get("match")
            if match is not None and match not in scoring.MATCHES:
                raise ConfigError(f'{source} line {number}: "match" must be one of {", ".join(scoring.MATCHES)}')
            try:
                if expected is not None:
                    scoring.check_expectation(expected, match)
            except scoring.BadExpectation as error:
                raise ConfigError(f"{source} line {number}: {error}") from None
            found.append(BatchTask(number, str(ident), task.strip(), item.get("check"), expected, match=match))
        else:
            found.append(BatchTask(number, str(number), line))
        ident = found[-1].id
        if ident in seen:
            earlier = next(task.line for task in found if task.id == ident)
            raise ConfigError(f"{source} line {number}: the id {ident!r} is also line {earlier}'s; each task"
                              " needs its own")
        seen.add(ident)
        name = file_name(ident)
        name = ident if name == ident else name  # one string kept, not two: a million tasks stay small
        folded = name.lower()
        if folded in files:  # two ids that differ only where a file name cannot
            name = f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:8]}"
            folded = name.lower()
        files.add(name if folded == name else folded)
        found[-1] = found[-1]._replace(file=name)
    if unknown and notes is not None:
        listed = ", ".join(f"{key!r} (line {line})" for key, line in list(unknown.items())[:5])
        notes.append(f"{source}: keys a task line does not know are passed by: {listed}; a task line knows"
                     f" {', '.join(TASK_KEYS)}")
    return found


def file_name(ident: str) -> str:
    """A file name for a task's id: its letters, digits, '.', '_' and '-' (others become '_'); an id
    that had others gets a hash of itself too, so two ids never share a name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", ident).strip("._")[:64] or "task"
    return safe if safe == ident else f"{safe}-{hashlib.sha256(ident.encode()).hexdigest()[:8]}"


def task_hash(text: str) -> str:
    """A short fingerprint of a task's text: a rerun knows a task whose text changed under the same id."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]
