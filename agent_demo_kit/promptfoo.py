"""promptfoo's test cases, read as they are: its CSV (a column a var; __expected, __expected2, ...
an assert each, __description, __metadata:NAME) and its YAML (a list of test cases, or a
promptfooconfig with prompts, defaultTest and tests). Each test becomes a task line: its text the
first prompt with the test's vars in it (else its one var, or the var --fields names), its asserts
judged after the run (scoring.ASSERTS) and never sent, its description and metadata its metadata.
What cannot be read or scored as written is refused, naming the test and what was seen. Nothing in
a file runs, names a file to read, or reaches a request but the task's text.

It imports endings and scoring; PyYAML only when a YAML file is read.
"""
import re
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from agent_demo_kit import scoring
from agent_demo_kit.endings import ConfigError

# promptfoo's assert types (a few versions' worth): a CSV cell that starts with one of them and ":"
# is that assert, not a text to equal; those outside scoring.ASSERTS are refused.
ASSERT_TYPES = (
    "answer-relevance", "bleu", "classifier", "contains-all", "contains-any", "contains-html", "contains-json",
    "contains-sql", "contains-xml", "contains", "context-faithfulness", "context-recall", "context-relevance",
    "conversation-relevance", "cost", "equals", "factuality", "finish-reason", "g-eval", "gleu", "guardrails",
    "human", "icontains-all", "icontains-any", "icontains", "is-html", "is-json", "is-refusal", "is-sql",
    "is-valid-function-call", "is-valid-openai-function-call", "is-valid-openai-tools-call", "is-xml", "javascript",
    "latency", "levenshtein", "llm-rubric", "max-score", "meteor", "model-graded-closedqa",
    "model-graded-factuality", "moderation", "perplexity-score", "perplexity", "pi", "python", "regex", "rouge-l",
    "rouge-n", "rouge-s", "ruby", "search-rubric", "select-best", "similar:cosine", "similar:dot",
    "similar:euclidean", "similar", "skill-used", "starts-with", "tool-call-f1", "trace-error-spans",
    "trace-span-count", "trace-span-duration", "trajectory:goal-success", "trajectory:step-count",
    "trajectory:tool-args-match", "trajectory:tool-sequence", "trajectory:tool-used", "webhook", "word-count")
_CELL_ASSERT = re.compile(rf"(not-)?({'|'.join(map(re.escape, ASSERT_TYPES))})(?:\((\d+(?:\.\d+)?)\))?(?::(.*))?",
                          re.DOTALL)
_CELL_CODE = (("javascript:", "javascript"), ("fn:", "javascript"), ("eval:", "javascript"), ("grade:", "llm-rubric"),
              ("llm-rubric:", "llm-rubric"), ("python:", "python"))
_VAR = re.compile(r"\{\{\s*([A-Za-z_$][\w$]*)\s*\}\}")
_TEMPLATE_TAG = re.compile(r"\{\{|\{%|\{#")  # what nunjucks reads beyond {{ var }}
TEST_KEYS = ("vars", "assert", "description", "metadata")  # what a test case says that is read here
CSV_COLUMNS_PASSED_BY = ("__metric",)  # names a score: it changes no verdict


def said(names: Any) -> str:
    """Names from a file (vars, keys), each on one line and short, for a message of one line."""
    return ", ".join(" ".join(str(name).split())[:40] for name in names)[:200]


def cell_assert(cell: str) -> Optional[Tuple[str, Any]]:
    """An __expected cell as promptfoo reads it: "contains: x", "not-icontains:x", "regex:^a",
    javascript:, grade:, python:, file://...; plain text is what the output equals. None for an empty
    cell."""
    cell = cell.strip()
    if not cell:
        return None
    for prefix, kind in _CELL_CODE:
        if cell.startswith(prefix):
            return kind, cell[len(prefix):].strip()
    if cell.startswith("file://"):
        return ("python" if ".py" in cell else "javascript"), cell
    found = _CELL_ASSERT.fullmatch(cell)
    if not found:
        return "equals", cell
    inverse, kind, _, value = found.groups()
    if value is not None and kind.endswith(("-any", "-all")):
        value = listed(value)
    elif value is not None and kind not in ("contains-json", "is-json"):
        value = value.strip()
    return (inverse or "") + kind, value or None


def listed(value: str) -> List[str]:
    """A -any or -all assert's list written as one text, "Paris, London": its pieces, the empty ones
    left out (as promptfoo's split leaves them), or "" would be in every answer."""
    return [piece.strip() for piece in value.split(",") if piece.strip()]


def checked_assert(kind: Any, value: Any, variables: Dict[str, Any], where: str, what: str) -> Tuple[str, Any]:
    """An assert made ready to judge: its value's {{var}}s filled in from the test's vars; ConfigError
    naming where it is for a type this cannot score, a value of the wrong kind, a file it names."""
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{where}: {what} has no type (give type: contains, value: ...)")
    base = kind[4:] if kind.startswith("not-") else kind
    if base not in scoring.ASSERTS:
        shown = kind if re.fullmatch(r"[a-z][a-z0-9:-]{0,40}", kind) else repr(kind[:40])
        raise ConfigError(f"{where}: {what} holds a {shown} assert, which cannot be scored here (only"
                          f" {', '.join(scoring.ASSERTS)} and their not- forms): leave it out, or score it with"
                          " --scorer FILE:FUNCTION")
    if isinstance(value, str) and value.startswith("file://") or isinstance(value, list) and any(
            isinstance(each, str) and each.startswith("file://") for each in value):
        raise ConfigError(f"{where}: {what} names a file ({str(value)[:80]!r}): a file of tests names no file to"
                          " read; write the value in")
    value = filled(value, variables, where, what)
    try:
        if isinstance(value, str) and base.endswith(("-any", "-all")):
            if '"' in value or "'" in value:  # promptfoo reads quotes there; this reader does not
                raise scoring.BadExpectation(f"a {kind} assert's value must be a list of texts or numbers")
            value = listed(value)
        scoring.check_assert(kind, value)
    except scoring.BadExpectation as error:
        raise ConfigError(f"{where}: {what}: {error}") from None
    return kind, value


def filled(value: Any, variables: Dict[str, Any], where: str, what: str) -> Any:
    """A value with the test's vars in its {{var}}s (a text, or the texts of a list)."""
    if isinstance(value, str):
        return render(value, variables, where, what)
    if isinstance(value, list):
        return [filled(each, variables, where, what) if isinstance(each, str) else each for each in value]
    return value


def render(template: str, variables: Dict[str, Any], where: str, what: str) -> str:
    """A template with each {{ var }} as the var's plain text; ConfigError for a var the test does
    not have, or nunjucks beyond {{ var }} (filters, tags, fields), which is not rendered here."""
    if _TEMPLATE_TAG.search(_VAR.sub("", template)):
        raise ConfigError(f"{where}: {what} uses nunjucks beyond {{{{var}}}} (a filter, a tag, a field:"
                          f" {template[:80]!r}), which is not rendered here")

    def var(found: "re.Match") -> str:
        name = found[1]
        if name not in variables:
            raise ConfigError(f"{where}: {what} uses {{{{{name}}}}}, which is no var of the test (its vars:"
                              f" {said(variables) or 'none'})")
        return var_text(variables[name], name, where)
    return _VAR.sub(var, template)


def var_text(value: Any, name: str, where: str) -> str:
    """A var's value as a prompt holds it: text as it is, a number or true/false as JavaScript writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.startswith("file://"):
        raise ConfigError(f"{where}: the var {name!r} names a file ({value[:80]!r}): a file of tests names no"
                          " file to read; write the value in")
    if isinstance(value, (str, int, float)):
        return scoring.js_string(value)
    why = ("a list (promptfoo runs a test for each of its values)" if isinstance(value, list) else
           "empty" if value is None else f"a {type(value).__name__}, not a text")
    raise ConfigError(f"{where}: the var {name!r} is {why}: give it as a text")


def task_line(variables: Dict[str, Any], asserts: List[Tuple[str, Any]], metadata: Dict[str, Any], where: str,
              fields: Optional[Dict[str, str]], prompt: Optional[str], unsent: Set[str]) -> dict:
    """A test as a task line (with its "asserts"): its text the prompt with its vars in it, else the
    one var or the var --fields names (the others go to `unsent`, never to a request)."""
    if prompt is not None:
        task = render(prompt, variables, where, "the prompt")
    else:
        if fields and "task" in fields:
            name = fields["task"]
            if name not in variables:
                raise ConfigError(f"{where}: no var {name!r} (--fields task={name}); its vars:"
                                  f" {said(variables) or 'none'}")
        elif len(variables) == 1:
            [name] = variables
        elif not variables:
            raise ConfigError(f"{where}: the test has no vars, so no task")
        else:
            raise ConfigError(f"{where}: which var is the task? (vars: {said(variables)}):"
                              " name it with --fields task=VAR")
        task = var_text(variables[name], name, where)
        unsent.update(str(other) for other in variables if other != name)
    line: Dict[str, Any] = {"task": task, "asserts": tuple(asserts)}
    if fields and "id" in fields:
        if fields["id"] not in variables:
            raise ConfigError(f"{where}: no var {fields['id']!r} (--fields id={fields['id']})")
        line["id"] = variables[fields["id"]]
    if metadata:
        line["metadata"] = metadata
    return line


def check_fields(fields: Optional[Dict[str, str]], source: str, has_prompt: bool = False) -> None:
    """--fields names a promptfoo file's task var and id var only: its asserts say what is expected."""
    other = sorted(set(fields or ()) - {"task", "id"})
    if other:
        raise ConfigError(f"--fields: {source} is promptfoo's: its asserts say what is expected; --fields names"
                          f" the task's var and the id's (not {', '.join(other)})")
    if has_prompt and fields and "task" in fields:
        raise ConfigError(f"--fields task={fields['task']}: {source} has prompts, and its first prompt with the"
                          " vars in it is the task")


# --- promptfoo's CSV ----------------------------------------------------------------------------

def is_csv_of_tests(names: List[str]) -> bool:
    """Is a CSV header promptfoo's (a column named __expected, __description, __metadata:...)?"""
    return any(name.startswith("__") for name in names)


def csv_tests(rows: Iterator[Tuple[int, List[str]]], names: List[str], header_line: int, source: str,
              fields: Optional[Dict[str, str]], unsent: Set[str]) -> Iterator[Tuple[int, dict]]:
    """The task lines of promptfoo's CSV, a row a test: each __expected column an assert, the other
    columns vars, __description and __metadata:NAME its metadata."""
    check_fields(fields, source)
    for name in names:
        if name.startswith("__") and not (re.fullmatch(r"__expected\d*", name) or name == "__description"
                                          or name in CSV_COLUMNS_PASSED_BY
                                          or re.fullmatch(r"__metadata:[^\[\]]+", name)):
            raise ConfigError(f"{source} line {header_line}: {name[:60]!r} of promptfoo's CSV is not read here"
                              " (it would change what is sent or how a test passes): leave it out")
    for number, row in rows:
        where = f"{source} line {number}"
        if len(row) != len(names):
            raise ConfigError(f"{where}: {len(row)} fields where its header has {len(names)}")
        variables = {name: value for name, value in zip(names, row) if not name.startswith("__")}
        asserts, metadata = [], {}
        for name, value in zip(names, row):
            if name.startswith("__expected"):
                found = cell_assert(value)
                if found:
                    asserts.append(checked_assert(*found, variables, where, name))
            elif name == "__description" and value.strip():
                metadata["description"] = value
            elif name.startswith("__metadata:") and value.strip():
                metadata[name.partition(":")[2]] = value
        yield number, task_line(variables, asserts, metadata, where, fields, None, unsent)


# --- promptfoo's YAML ---------------------------------------------------------------------------

MAX_YAML_BYTES = 2 << 20  # a file of tests larger than this is no file someone wrote (CSV holds more)
MOST_YAML_VALUES = 1_000_000  # values a file may hold, its aliases expanded (each *name counts again)
DEEPEST_YAML = 64  # levels of nesting
CONFIG_READ = ("prompts", "tests", "defaultTest", "description")
CONFIG_REFUSED = ("scenarios", "redteam", "extensions", "nunjucksFilters")  # they add tests or change a verdict
ASSERT_KEYS = ("type", "value", "metric", "weight")  # a metric names a score; a weight changes no verdict


def yaml_tests(tasks: Any, source: str, fields: Optional[Dict[str, str]], unsent: Set[str],
               notes: Optional[List[str]]) -> Iterator[Tuple[int, dict]]:
    """The task lines of promptfoo's YAML (a list of test cases, or a promptfooconfig with prompts,
    defaultTest and tests), each with its place among the tests."""
    data = load_yaml(tasks, source)
    prompt, defaults = None, {}
    if isinstance(data, dict) and "tests" in data:
        refused = [str(key) for key in data if key in CONFIG_REFUSED]
        if refused:
            raise ConfigError(f"{source}: {said(refused[:1])} of a promptfooconfig is not read here (it adds tests or"
                              " changes how they are judged): leave it out")
        passed = sorted(str(key) for key in data if key not in CONFIG_READ)
        if passed and notes is not None:
            notes.append(f"{said(passed)} of {source} not read"
                         + (" (the model is --model's)" if "providers" in passed else ""))
        prompt = first_prompt(data.get("prompts"), source, notes)
        defaults = data.get("defaultTest") or {}
        if not isinstance(defaults, dict):
            raise ConfigError(f"{source}: defaultTest is not a test case ({str(defaults)[:80]!r}): write it in")
        check_test_keys(defaults, f"{source} defaultTest")
        for number, item in enumerate(as_list(defaults.get("assert"), f"{source} defaultTest"), 1):
            kind = item.get("type") if isinstance(item, dict) else None
            if not (isinstance(kind, str) and (kind[4:] if kind.startswith("not-") else kind) in scoring.ASSERTS):
                checked_assert(kind, "", {}, f"{source} defaultTest", f"assert {number}")  # refused, named
        data = data["tests"]
    elif isinstance(data, dict) or data is not None and not isinstance(data, list):
        raise ConfigError(f"{source} is neither a list of promptfoo's test cases nor a config with tests: (it holds"
                          f" {'a mapping of ' + said(data) if isinstance(data, dict) else 'a ' + type(data).__name__})")
    if isinstance(data, str):
        raise ConfigError(f"{source}: tests: names files ({data[:80]!r}): give each file to --batch")
    if not data:
        raise ConfigError(f"{source} holds no test cases")
    if not isinstance(data, list):
        raise ConfigError(f"{source}: tests: is not a list of test cases")
    check_fields(fields, source, prompt is not None)
    for number, test in enumerate(data, 1):
        if isinstance(test, str):
            raise ConfigError(f"{source} test {number} is a file name ({test[:80]!r}): give it to --batch")
        if not isinstance(test, dict):
            raise ConfigError(f"{source} test {number} is not a test case (vars, assert, description, metadata)")
        description = test.get("description")
        where = f"{source} test {number}" + (f" ({str(description)[:60]!r})" if description else "")
        check_test_keys(test, where)
        variables = {**as_mapping(defaults.get("vars"), where, "vars"), **as_mapping(test.get("vars"), where, "vars")}
        asserts = [assert_of(item, variables, where, f"defaultTest's assert {n}")
                   for n, item in enumerate(as_list(defaults.get("assert"), where), 1)]
        asserts += [assert_of(item, variables, where, f"assert {n}") for n, item in enumerate(as_list(
            test.get("assert"), where), 1)]
        metadata = {**as_mapping(defaults.get("metadata"), where, "metadata"),
                    **as_mapping(test.get("metadata"), where, "metadata")}
        for key, value in metadata.items():
            if not (isinstance(value, (str, int, float, bool)) or value is None):
                raise ConfigError(f"{where}: metadata {said([key])!r} must be a plain value (a text, a number,"
                                  " true or false)")
        if description:
            metadata["description"] = str(description)
        yield number, task_line(variables, asserts, metadata, where, fields, prompt, unsent)


def load_yaml(tasks: Any, source: str) -> Any:
    """A YAML file's data, by PyYAML's safe loader (no tags that make objects) with YAML 1.2's core
    schema (core_schema_loader), within MAX_YAML_BYTES;
    ConfigError when PyYAML is missing, for what is not YAML, and for a file whose aliases expand past
    MOST_YAML_VALUES or that refers to itself (a "billion laughs": safe_load shares what an alias
    names, and anything that walks the data would expand it)."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"{source} is YAML: reading it needs PyYAML: pip install 'agent-demo[yaml]'") from None
    raw = tasks.encode("utf-8", "surrogatepass") if isinstance(tasks, str) else tasks.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{source} is larger than {MAX_YAML_BYTES >> 20} MB: not a file of tests someone wrote")
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, 0, 1, "a NUL byte")
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source} is not text (a NUL byte, or bytes that are not UTF-8)") from None
    try:
        data = yaml.load(text, Loader=core_schema_loader(yaml))  # noqa: S506 (a safe loader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        problem = " ".join(str(error.problem or error.context).split())[:160]
        if "nesting depth" in problem:  # libyaml's own limit, before Python's recursion limit
            raise ConfigError(f"{source} is nested too deeply: not a file of tests someone wrote") from None
        raise ConfigError(f"{source} is not YAML (line {mark.line + 1 if mark else '?'}: {problem})") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{source} is not YAML ({' '.join(str(error).split())[:160]})") from None
    except RecursionError:
        raise ConfigError(f"{source} is nested too deeply: not a file of tests someone wrote") from None
    except ValueError as error:  # an integer of thousands of digits, say
        raise ConfigError(f"{source} is not YAML ({' '.join(str(error).split())[:160]})") from None
    count = 0

    def walk(value: Any, depth: int, inside: Set[int]) -> None:
        nonlocal count
        count += 1
        if count > MOST_YAML_VALUES:
            raise ConfigError(f"{source} holds more than {MOST_YAML_VALUES:,} values, its aliases (*name) expanded:"
                              " not a file of tests someone wrote")
        if isinstance(value, (dict, list)):
            if id(value) in inside:
                raise ConfigError(f"{source} refers to itself (an alias inside its own anchor): not a file of tests")
            if depth > DEEPEST_YAML:
                raise ConfigError(f"{source} is nested too deeply (more than {DEEPEST_YAML} levels): not a file of"
                                  " tests someone wrote")
            inside.add(id(value))
            for child in value.values() if isinstance(value, dict) else value:
                walk(child, depth + 1, inside)
            inside.discard(id(value))
    walk(data, 0, set())
    return data


YAML_TAG = "tag:yaml.org,2002:"
CORE_SCHEMA = (  # YAML 1.2's, as promptfoo's js-yaml reads a file: what a plain scalar is, by its form
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    ("float", r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
     "-+0123456789."),
)


def core_schema_loader(yaml: Any) -> Any:
    """PyYAML's safe loader (its C one when there is one: a fourth of the time and half the memory) with
    YAML 1.2's core schema in place of 1.1's, as promptfoo reads its files: NO, on, 12:30, 0755 and
    1_000 stay as they are written (1.1 reads false, true, 750, 493 and 1000)."""
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        pass
    replaced = {YAML_TAG + kind for kind, _, _ in CORE_SCHEMA}
    Loader.yaml_implicit_resolvers = {first: [(tag, form) for tag, form in pairs if tag not in replaced]
                                      for first, pairs in base.yaml_implicit_resolvers.items()}
    for kind, form, firsts in CORE_SCHEMA:
        Loader.add_implicit_resolver(YAML_TAG + kind, re.compile(f"^(?:{form})$"), list(firsts))
    Loader.add_constructor(YAML_TAG + "int", lambda loader, node: core_int(loader.construct_scalar(node)))
    Loader.add_constructor(YAML_TAG + "float", lambda loader, node: core_float(loader.construct_scalar(node)))
    return Loader


def core_int(text: str) -> int:
    """An integer as YAML 1.2 writes one: 0o17, 0x1F, else decimal (0755 is 755)."""
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    base = 8 if digits.startswith("0o") else 16 if digits.startswith("0x") else 10
    return sign * int(digits[2:] if base != 10 else digits, base)


def core_float(text: str) -> float:
    """A float as YAML 1.2 writes one: 1e3, .5, .inf, .nan."""
    folded = text.lower().replace(".inf", "inf").replace(".nan", "nan")
    return float(folded)


def first_prompt(prompts: Any, source: str, notes: Optional[List[str]]) -> Optional[str]:
    """The template of each task: the first of a promptfooconfig's prompts (a text, or {raw: text})."""
    if prompts is None or prompts == []:
        return None
    listed = prompts if isinstance(prompts, list) else [prompts]
    first = listed[0].get("raw") if isinstance(listed[0], dict) else listed[0]
    if isinstance(first, str) and first.startswith("file://") or isinstance(listed[0], dict) and str(
            listed[0].get("id", "")).startswith("file://"):
        raise ConfigError(f"{source}: prompt 1 names a file ({str(first or listed[0].get('id'))[:80]!r}): a file of"
                          " tests names no file to read; write the prompt in")
    if not isinstance(first, str) or not first.strip():
        raise ConfigError(f"{source}: prompt 1 is not a text (give prompts: a list of templates with {{{{var}}}})")
    if len(listed) > 1 and notes is not None:
        notes.append(f"{source} has {len(listed)} prompts: the first is each test's task (promptfoo runs each"
                     " test with each prompt)")
    return first


def check_test_keys(test: dict, where: str) -> None:
    """ConfigError for what a test case says that is not read here (threshold, options, provider, ...)."""
    unknown = [str(key) for key in test if key not in TEST_KEYS]
    if unknown:
        raise ConfigError(f"{where}: {said(unknown[:1])} of a promptfoo test is not read here (it would change what"
                          " is sent or how the test passes): leave it out")


def assert_of(item: Any, variables: Dict[str, Any], where: str, what: str) -> Tuple[str, Any]:
    """A test case's {type, value} assert, made ready to judge."""
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: {what} is not an assert ({{type: contains, value: ...}})")
    unknown = [str(key) for key in item if key not in ASSERT_KEYS]
    if unknown:
        raise ConfigError(f"{where}: {what}'s {said(unknown[:1])} is not read here (it would change how it passes):"
                          " leave it out")
    return checked_assert(item.get("type"), item.get("value"), variables, where, what)


def as_list(value: Any, where: str) -> list:
    """A test's asserts as a list (none: empty); ConfigError naming where for anything else."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where}: assert is not a list of asserts")
    return value


def as_mapping(value: Any, where: str, name: str) -> dict:
    """A test's vars or metadata as a mapping of texts (none: empty); ConfigError naming it for anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {name} is not a mapping ({str(value)[:80]!r})")
    return {str(key): item for key, item in value.items()}
