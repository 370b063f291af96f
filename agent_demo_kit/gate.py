"""--summary NEW --baseline OLD: a gate for CI. The two result folders side by side and the verdict of
the paired test on the tasks both ran: worse, better, or within noise; the tasks that turned. New
results that lack a baseline task, or hold another task under its id, are refused: a pass would say
nothing.

It imports comparison and result_tables.
"""
from typing import List

from agent_demo_kit.comparison import (DIFFERENCES_SHOWN, SIGNIFICANCE, Column, columns_of, compare, pass_rates,
                                       rate)
from agent_demo_kit.result_tables import as_markdown, render_comparison, table_cell
from agent_demo_kit.endings import ConfigError


def gate(new: List[str], baseline: List[str], level: float = SIGNIFICANCE) -> dict:
    """--summary NEW --baseline OLD: the two side by side, and the verdict: "worse" when NEW passed
    fewer of the tasks both ran than OLD and the paired test says that is more than noise at `level`,
    "better" the other way, else "within noise"; with the tasks that turned each way."""
    columns = [one_column(baseline, "--baseline"), one_column(new, "--summary")]
    columns[0].label, columns[1].label = "baseline", "new"
    first = [{key[0]: line for key, line in column.lines.items()} for column in columns]
    missing = [ident for ident in first[0] if ident not in first[1]]
    if missing or not first[0]:  # a batch stopped partway, or of other tasks: a pass would say nothing
        raise ConfigError(f"--baseline: the new results lack {len(missing)} of the baseline's {len(first[0])} tasks"
                          f" ({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): run them (the same"
                          " --batch command goes on), or compare with a baseline of the same tasks")
    changed = [ident for ident, line in first[0].items() if line.get("task_hash") and first[1][ident].get("task_hash")
               and line["task_hash"] != first[1][ident]["task_hash"]]
    if changed:
        raise ConfigError(f"--baseline: {len(changed)} task(s) have another text under the same id"
                          f" ({', '.join(changed[:5])}): the two results are not of the same tasks")
    compared = compare(columns, level)
    test = compared["tests"][0]
    rates = [pass_rates(column) for column in columns]
    both = [ident for ident in rates[0] if ident in rates[1]]
    turned_wrong = [ident for ident in both if rate(rates[1][ident]) < rate(rates[0][ident])]
    turned_right = [ident for ident in both if rate(rates[1][ident]) > rate(rates[0][ident])]
    beyond = test["p_value"] < level
    verdict = "worse" if beyond and test["only_first"] > test["only_second"] else \
        "better" if beyond and test["only_second"] > test["only_first"] else "within noise"
    return {**compared, "gate": {"verdict": verdict, "level": level, "p_value": test["p_value"], "test": test["test"],
                                 "both_ran": test["both_ran"], "turned_wrong": turned_wrong,
                                 "turned_right": turned_right, "baseline": columns[0].folders,
                                 "new": columns[1].folders}}


def one_column(names: List[str], flag: str) -> Column:
    """The one configuration these folders hold (shards merged); ConfigError when they hold several."""
    columns = columns_of(names)
    if len(columns) != 1 or columns.left_out[0]:
        raise ConfigError(f"{flag}: {' '.join(names)} holds the results of {len(columns) + columns.left_out[0]}"
                          " configurations; a gate compares one with one: name the folder of one")
    return columns[0]


def render_gate(data: dict, markdown: bool = False) -> List[str]:
    """The comparison, then the verdict in the words --summary uses, and the tasks that turned."""
    gated = data["gate"]
    lines = [f"baseline: {', '.join(map(table_cell, gated['baseline']))}",
             f"new: {', '.join(map(table_cell, gated['new']))}", "",
             *render_comparison(data, markdown), ""]
    worded = {"worse": "worse than the baseline, more than noise",
              "better": "better than the baseline, more than noise",
              "within noise": "no difference from the baseline beyond noise"}[gated["verdict"]]
    lines.append(f"verdict: {worded} ({gated['test']} p = {gated['p_value']:.3g}, level {gated['level']:g}; on"
                 f" {gated['both_ran']} task(s) both ran, {len(gated['turned_wrong'])} turned wrong,"
                 f" {len(gated['turned_right'])} turned right)")
    for name in ("turned_wrong", "turned_right"):
        if gated[name]:
            shown = gated[name][:DIFFERENCES_SHOWN]
            more = f" ... and {len(gated[name]) - len(shown)} more (--json lists them all)" if len(gated[name]) > \
                len(shown) else ""
            lines.append(f"{name.replace('_', ' ')}: {', '.join(map(table_cell, shown))}{more}")
    return as_markdown(lines) if markdown else lines
