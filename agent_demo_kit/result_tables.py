"""The results for people: --summary's tables (one configuration's figures, configurations side by
side, the tasks where they differ, each paired test in words), as aligned text or as Markdown for a
pull request, and the command that runs the failed tasks again. What comes from a results file
(ids, answers, names, metadata) is shown inert, on one line, and as text in Markdown.

It imports comparison, metrics and terminal.
"""
import json
import os
import shlex
from typing import Any, List, Optional

from agent_demo_kit import metrics
from agent_demo_kit.comparison import DIFFERENCES_SHOWN, MOST_COLUMNS, SIGNIFICANCE
from agent_demo_kit.terminal import inert


def render_comparison(data: dict, markdown: bool = False) -> List[str]:
    """The side-by-side table, the differing tasks and the tests, as text or as Markdown tables."""
    columns = data["configurations"]
    lines = table(["", *(column["label"] for column in columns)], figure_rows(columns), markdown)
    lines += [seal_note(column) for column in columns if column.get("not_sealed_by_you")]
    left_out = data.get("left_out") or {}
    if left_out.get("configurations"):
        lines.append(f"... and {left_out['configurations']} more configuration(s), {left_out['lines']} line(s), not shown:"
                     f" at most {MOST_COLUMNS} side by side; give fewer folders")
    differences = data["differences"]
    lines.append("")
    if differences:
        said = "pass rate over every try; answers of the first" if any(
            run and "passed" in run for entry in differences for run in entry["runs"]) else "first try"
        lines.append(f"{len(differences)} task(s) where they differ ({said}; a different outcome first):")
        body = [[entry["id"], *(run_cell(run) for run in entry["runs"])] for entry in differences[:DIFFERENCES_SHOWN]]
        lines += table(["task", *(column["label"] for column in columns)], body, markdown)
        if len(differences) > DIFFERENCES_SHOWN:
            lines.append(f"... and {len(differences) - DIFFERENCES_SHOWN} more (--json lists them all)")
    else:
        lines.append("no task where they differ")
    lines.append("")
    lines += test_lines(data["tests"])
    return as_markdown(lines) if markdown else lines


def test_lines(tests: List[dict]) -> List[str]:
    """Each paired test in words: the same on the terminal, in Markdown and on the report page."""
    lines = []
    for test in tests:
        test = {**test, "first": table_cell(test["first"]), "second": table_cell(test["second"])}  # on one line
        verdict = "more than noise" if test["more_than_noise"] else "could be noise"
        if test.get("test", "exact McNemar test") == "exact McNemar test":
            lines.append(f"{test['second']} vs {test['first']}: on {test['both_ran']} task(s) both ran, right only with"
                         f" {test['second']} {test['only_second']}, only with {test['first']} {test['only_first']};"
                         f" exact McNemar test p = {test['p_value']:.3g} ({verdict} at"
                         f" {test.get('level', SIGNIFICANCE):g})")
        else:
            lines.append(f"{test['second']} vs {test['first']}: on {test['both_ran']} task(s) both ran, passed more"
                         f" often with {test['second']} {test['only_second']}, with {test['first']}"
                         f" {test['only_first']}; {test['test']} p = {test['p_value']:.3g} ({verdict} at"
                         f" {test.get('level', SIGNIFICANCE):g})")
    return lines


def seal_note(column: dict) -> str:
    """What a column's lines that carry no seal of yours are."""
    return (f"{table_cell(column['label'])}: {column['not_sealed_by_you']} line(s) not sealed by you (written by"
            " another user, or changed since): their figures are that folder's word, not your results")


FIGURES = ("tasks", "completion", "accuracy", "pass@1 / pass^k", "rounds (mean)", "tokens", "cost", "time p50",
           "time p95", "failed or wrong")


def render_single(summary: dict, markdown: bool = True) -> List[str]:
    """One configuration's figures as a table (Markdown, to paste into a pull request)."""
    column = {"summary": summary, "failures": len(summary.get("failures") or [])}
    return table(["", str((summary.get("config") or {}).get("model") or "runs")], figure_rows([column]), markdown)


def rerun_command(summary: dict) -> str:
    """The command that runs a folder's failed and wrong tasks again, with the flags of its configuration;
    never a check from a folder that is not yours, or from lines you did not seal (a command someone
    else wrote, such as curl ... | sh)."""
    config, folder = summary.get("config") or {}, summary["folders"][0]
    tasks_file = None
    try:
        with open(os.path.join(folder, "summary.json"), encoding="utf-8") as file:
            tasks_file = json.load(file).get("tasks_file")
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    words = ["agent-demo", "--batch", str(tasks_file or "FILE"), "--out", folder]
    if config.get("model"):
        words += ["-m", str(config["model"])]
    trusted = summary.get("yours", True) and not summary.get("not_sealed_by_you")
    for name, flag in (("mode", "--mode"), ("max_rounds", "--max-rounds"), ("check", "--check"),
                       ("escalate", "--escalate")):
        if name == "check" and not trusted:
            continue
        if config.get(name) is not None and not (name == "mode" and config[name] == "json"):
            words += [flag, str(config[name])]
    tools = config.get("tools") if isinstance(config.get("tools"), list) else []
    named = [str(tool) for tool in tools if not str(tool).startswith(("file ", "mcp ", "mcp-config "))]
    if named and named != ["all"]:  # --tools: a folder of other tools is another configuration
        words += ["--tools", ",".join(named)]
    tries = (summary.get("repeats") or {}).get("tries")
    if tries and tries > 1:
        words += ["--repeat", str(tries)]
    return shlex.join(words + ["--rerun-failed"])


def figure_rows(columns: List[dict]) -> List[List[str]]:
    """The figures of these columns (each a summary and its count of failures), a row a figure and a
    cell a column, without the rows none of them has: the same on the terminal, in Markdown and on the
    report page."""
    rows = [[name, *(cell(column, name) for column in columns)] for name in figure_names(columns)]
    return [row for row in rows if any(value != "n/a" for value in row[1:])]


def figure_names(columns: List[dict]) -> List[str]:
    """The rows of a table of these columns: the figures, then each --scorer's score, the --judge's cost
    and each group of the tasks' metadata that one of them has."""
    names = list(FIGURES)
    for column in columns:
        summary = column["summary"]
        names += [f"score {name}" for name in summary.get("scores") or {} if f"score {name}" not in names]
        names += ["judge"] if summary.get("judge") and "judge" not in names else []
        names += ["scorer failed"] if summary.get("scorer_errors") and "scorer failed" not in names else []
        names += [f"by {key}: {value}" for key, values in (summary.get("groups") or {}).items()
                  for value in values if f"by {key}: {value}" not in names]
    return names


def cell(column: dict, name: str) -> str:
    """One figure of a column."""
    summary = column["summary"]
    if name.startswith("score "):
        score = (summary.get("scores") or {}).get(name[len("score "):])
        return "n/a" if not score else f"{score['mean']:.3g} ({score['runs']} runs)"
    if name == "judge":  # what the --judge model cost, apart from the runs'
        judged = summary.get("judge")
        return "n/a" if not judged else f"{judged['runs']} graded, {judged['tokens']['total']:,} tokens" + (
            f", {metrics.dollars(judged['cost'])}" if judged.get("cost") is not None else "") + (
            f", {judged['errors']} it could not grade" if judged.get("errors") else "")
    if name == "scorer failed":
        return f"{summary['scorer_errors']} run(s)" if summary.get("scorer_errors") else "n/a"
    if name.startswith("by "):
        key, _, value = name[len("by "):].partition(": ")
        group = ((summary.get("groups") or {}).get(key) or {}).get(value)
        if not group:
            return "n/a"
        return f"{group['accuracy']:.1%} of {group['scored']}" if group["scored"] else \
            f"{group['success_rate']:.1%} succeeded of {group['runs']}"
    runs = summary.get("runs", summary["tasks"])
    if name == "tasks":  # with --repeat, how many runs too: the figures below count runs
        return str(summary["tasks"]) + (f" ({runs} runs)" if runs != summary["tasks"] else "")
    if name == "failed or wrong":
        return str(column["failures"]) + (" runs" if runs != summary["tasks"] else "")
    share = lambda value: "n/a" if value is None else f"{value:.1%}"  # noqa: E731
    if name == "completion":
        return share(summary["completion_rate"])
    if name == "accuracy":
        if not summary.get("scored"):
            return "n/a"
        low, high = summary["accuracy_interval"]
        return f"{share(summary['accuracy'])} ({share(low)}-{share(high)})"
    if name == "pass@1 / pass^k":
        repeated = summary.get("repeats")
        return f"{share(repeated['pass_at_1'])} / {share(repeated['pass_all'])}" if repeated else "n/a"
    if name == "rounds (mean)":
        return f"{summary['rounds']['mean']:g}"
    if name == "tokens":
        return f"{summary['tokens']['total']:,}"
    if name == "cost":
        return "n/a" if summary.get("cost") is None else metrics.dollars(summary["cost"])
    return f"{summary['seconds'][name[-3:]]:.3g} s"  # time p50, time p95


def run_cell(run: Optional[dict]) -> str:
    """How one configuration did on one task: its status or correctness, and its answer."""
    if run is None:
        return "-"
    said = "right" if run["correct"] is True else "wrong" if run["correct"] is False else run["status"]
    if run["status"] != "finished" and run["correct"] is not None:
        said = run["status"]
    if run.get("answered_in_words") and run["status"] == "finished":  # no finish call: words taken as the answer
        said += " (in words)"
    if run.get("passed"):
        said = f"passed {run['passed']} tries, first {said}"
    return f"{said}: {run['answer']}" if run["answer"] else said


class Markdown(str):
    """A line written as Markdown already (a table's row: its | are the table's, its cells escaped)."""


# What Markdown (GitHub's, in a pull request) would read as markup: HTML, emphasis, code, a link or image
# (each needs a "]"), a heading, a table's cell border, a mention of someone; each is written as a character
# reference, which shows as the character. A backslash stays: all it could escape here is a reference's "&".
MARKDOWN_MARKUP = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;",
                                 **{character: f"&#{ord(character)};" for character in "`*_]|@#~"}})


def markdown_text(text: str) -> str:
    """Text from the results (an id, an answer, a label, metadata) that reads as itself in Markdown, on
    one line (a line break in a model's name would end a table row, or start a heading)."""
    return " ".join(inert(str(text)).translate(MARKDOWN_MARKUP).splitlines())


def as_markdown(lines: List[str]) -> List[str]:
    """Lines for a Markdown document: the ones written as Markdown as they are, every other line escaped,
    and a blank line between a table and what follows it (else it would be the table's next row)."""
    done: List[str] = []
    for line in lines:
        if not isinstance(line, Markdown) and line and done and done[-1].startswith("|"):
            done.append(Markdown(""))
        done.append(line if isinstance(line, Markdown) else Markdown(markdown_text(line)))
    return done


def table_cell(cell: Any) -> str:
    """A cell shown inert and on one line: a line break in a name from a results file would start a
    row of its own (a forged one)."""
    return inert(str(cell)).replace("\n", "\\n").replace("\t", "\\t")


def table(header: List[str], body: List[List[str]], markdown: bool) -> List[str]:
    """Rows as aligned text, or as a Markdown table (each cell escaped); what came from outside shown inert,
    before the columns are measured."""
    if markdown:
        return [Markdown(f"| {' | '.join(map(markdown_text, header))} |"), Markdown(f"|{'---|' * len(header)}"),
                *(Markdown(f"| {' | '.join(map(markdown_text, row))} |") for row in body)]
    header, body = [table_cell(cell) for cell in header], [[table_cell(cell) for cell in row] for row in body]
    widths = [max(len(str(row[index])) for row in [header, *body]) for index in range(len(header))]
    return ["  ".join(str(value).ljust(width) for value, width in zip(row, widths)).rstrip()
            for row in [header, *body]]
