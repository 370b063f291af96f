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
        value = [each.strip() for each in value.split(",")]
    elif value is not None and kind not in ("contains-json", "is-json"):
        value = value.strip()
    return (inverse or "") + kind, value or None


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
            value = [each.strip() for each in value.split(",")]
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
                              f" {', '.join(map(str, variables))[:200] or 'none'})")
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
                                  f" {', '.join(map(str, variables))[:200] or 'none'}")
        elif len(variables) == 1:
            [name] = variables
        elif not variables:
            raise ConfigError(f"{where}: the test has no vars, so no task")
        else:
            raise ConfigError(f"{where}: which var is the task? (vars: {', '.join(map(str, variables))[:200]}):"
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
