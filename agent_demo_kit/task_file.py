"""A batch's task file: JSON Lines of tasks (or lines of plain text), read as data, a line at a
time: a task, its id, what its answer should be and how that is matched, and a check the user may
choose to run. Nothing in it runs or decides anything on its own.

Besides its own lines it reads the samples of inspect ({"input", "target", "id", "metadata"}) and of
OpenAI evals ({"input": [messages], "ideal"}) as they are; a file holds tasks of one format.

It imports endings, scoring and comparison.
"""
import difflib
import hashlib
import csv
import io
import itertools
import json
import re
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

from agent_demo_kit import promptfoo, scoring
from agent_demo_kit.comparison import Key
from agent_demo_kit.endings import ConfigError



TASK_KEYS = ("id", "task", "check", "expected", "match", "metadata")


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
    metadata: Optional[dict] = None  # what the file says of the task (category, difficulty, ...), never sent
    asserts: Optional[tuple] = None  # promptfoo's (type, value) pairs, all to pass; None: scored by expected

    @property
    def scored(self) -> bool:
        """Does the file say what its answer should be (expected, or asserts)?"""
        return self.expected is not None or bool(self.asserts)

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


def read_tasks(tasks: Any, source: str, notes: Optional[List[str]] = None,
               fields: Optional[Dict[str, str]] = None, named_by_suffix: bool = True) -> List[BatchTask]:
    """The tasks of a task file (a binary stream, or text): JSON Lines, a JSON object a line ({"id",
    "task", "check", "expected", "match", "metadata"}; only task is needed) or a line of plain text
    that is a task; a peer's samples (inspect's, OpenAI evals'); CSV or TSV with a header; promptfoo's
    tests (its CSV, or YAML by the file's name). Blank lines are passed by. The id is the line number
    (a YAML test's place) when none is given. fields (--fields) says which key or column is the task,
    the id, what is expected (task=question, expected=answer, ...). ConfigError naming the line for
    anything else: a key no task line knows (a typo such as "expectd" would score nothing), a line of
    another format (a JSON array, YAML in a .txt file), an id used twice, a file that is not text.
    notes gets what is said once (the keys --fields leaves out). named_by_suffix=False: the source's
    name says nothing of its format (a dataset's rows, JSON a line, from a folder named data.csv)."""
    found: List[BatchTask] = []
    seen: Dict[str, str] = {}  # id -> where it is ("line 3", "test 2")
    files: set = set()  # the trace names taken, as a file system that ignores case sees them
    unsent: Set[str] = set()  # promptfoo's vars that are not the task
    suffix = source.rpartition(".")[2].lower() if named_by_suffix and "." in source.rpartition("/")[2] else ""

    def keep(task: BatchTask, where: str) -> None:
        if task.id in seen:
            raise ConfigError(f"{where}: the id {task.id!r} is also {seen[task.id]}'s; each task needs its own")
        seen[task.id] = where.rpartition(f"{source} ")[2]
        name = file_name(task.id)
        name = task.id if name == task.id else name  # one string kept, not two: a million tasks stay small
        folded = name.lower()
        if folded in files:  # two ids that differ only where a file name cannot
            name = f"{name}-{hashlib.sha256(task.id.encode()).hexdigest()[:8]}"
            folded = name.lower()
        files.add(name if folded == name else folded)
        found.append(task._replace(file=name))

    if suffix in ("yaml", "yml"):  # promptfoo's tests
        for number, item in promptfoo.yaml_tests(tasks, source, fields, unsent, notes):
            keep(task_of(item, number, source, f"{source} test {number}"), f"{source} test {number}")
    elif suffix in OTHER_FORMATS:
        raise ConfigError(f"{source} is {OTHER_FORMATS[suffix]} by its name, not a task file: a task file is JSON Lines,"
                          ' a {"task": ...} object a line, CSV with a header, or a line of plain text a task')
    else:
        for number, task in line_tasks(tasks, source, suffix, fields, unsent, notes):
            keep(task, f"{source} line {number}")
    if unsent and notes is not None:
        notes.append(f"vars other than the task's are not sent: {', '.join(sorted(unsent)[:10])}")
    return found


def line_tasks(tasks: Any, source: str, suffix: str, fields: Optional[Dict[str, str]], unsent: Set[str],
               notes: Optional[List[str]]) -> Iterator[Tuple[int, BatchTask]]:
    """The tasks of a file read a line at a time (JSON Lines, plain text, CSV), with their lines."""
    first, shape_of_file, left_out = True, None, set()
    lines = text_lines(tasks, source)
    for number, raw in lines:  # number: the line's
        line = raw.strip()
        if not line:
            continue
        seen_as = structured(line, first)
        if first and (suffix in ("csv", "tsv") or seen_as and seen_as.startswith(("CSV with a header", "TSV with a"))):
            delimiter = "\t" if suffix == "tsv" or seen_as and seen_as.startswith("TSV") else ","
            entries: Iterator[Tuple[int, Any]] = csv_rows(raw, lines, number, source, delimiter, fields, unsent, notes)
            shape_of_file = "CSV"
        else:
            entries = iter([(number, line)])
        first = False
        for number, entry in entries:
            if isinstance(entry, dict):  # a CSV row, or promptfoo's test
                yield number, task_of(entry, number, source)
            elif seen_as:
                raise ConfigError(f"{source} line {number} looks like {seen_as}, not a task: a task file is JSON"
                                  ' Lines, a {"task": ...} object a line, CSV with a header, or a line of plain text'
                                  " a task (what a task expects must never reach the model as its text)")
            elif line.startswith("{"):
                try:
                    item = json.loads(line)
                except ValueError as error:
                    raise ConfigError(f"{source} line {number}: not a JSON object on one line ({error}): a task file"
                                      ' holds one {"task": ...} object a line') from None
                if fields and isinstance(item, dict):
                    item, dropped, named = with_fields(item, fields, f"{source} line {number}")
                    left_out.update(dropped)
                    by_name(notes, named)
                peer = peer_shape(item)
                shape = PEER_SHAPES.get(peer, "")
                shape_of_file = shape_of_file or shape or "agent-demo"
                if (shape or "agent-demo") != shape_of_file:
                    raise ConfigError(f"{source} line {number} is a task of {shape or 'agent-demo'}'s format, where"
                                      f" the file's first task is of {shape_of_file}'s: a file holds tasks of one format")
                if peer:  # a peer's sample, read as it is: its input the task, its answer what is expected
                    item = as_task_line(item, peer, f"{source} line {number}")
                yield number, task_of(item, number, source)
            else:
                if shape_of_file not in (None, "agent-demo"):
                    raise ConfigError(f"{source} line {number} is a line of plain text, where the file's first task is"
                                      f" of {shape_of_file}'s format: a file holds tasks of one format")
                shape_of_file = "agent-demo"
                yield number, BatchTask(number, str(number), line)
    if left_out and notes is not None:
        notes.append(f"--fields: {', '.join(sorted(left_out)[:10])} not read (not named by --fields)")


def task_of(item: Any, number: int, source: str, where: Optional[str] = None) -> BatchTask:
    """One task from a line's (or a row's, or a test's) object; ConfigError naming the line (where) for
    what it cannot be."""
    where = where or f"{source} line {number}"
    asserts = item.pop("asserts", None) if isinstance(item, dict) and "asserts" in item and \
        isinstance(item["asserts"], tuple) else None  # promptfoo's, made by its reader (never a JSON line's)
    unknown = sorted(item.keys() - set(TASK_KEYS))
    holder = next((key for key in unknown if isinstance(item[key], list) and item[key]
                   and all(isinstance(inner, dict) and "role" not in inner for inner in item[key])), None)
    if holder:  # {"tasks": [{...}, ...]}: a whole file's tasks in one object (not a list of chat messages)
        raise ConfigError(f"{where} looks like a JSON object holding the tasks (its key"
                          f" {holder!r}), not a task: a task file is JSON Lines, one {{\"task\": ...}} object a line")
    if unknown:  # before anything else: another format's keys say what it is
        raise ConfigError(f"{where}: {', '.join(map(json.dumps, unknown))}"
                          f" {'is no key' if len(unknown) == 1 else 'are no keys'} of a task line"
                          f"{meant_keys(unknown, item)}; a task line knows {', '.join(TASK_KEYS)}"
                          " (--fields names others)")
    task = item.get("task")
    if not isinstance(task, str) or not task.strip():
        raise ConfigError(f'{where}: "task" must be a text that is not empty')
    if item.get("check") is not None and (not isinstance(item["check"], str) or not item["check"].strip()):
        raise ConfigError(f'{where}: "check" must be a command line (a text that is not empty)')
    ident = item.get("id", number)
    if not isinstance(ident, (str, int)) or isinstance(ident, bool) or str(ident).strip() == "" \
            or re.search(r"[\x00-\x1f\x7f]", str(ident)):
        raise ConfigError(f'{where}: "id" must be a whole number or a text of one line')
    expected, match = item.get("expected"), item.get("match")
    if match is not None and match not in scoring.MATCHES:
        raise ConfigError(f'{where}: "match" must be one of {", ".join(scoring.MATCHES)}')
    try:
        if expected is not None:
            scoring.check_expectation(expected, match)
    except scoring.BadExpectation as error:
        raise ConfigError(f"{where}: {error}") from None
    metadata = item.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(value, (str, int, float, bool)) or value is None for value in metadata.values())):
        raise ConfigError(f'{where}: "metadata" must be an object of plain values'
                          ' ({"category": "math", "difficulty": 2})')
    return BatchTask(number, str(ident), task.strip(), item.get("check"), expected, match=match,
                     metadata=metadata or None, asserts=asserts or None)


READ_AS = {"task": "the task", "expected": "what is expected", "id": "the id", "match": "how it is matched",
           "check": "its check", "metadata": "its metadata"}
# A CSV column's name (lower case, spaces as _) and the task line's key it stands for.
COLUMNS = {**dict.fromkeys(("task", "input", "question", "prompt", "query", "instruction"), "task"),
           **dict.fromkeys(("expected", "answer", "target", "ideal", "label", "expected_output", "expected_answer",
                            "reference", "solution", "ground_truth", "gold"), "expected"),
           **dict.fromkeys(("id", "task_id", "name"), "id"), "match": "match", "check": "check"}


def csv_rows(header: str, lines: Iterator[Tuple[int, str]], number: int, source: str, delimiter: str,
             fields: Optional[Dict[str, str]], unsent: Set[str], notes: Optional[List[str]] = None
             ) -> Iterator[Tuple[int, dict]]:
    """The rows of CSV (or TSV) with a header, as task lines: the columns --fields names, and for what it
    leaves out the ones whose names say so (question is the task, answer what is expected); the others
    the task's metadata. Or promptfoo's tests, when its header names __expected or another column of
    promptfoo's."""
    reader = csv.reader(itertools.chain([header], (raw for _, raw in lines)), delimiter=delimiter)
    names = [name.strip() for name in next(reader)]
    if promptfoo.is_csv_of_tests(names):
        rows = ((number - 1 + reader.line_num, row) for row in reader if any(value.strip() for value in row))
        yield from promptfoo.csv_tests(rows, names, number, source, fields, unsent)
        return
    keys = {name: COLUMNS.get(name.lower().replace(" ", "_")) for name in names}
    if fields:
        missing = [column for column in fields.values() if column not in names]
        if missing:
            raise ConfigError(f"--fields: {source} has no column {', '.join(map(repr, missing))} (its columns:"
                              f" {', '.join(names)[:200]})")
        keys = {name: next((key for key, column in fields.items() if column == name), None) or
                (keys[name] if keys[name] not in fields else None) for name in names}
        by_name(notes, [name for name in names if keys[name] and name not in fields.values()])
    twice = sorted({key for key in keys.values() if key and list(keys.values()).count(key) > 1})
    if twice or len(set(names)) < len(names):
        raise ConfigError(f"{source} line {number}: its header names " + (f"the {twice[0]} twice" if twice else
                          "a column twice") + f" ({', '.join(names)[:200]}): name one with --fields")
    if "task" not in keys.values():
        raise ConfigError(f"{source} line {number}: no column of its header ({', '.join(names)[:200]}) is the task:"
                          " name one with --fields task=COLUMN (and expected=COLUMN, id=COLUMN)")
    for row in reader:
        if not any(value.strip() for value in row):
            continue
        if len(row) != len(names):
            raise ConfigError(f"{source} line {number - 1 + reader.line_num}: {len(row)} fields where its header has"
                              f" {len(names)}")
        item: Dict[str, Any] = {}
        for name, value in zip(names, row):
            if keys[name]:
                if value != "" or keys[name] == "task":
                    item[keys[name]] = value
            elif value != "":
                item.setdefault("metadata", {})[name] = value
        yield number - 1 + reader.line_num, item


def with_fields(item: dict, fields: Dict[str, str], where: str) -> Tuple[dict, List[str], List[str]]:
    """A JSON line's keys as --fields names them (task=question: its question is the task), and for
    what it leaves out the keys whose names say so (answer is what is expected); the keys not read,
    and the ones read by their names."""
    missing = [key for key in fields.values() if key not in item]
    if "task" in fields and fields["task"] in missing:
        raise ConfigError(f"{where}: no key {fields['task']!r} (--fields task={fields['task']}); its keys:"
                          f" {', '.join(map(str, item))[:200]}")
    named = {key: item[column] for key, column in fields.items() if column in item}
    meaning = {column: COLUMNS.get(column.lower().replace(" ", "_"), column if column == "metadata" else None)
               for column in item if column not in fields.values()}
    by_name = {column: key for column, key in meaning.items() if key and key not in fields}
    for key in dict.fromkeys(by_name.values()):
        columns = [column for column, meant in by_name.items() if meant == key]
        if len(columns) > 1:  # which one is the answer? Not the last one by chance
            raise ConfigError(f"{where}: {' and '.join(map(repr, columns[:3]))} are both {READ_AS[key]} by their"
                              f" names: name the one with --fields {key}=KEY")
    named.update({key: item[column] for column, key in by_name.items()})
    return named, [key for key in item if key not in fields.values() and key not in by_name], list(by_name)


def by_name(notes: Optional[List[str]], columns: List[str]) -> None:
    """Say once which columns --fields left out are read for what their names say."""
    if columns and notes is not None and "--fields: read by name" not in " ".join(notes):
        read = (f"{column!r} as {READ_AS[COLUMNS.get(column.lower().replace(' ', '_'), 'metadata')]}"
                for column in columns[:10])
        notes.append(f"--fields: read by name: {', '.join(read)}")


def parse_fields(text: str) -> Dict[str, str]:
    """--fields task=question,expected=answer,id=idx: each task line key and the column or key it is."""
    fields = {}
    for pair in text.split(","):
        key, _, column = pair.partition("=")
        key, column = key.strip(), column.strip()
        if key not in ("task", "expected", "id", "match") or not column:
            raise ValueError(f"give KEY=COLUMN pairs, KEY one of task, expected, id, match: got {pair.strip()!r}")
        if key in fields:
            raise ValueError(f"{key} is named twice ({key}={fields[key]}, {key}={column}): give each key once")
        fields[key] = column
    if "task" not in fields:
        raise ValueError("name the task's column: task=COLUMN")
    if len(set(fields.values())) < len(fields):  # the task's own text as what is expected: a score of nothing
        raise ValueError(f"each key needs a column of its own: got {text.strip()!r}")
    return fields


PEER_SHAPES = {"inspect": "inspect", "evals": "OpenAI evals"}
PEER_KEYS = {"inspect": ("input", "target", "id", "metadata"), "evals": ("input", "ideal", "id", "metadata")}


def peer_shape(item: dict) -> Optional[str]:
    """Which peer's sample a JSON line is: OpenAI evals' ({"input": [messages], "ideal": ...}), inspect's
    ({"input": ..., "target": ..., "id", "metadata"}), or None (ours, or another's the reader names)."""
    if "task" in item or "input" not in item:
        return None
    return "evals" if "ideal" in item else "inspect"


def as_task_line(item: dict, shape: str, where: str) -> dict:
    """A peer's sample as a task line: its input the task (chat messages as their text), its target
    or ideal what is expected, never part of the task; ConfigError for a key it does not read."""
    name = PEER_SHAPES[shape]
    extra = sorted(item.keys() - set(PEER_KEYS[shape]))
    if extra:
        raise ConfigError(f"{where}: {', '.join(map(json.dumps, extra))} of {name}'s format"
                          f" {'is' if len(extra) == 1 else 'are'} not read here (a task is read from {', '.join(PEER_KEYS[shape])}): leave "
                          f"{'it' if len(extra) == 1 else 'them'} out")
    task = item["input"] if isinstance(item["input"], str) else messages_text(item["input"], where, name)
    answer = item.get("target" if shape == "inspect" else "ideal")
    line = {"task": task, **({"expected": answer} if answer not in (None, "", []) else {})}
    line.update({key: item[key] for key in ("id", "metadata") if key in item})
    return line


def messages_text(messages: Any, where: str, name: str) -> str:
    """The text of chat messages as one task: a lone message's content, else each as "role: content"."""
    if not isinstance(messages, list) or not messages or not all(
            isinstance(message, dict) and isinstance(message.get("role"), str) for message in messages):
        raise ConfigError(f'{where}: "input" of {name}\'s format must be a text or a list of chat messages')
    said = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # parts: the text ones
            content = "\n".join(part.get("text", "") for part in content if isinstance(part, dict)
                                and part.get("type") == "text" and isinstance(part.get("text"), str))
        if not isinstance(content, str):
            raise ConfigError(f"{where}: a message of \"input\" holds no text")
        said.append(content)
    if len(messages) == 1:
        return said[0]
    return "\n\n".join(f"{message['role']}: {text}" for message, text in zip(messages, said))


OTHER_FORMATS = {"parquet": "Parquet", "xlsx": "a spreadsheet",
                 "arrow": "Arrow"}
# The keys other formats give a task and its answer (inspect's input and target, OpenAI evals' ideal, ...),
# and the task line's key each stands for.
SAME_AS = {**dict.fromkeys(("input", "question", "prompt", "query", "instruction"), "task"),
           **dict.fromkeys(("target", "answer", "ideal", "label", "output", "expected_output", "reference", "solution",
                            "ground_truth", "gold"), "expected"), "task_id": "id", "name": "id"}
_ANSWER_WORDS = r"expected|expected[ _]output|expected[ _]answer|answer|target|ideal|label|solution|reference" \
                r"|ground[ _]truth|gold"
_KEY_WORDS = rf"task|input|question|prompt|query|instruction|id|vars|assert|{_ANSWER_WORDS}"
# What a line of another format looks like, where this file's format would take it for a task's text.
_HEADER_FIELD = re.compile(r'\s*"?([A-Za-z_][A-Za-z0-9_.-]*|__[a-z]+:[^"\t,;|]+)"?\s*')  # __metadata:NAME too
_COLUMN = re.compile(r'\s*"?[A-Za-z][A-Za-z0-9_.-]*( [A-Za-z0-9_.-]+){0,2}"?\s*')  # a name of up to three words
_KEY_COLUMN = re.compile(rf'\s*"?([A-Za-z]+[ _])?({_KEY_WORDS})([ _][A-Za-z]+)?"?\s*', re.IGNORECASE)  # Expected Answer
_KEYED = re.compile(  # a key in YAML, TOML, INI, a mapping written inline, a few-shot line: its word in group "key"
    rf"""^(-\s*)?["']?(?P<key>{_KEY_WORDS})["']?\s*(:|=)(\s|$|\S)"""  # at the start: task: x, - expected: 4, id=3
    rf"""|[{{,;|(]\s*["']?(?P<inline>{_KEY_WORDS})["']?\s*(:|=)"""  # after a separator: - {{task: x, expected: 4}}
    rf"""|["'](?P<quoted>{_KEY_WORDS})["']\s*(:|=)"""  # quoted anywhere: 'answer' => 4
    rf"""|\b(?P<assigned>{_ANSWER_WORDS})\s*(=|:=)"""  # assigned anywhere: expected=4
    r"""|\b(?P<expected>expected(?:[ _](?:output|answer))?|ground[ _]truth)\s*:"""  # what is 2+2? Expected: 4
    rf"""|[.?!)]\s+(?P<after>{_ANSWER_WORDS})\s*:"""  # what is 2+2? Answer: 4 (but: give the answer: 42)
    r"""|^Q\s*:.*[.?!]\s+(?P<a>A)\s*:""",  # Q: what is 2+2? A: 4
    re.IGNORECASE)
_TAG = re.compile(rf"<({_KEY_WORDS})>.*</\1>|^</?({_KEY_WORDS})>$", re.IGNORECASE)  # not HTML's <input> alone
_TABLE = re.compile(r"^\|.*\|$|^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?$")
_QUOTED_ROW = re.compile(r'^"(?:[^"]|"")*"\s*[,;]')
_SECTION = re.compile(r"^\[\[?[A-Za-z0-9_. -]+\]\]?$")


def structured(line: str, first: bool) -> Optional[str]:
    """What a line that does not start with "{" looks like when it is data of another format (a CSV or
    TSV header or row, a table, a JSON array or value, YAML, TOML, XML, a key of a task or its answer
    in any of them), or None for a line of plain text: such a line would reach the model as a task,
    with what it expects in it."""
    if line.startswith("{"):
        return None
    for delimiter, name in (("\t", "TSV"), (",", "CSV"), (";", "CSV"), ("|", "a table")):
        fields = line.split(delimiter)
        if first and len(fields) > 1 and (all(_HEADER_FIELD.fullmatch(field) for field in fields) or all(
                _COLUMN.fullmatch(field) for field in fields) and any(_KEY_COLUMN.fullmatch(field) for field in fields)):
            return f"{name} with a header ({','.join(field.strip().strip(chr(34)) for field in fields)[:80]})"
    if _TABLE.match(line):
        return "a Markdown table"
    if line in ("---", "..."):
        return "YAML (a document marker)"
    if line.startswith("[") and _SECTION.match(line):
        try:
            json.loads(line)
        except ValueError:
            return "a TOML or INI table header"
    if line.startswith("["):
        return "a JSON array"
    try:
        value = json.loads(line)
    except ValueError:
        pass
    else:
        return f"a JSON {'text' if isinstance(value, str) else 'value'}"
    if "\t" in line:
        return "TSV (fields apart by a tab)"
    if _QUOTED_ROW.match(line):
        return "CSV (a row of quoted fields)"
    keyed, tag = _KEYED.search(line), _TAG.search(line)
    if keyed:
        return f"YAML or a mapping (its key {next(word for word in keyed.groupdict().values() if word)!r})"
    return f"XML (its tag <{tag[1] or tag[2]}>)" if tag else None


def meant_keys(unknown: List[str], item: dict) -> str:
    """" (did you mean ...?)" for keys no task line knows: the nearest known key, or the one another
    format's key stands for (input: task), when the line does not have it already."""
    meant = {}
    for key in unknown:
        near = difflib.get_close_matches(key, TASK_KEYS, n=1, cutoff=0.6) or [SAME_AS.get(key.lower(), "")]
        if near[0] and near[0] not in item:
            meant[key] = near[0]
    if len(unknown) == 1 and meant:
        return f' (did you mean "{meant[unknown[0]]}"?)'
    said = ", ".join(f'"{known}" for {json.dumps(key)}' for key, known in meant.items())
    return f" (did you mean {said}?)" if said else ""


def file_name(ident: str) -> str:
    """A file name for a task's id: its letters, digits, '.', '_' and '-' (others become '_'); an id
    that had others gets a hash of itself too, so two ids never share a name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", ident).strip("._")[:64] or "task"
    return safe if safe == ident else f"{safe}-{hashlib.sha256(ident.encode()).hexdigest()[:8]}"


def task_hash(text: str) -> str:
    """A short fingerprint of a task's text: a rerun knows a task whose text changed under the same id."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]
