"""The report page: one HTML file for a batch's results or a comparison of several (report.html,
--report DIR...), for one run (--show RUN --html), or for result folders over time (--trend DIR...
--html). It opens from disk, asks no network, and shows what came from a model, a tool or a task
file as text, never as markup or code: the data rides in a JSON block escaped for HTML, the page's
own script writes it with textContent, and a content security policy lets only that script (by its
hash) run.

It imports trace_file, run_log, terminal, redaction, comparison, result_tables, metrics, scoring and trend.
"""
import base64
import hashlib
import io
import json
import os
import stat
import time
from array import array
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from agent_demo_kit import comparison, metrics, result_tables, run_log, scoring, trace_file, trend
from agent_demo_kit.private_files import write_private
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.records import number
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.seals import is_sealed
from agent_demo_kit.screen_trace import ScreenTrace
from agent_demo_kit.terminal import Screen

TRACE_SHOWN_CHARS = 40_000  # of a task's drawn trace; --show FILE shows the rest
ANSWER_SHOWN_CHARS = 2_000
TASK_SHOWN_CHARS = 2_000


def drawn(path: str) -> Tuple[str, str]:
    """A trace file's task, and the run as the live trace drew it (as --show does), plain text; ("", "")
    when it cannot be read. Not redacted here: the page redacts all it holds, once (pieces)."""
    try:
        records = trace_file.last_run_records(path)
    except (OSError, ValueError, ConfigError):  # damaged, or not a trace: the row stands without it
        return "", ""
    if not records:
        return "", ""
    shown = io.StringIO()
    screen = Screen(shown)
    run_log.replay(records, ScreenTrace(screen), errors=screen.stream)  # in the text, as the terminal had it
    text = shown.getvalue()
    return str(records[0].get("task") or ""), text if len(text) <= TRACE_SHOWN_CHARS else (
        text[:TRACE_SHOWN_CHARS] + f"\n[... cut; agent-demo --show {path} shows it whole]")


def _clip(value: Any, chars: int) -> Any:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= chars else text[:chars] + " [...]"


def run_entry(line: dict, folders: List[str]) -> Dict[str, Any]:
    """One run of a task as a row shows it, and its trace drawn, from its results line."""
    trace = next((os.path.join(folder, line["trace"]) for folder in folders if isinstance(line.get("trace"), str)
                  and inside_traces(folder, line["trace"])), None)
    tokens = line.get("tokens") if isinstance(line.get("tokens"), dict) else {}
    task, text = drawn(trace) if trace else ("", "")
    return {"status": str(line.get("status")), "in_words": line.get("answered_in_words") is True,
            "correct": line.get("correct") if isinstance(line.get("correct"), bool) else None,
            "answer": _clip(line.get("answer"), ANSWER_SHOWN_CHARS) if line.get("answer") is not None else "",
            "rounds": number(line.get("rounds")), "tokens": number(tokens.get("total")),
            "cost": number(line.get("cost")) if line.get("cost") is not None else None,
            "seconds": number(line.get("seconds")), "error": _clip(line.get("error") or "", 500),
            "trace": text, "task": task}


def inside_traces(folder: str, named: str) -> bool:
    """Is the trace a results line names a plain file right in the folder's traces/, as a batch names
    them (a line is data: "../", an absolute path or a link must not draw another folder's runs, yours,
    into the page)? traces/ and the file each looked at with lstat: neither may be a link."""
    name = named[len("traces/"):] if named.startswith("traces/") else ""
    if name in ("", ".", "..") or "/" in name or os.sep in name or "\0" in name:
        return False
    try:  # traces/ itself too: a link there would draw another folder's traces, yours, into their page
        return stat.S_ISDIR(os.lstat(os.path.join(folder, "traces")).st_mode) \
            and stat.S_ISREG(os.lstat(os.path.join(folder, "traces", name)).st_mode)
    except (OSError, ValueError):
        return False


def task_entry(key: Any, lines: List[Optional[dict]], folders: List[List[str]], differs: bool = False) -> Dict[str, Any]:
    """A row: the task (id, try, text, expected) and each configuration's run of it (None: not run)."""
    runs = [run_entry(line, where) if line is not None else None for line, where in zip(lines, folders)]
    expected = next((line.get("expected") if line.get("expected") is not None else
                     "all of: " + scoring.asserts_said(line["asserts"]) for line in lines if line is not None and (
                         line.get("expected") is not None or isinstance(line.get("asserts"), list))), None)
    task = next((run.pop("task") for run in runs if run is not None and run.get("task")), "")
    for run in runs:
        if run is not None:
            run.pop("task", None)
    return {"id": str(key[0]), "try": key[1], "task": _clip(task, TASK_SHOWN_CHARS),
            "expected": "" if expected is None else _clip(expected, ANSWER_SHOWN_CHARS), "differs": differs,
            "runs": runs}


def batch_data(names: List[str]) -> Dict[str, Any]:
    """What the page of these result folders shows (--report): each configuration's figures, and a row a
    task (a try, with --repeat) with each configuration's run of it; where they differ first."""
    columns = comparison.columns_of(names)
    keys = list(dict.fromkeys(key for column in columns for key in column.lines))
    tasks = []
    for key in keys:
        lines = [column.lines.get(key) for column in columns]
        ran = [line for line in lines if line is not None]
        differs = len(ran) > 1 and (len({comparison.success(line) for line in ran}) > 1
                                    or len({line.get("status") for line in ran}) > 1)
        tasks.append(task_entry(key, lines, [[column.where.get(key, "")] for column in columns], differs))
    tasks.sort(key=lambda task: not task["differs"])  # a comparison's differences first (a stable sort)
    left = columns.left_out[0]
    verdicts = result_tables.test_lines(comparison.compare(columns)["tests"]) if len(columns) > 1 else []
    return {"verdicts": verdicts, "title": "agent-demo report" + (f" ({len(columns)} configurations shown; {left} more left out: give fewer"
                                            " folders)" if left else ""), "made": time.strftime("%Y-%m-%d %H:%M"),
            "configurations": [{"label": column.label, "folders": column.folders, "summary": column.summary(),
                                "failures": sum(map(comparison.is_failure, column.lines.values()))}
                               for column in columns], "tasks": tasks}


def folder_pieces(folder: Path, redactor: Optional[Redactor] = None, sealed_only: bool = False) -> Iterator[bytes]:
    """A batch's own page, made a task at a time (10,000 tasks cost no more memory than 1,000): its
    results files read twice, first for which line of each task is the latest, then for the rows
    (sealed_only: the lines the batch counted, as it reads them)."""
    latest: Dict[Any, int] = {}  # task -> where its latest line is
    ended = array("d")  # when each line's run ended, by where the line is
    for path in comparison.results_files(folder):
        for line in comparison.read_lines(path):  # each line's seal looked at once, here: the rows take the latest
            key, when = comparison.result_key(line), comparison.ended_key(line)
            if (not sealed_only or is_sealed(line)) and (key not in latest or when >= ended[latest[key]]):
                latest[key] = len(ended)  # as --summary reads them: the last of a tie
            ended.append(when)
    del ended  # not needed while the rows are made
    tally, config, failed = metrics.Tally(max((key[1] for key in latest), default=1)), None, 0

    def rows() -> Iterator[Dict[str, Any]]:
        nonlocal config, failed
        position = 0
        for path in comparison.results_files(folder):
            for line in comparison.read_lines(path):
                position += 1
                if latest.get(comparison.result_key(line)) == position - 1:
                    tally.add(line)
                    failed += comparison.is_failure(line)
                    config = config or line.get("config")
                    yield task_entry(comparison.result_key(line), [line], [[str(folder)]])

    def configurations() -> List[Dict[str, Any]]:
        label = str((config or {}).get("model") or folder.name)
        return [{"label": label, "folders": [str(folder)], "summary": tally.summary(), "failures": failed}]
    return pieces("agent-demo report", rows(), configurations, redactor)


def run_data(path: str) -> Dict[str, Any]:
    """The page of one run: its trace, as a one-row report."""
    records = trace_file.last_run_records(path)
    outcome = run_log.replay(records, ScreenTrace(None), errors=None)
    usage = outcome.usage or {}
    run = {"status": outcome.status, "in_words": outcome.answered_in_words, "correct": None,
           "answer": _clip(outcome.result, ANSWER_SHOWN_CHARS)
           if outcome.result is not None else "", "rounds": outcome.rounds, "tokens": number(usage.get("total_tokens")),
           "cost": outcome.cost, "seconds": None, "error": _clip(outcome.error or "", 500),
           "trace": drawn(path)[1]}
    model = str(records[0].get("model") or "") if records else ""
    return {"kind": "run", "title": f"agent-demo run {Path(path).name}", "made": time.strftime("%Y-%m-%d %H:%M"),
            "configurations": [{"label": model, "folders": [str(path)], "summary": None}],
            "tasks": [{"id": Path(path).stem, "try": 1, "task": _clip(str(records[0].get("task") or "") if records
                                                                      else "", TASK_SHOWN_CHARS),
                       "expected": "", "differs": False, "runs": [run]}]}


def trend_data(trended: dict) -> Dict[str, Any]:
    """The page of --trend: its rows (each with its cells, as the terminal shows them), its models, and
    what is said of them, as the terminal says it."""
    return {"kind": "trend", "title": "agent-demo trend", "made": time.strftime("%Y-%m-%d %H:%M"),
            "configurations": [], "tasks": [],
            "trend": {"columns": trend.header(trended), "models": trended["models"],
                      "rows": [{**row, "cells": trend.cells(trended, row)} for row in trended["rows"]],
                      "notes": trend.notes(trended)}}


def page(data: Dict[str, Any], redactor: Optional[Redactor] = None) -> bytes:
    """The whole page of data made before (--report, --show --html, --trend --html)."""
    return b"".join(pieces(data["title"], iter(data["tasks"]), lambda: data["configurations"], redactor,
                           data.get("kind", "batch"), data.get("verdicts") or [],
                           {"trend": data["trend"]} if "trend" in data else None))


def pieces(title: str, tasks: Iterator[Dict[str, Any]], configurations: Callable[[], List[Dict[str, Any]]],
           redactor: Optional[Redactor] = None, kind: str = "batch", verdicts: List[str] = (),
           more: Optional[Dict[str, Any]] = None) -> Iterator[bytes]:
    """The page, piece by piece: the data as an inert JSON block (ASCII, so no control character of
    any terminal either; no key), the page's own style and script allowed by their hashes. The
    configurations' figures come after the rows, counted as they were written, and in the words of
    --summary (its table's rows, and the repeats in words)."""
    policy = (f"default-src 'none'; script-src '{_hash(SCRIPT)}'; style-src '{_hash(STYLE)}'; img-src 'none';"
              " base-uri 'none'; form-action 'none'")
    yield (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
           f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">\n"
           f"<meta name=\"viewport\" content=\"width=device-width\"><title>agent-demo report</title>\n"
           f"<style>{STYLE}</style></head>\n<body>\n<script id=\"data\" type=\"application/json\">").encode()
    yield _inert_json({"kind": kind, "title": title, "made": time.strftime("%Y-%m-%d %H:%M"),
                       "verdicts": list(verdicts), **(more or {})}, redactor)[:-1] \
        + b', "tasks": ['
    for number_, task in enumerate(tasks):
        yield (b", " if number_ else b"") + _inert_json(task, redactor)
    configs = configurations()
    counted = [config for config in configs if config.get("summary")]
    figures = result_tables.figure_rows(configs) if counted and len(counted) == len(configs) else []
    repeats = [f"{config['label']}: {metrics.repeats_words(config['summary']['repeats'])}" for config in counted
               if config["summary"].get("repeats")]
    yield b'], "configurations": ' + _inert_json(configs, redactor) + b', "figures": ' \
        + _inert_json(figures, redactor) + b', "repeats": ' + _inert_json(repeats, redactor) + b"}"
    yield f"</script>\n<script>{SCRIPT}</script>\n</body></html>\n".encode()


def _inert_json(value: Any, redactor: Optional[Redactor]) -> bytes:
    """value as JSON that no HTML parser takes for markup: no "</script>" nor "<!--" can end or bend the block."""
    text = redactor.ascii_dumps(value) if redactor else json.dumps(value, allow_nan=False, default=str)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e").encode()


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def write_page(path: Path, content: Iterable[bytes]) -> int:
    """The page written whole under another name, then put in place (readable by the user alone, as the
    results are); its size in bytes."""
    size = [0]

    def counted() -> Iterator[bytes]:
        for piece in content:
            size[0] += len(piece)
            yield piece
    write_private(path, counted())
    return size[0]


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse}th,td{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4;position:sticky;top:0}td.num{text-align:right}
tr.task{cursor:pointer}tr.task:hover{background:#f7f7ff}tr.differs td:first-child{border-left:3px solid #c60}
.finished{color:#060}.wrong{color:#a60}.verdict{font-weight:bold}.failed,.error,.stuck{color:#b00}.max_rounds,.budget,.interrupted{color:#a60}
pre{white-space:pre-wrap;background:#fafafa;border:1px solid #ddd;padding:8px;max-height:40em;overflow:auto;margin:0}
.controls{margin:1em 0}.controls>*{margin-right:1em}.figures td{border:none;padding:1px 8px}
.charts{display:flex;flex-wrap:wrap;gap:2em}.chart text{font-size:11px}.side{display:flex;gap:1em}.side>div{flex:1}
.legend{display:flex;flex-wrap:wrap;gap:1.5em;margin:.5em 0 1em}.key{display:inline-flex;align-items:center;gap:.4em}
"""

SCRIPT = r"""
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
const STATUSES = ["finished","failed","max_rounds","budget","stuck","interrupted","error"];
const COLOURS = {finished:"#3a3",failed:"#c33",max_rounds:"#d90",budget:"#d90",stuck:"#933",interrupted:"#999",error:"#600"};
const SVG = "http://www.w3.org/2000/svg";
// What tells the configurations (or a trend's models) apart, the same in every chart and the legend: a
// colour of Okabe and Ito's palette (told apart with the common kinds of colour blindness), a shape,
// and the label written beside it, so no chart asks for colour alone. 8 colours and 6 shapes: the first
// 8 differ in colour, and no two of 24 look alike.
const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442"];
const SHAPES = ["circle", "square", "triangle", "diamond", "down", "hexagon"];
const POINTS = {triangle: [[0, -1], [1, 0.8], [-1, 0.8]], diamond: [[0, -1], [1, 0], [0, 1], [-1, 0]],
                down: [[-1, -0.8], [1, -0.8], [0, 1]], hexagon: [[-0.5, -0.9], [0.5, -0.9], [1, 0], [0.5, 0.9], [-0.5, 0.9], [-1, 0]]};
function look(n) { return {colour: PALETTE[n % PALETTE.length], shape: SHAPES[n % SHAPES.length]}; }
function el(tag, text, attributes) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  return node;
}
function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}
function figure(value, digits) { return value === null || value === undefined ? "-" : Number(value).toFixed(digits); }
function mark(n, x, y, size) {  // configuration n's shape in its colour, centred on x, y
  const {colour, shape} = look(n), r = size / 2;
  const attributes = {fill: colour, stroke: "#222", "stroke-width": 1, "data-config": n, class: "mark"};
  if (shape === "circle") return svg("circle", Object.assign({cx: x, cy: y, r: r}, attributes));
  if (shape === "square") return svg("rect", Object.assign({x: x - r, y: y - r, width: size, height: size}, attributes));
  return svg("polygon", Object.assign({points: POINTS[shape].map(([px, py]) => (x + px * r) + "," + (y + py * r)).join(" ")}, attributes));
}
function legend(labels, id) {  // each label with its shape in its colour
  const box = el("div", null, {class: "legend", id: id});
  labels.forEach((label, n) => {
    const key = el("span", null, {class: "key"}), swatch = svg("svg", {width: 14, height: 14});
    swatch.append(mark(n, 7, 7, 11));
    key.append(swatch, el("span", label));
    box.append(key);
  });
  return box;
}
const body = document.body;
if (data.kind === "run") {  // one run: what it did, and its trace in full view
  const task = data.tasks[0], run = task.runs[0];
  body.append(el("h1", data.title), el("p", "made " + data.made));
  const facts = el("table", null, {class: "figures", id: "run-figures"});
  for (const [name, value] of [["model", data.configurations[0].label], ["status", run.status + (run.in_words ?
      " (answered in words, no finish call)" : "")], ["rounds", run.rounds],
      ["tokens", run.tokens], ["cost", run.cost === null || run.cost === undefined ? "-" : "$" + figure(run.cost, 4)]]) {
    const row = el("tr"); row.append(el("td", name), el("td", value)); facts.append(row);
  }
  body.append(facts, el("h2", "Task"), el("pre", task.task, {id: "task"}), el("h2", run.error ? "Error" : "Answer"),
    el("pre", run.error || run.answer, {id: "answer"}), el("h2", "Trace"), el("pre", run.trace || "(no trace)", {id: "trace"}));
} else if (data.kind === "trend") {  // result folders over time: a row a batch, a line a model
  const trend = data.trend, rows = trend.rows, times = rows.map(r => Date.parse(r.first_ended_at));
  let first = Infinity, last = -Infinity; for (const t of times) { if (t < first) first = t; if (t > last) last = t; }
  function timeChart(id, title, value, interval, column, tick) {  // value(row) over time, a line a model
    const width = 460, height = 170, left = 62, top = 24, chart = svg("svg", {width: left + width + 150, height: top + height + 36, class: "chart", id: id});
    let most = 0; for (const r of rows) if (value(r) !== null && value(r) > most) most = value(r);
    if (tick === null || !most) most = 1;  // a share goes to 100%
    const x = t => left + (last > first ? width * (t - first) / (last - first) : width / 2), y = v => top + height - height * v / most;
    chart.append(svg("text", {x: 0, y: 12}, title), svg("line", {x1: left, x2: left, y1: top, y2: top + height, stroke: "#999"}),
                 svg("line", {x1: left, x2: left + width, y1: top + height, y2: top + height, stroke: "#999"}),
                 svg("text", {x: left, y: top + height + 16}, rows[0].cells[0]));
    if (last > first) chart.append(svg("text", {x: left + width, y: top + height + 16, "text-anchor": "end"}, rows[rows.length - 1].cells[0]));
    for (const v of [0, most / 2, most]) chart.append(svg("text", {x: left - 6, y: y(v) + 4, "text-anchor": "end"}, tick === null ? Math.round(100 * v) + "%" : tick(v)));
    const ends = [];
    trend.models.forEach((model, n) => {
      const own = [];
      rows.forEach((r, i) => { if (r.model === model && value(r) !== null) own.push([r, times[i]]); });
      const lines = [];  // a line through a model's batches of one task set in a row (other tasks are no trend), named at its end
      own.forEach(([r, t], k) => { if (!k || r.task_set !== own[k - 1][0].task_set) lines.push([]); lines[lines.length - 1].push([x(t), y(value(r))]); });
      for (const points of lines) {
        if (points.length > 1) chart.append(svg("polyline", {points: points.map(point => point.join(",")).join(" "), fill: "none", stroke: look(n).colour, "stroke-width": 2, "data-config": n}));
        const [endX, endY] = points[points.length - 1];
        let at = endY + 4;
        while (ends.some(([takenX, takenY]) => Math.abs(takenX - endX) < 30 && Math.abs(takenY - at) < 12)) at += 12;  // lines that end together: each named
        ends.push([endX, at]);
        chart.append(svg("text", {x: endX + 9, y: at, class: "end"}, model.slice(0, 24)));
      }
      for (const [r, t] of own) {
        const range = interval ? interval(r) : null;
        if (range) chart.append(svg("line", {x1: x(t), x2: x(t), y1: y(range[0]), y2: y(range[1]), stroke: look(n).colour, "stroke-width": 1.5, "stroke-opacity": 0.6}));
        const point = mark(n, x(t), y(value(r)), 9);
        point.append(svg("title", {}, model + ", " + r.cells[0] + ": " + r.cells[column] + (range ? " (" + r.cells[column + 1] + ")" : "") + ", " + r.cells[r.cells.length - 1]));
        chart.append(point);
      }
    });
    return chart;
  }
  body.append(el("h1", data.title), el("p", "made " + data.made + "; " + rows.length + " batches of " + trend.models.length + " model(s), in the order they ran"));
  for (const note of trend.notes) body.append(el("p", note, {class: "verdict note"}));
  const charts = el("div", null, {class: "charts"});
  charts.append(timeChart("accuracy-trend", "accuracy, and its 95% interval", r => r.scored ? r.accuracy : null, r => r.scored ? r.accuracy_interval : null, 3, null),
                timeChart("tokens-trend", "tokens", r => r.tokens, null, 5, v => Math.round(v).toLocaleString("en-US")));
  if (rows.some(r => r.cost !== null)) charts.append(timeChart("cost-trend", "cost", r => r.cost, null, 6, v => "$" + Number(v.toPrecision(2))));
  body.append(el("h2", "Over time"), legend(trend.models, "legend"), charts, el("h2", "Batches"));
  const table = el("table", null, {id: "trend-table"}), head = el("tr");
  for (const name of trend.columns) head.append(el("th", name));
  table.append(head);
  for (const r of rows) { const row = el("tr"); r.cells.forEach((text, n) => row.append(el("td", text, n > 1 && n < 7 ? {class: "num"} : {}))); table.append(row); }
  body.append(table);
} else {
body.append(el("h1", data.title), el("p", "made " + data.made + "; " + data.tasks.length + " rows"));
const configs = data.configurations;
if (data.figures && data.figures.length) {  // --summary's table, in its words and figures (made by it)
  body.append(el("h2", "Figures"));
  const table = el("table", null, {class: "figures", id: "figures"});
  const head = el("tr"); head.append(el("th", ""));
  for (const c of configs) head.append(el("th", c.label));
  table.append(head);
  for (const [name, ...cells] of data.figures) {
    const row = el("tr"); row.append(el("td", name));
    for (const text of cells) row.append(el("td", text, {class: "num"}));
    table.append(row);
  }
  body.append(table);
  for (const line of data.repeats || []) body.append(el("p", line, {class: "repeats"}));
}
if (data.verdicts && data.verdicts.length) {  // the paired tests, in the words --summary uses
  body.append(el("h2", "Is the difference more than noise?"));
  for (const line of data.verdicts) body.append(el("p", line, {class: "verdict"}));
}
function figureOf(name, n) {  // configuration n's cell of --summary's row `name`
  const row = (data.figures || []).find(r => r[0] === name);
  return row ? row[n + 1] : "n/a";
}
function shareChart(id, title, bars) {  // bars: [configuration, share, words, interval or null, lighter]
  const width = 300, bar = 18, left = 170, chart = svg("svg", {width: left + width + 190, height: bars.length * (bar + 6) + 40, class: "chart", id: id});
  chart.append(svg("text", {x: 0, y: 12}, title));
  bars.forEach(([n, share, words, interval, lighter], row) => {
    const y = 20 + row * (bar + 6), middle = y + bar / 2;
    if (!row || bars[row - 1][0] !== n) chart.append(mark(n, 8, middle, 10), svg("text", {x: 18, y: middle + 4}, configs[n].label.slice(0, 24)));
    const rect = svg("rect", {x: left, y: y, width: Math.max(1, width * share), height: bar, fill: look(n).colour, "data-config": n,
                              "fill-opacity": lighter ? 0.4 : 1, stroke: look(n).colour});
    rect.append(svg("title", {}, configs[n].label + ": " + words));
    chart.append(rect, svg("text", {x: left + width + 8, y: middle + 4}, words));
    if (interval) for (const [x1, x2, y1, y2] of [[interval[0], interval[1], middle, middle], [interval[0], interval[0], y + 3, y + bar - 3], [interval[1], interval[1], y + 3, y + bar - 3]])
      chart.append(svg("line", {x1: left + width * x1, x2: left + width * x2, y1: y1, y2: y2, stroke: "#222", "stroke-width": 1.5}));
  });
  const bottom = 20 + bars.length * (bar + 6) + 12;
  chart.append(svg("line", {x1: left, x2: left, y1: 16, y2: bottom - 10, stroke: "#999"}),
               svg("text", {x: left - 4, y: bottom}, "0%"), svg("text", {x: left + width - 14, y: bottom}, "100%"));
  return chart;
}
function accuracyChart() {
  const bars = [];
  configs.forEach((c, n) => { const s = c.summary; if (s && s.scored && s.accuracy !== null) bars.push([n, s.accuracy, figureOf("accuracy", n), s.accuracy_interval, false]); });
  return bars.length ? shareChart("accuracy-chart", "accuracy, and its 95% interval", bars) : null;
}
function repeatsChart() {  // pass@1 (every try) and pass^k (all k tries of a task), as --summary words them
  const bars = [];
  configs.forEach((c, n) => {
    const repeated = c.summary && c.summary.repeats;
    if (!repeated || repeated.pass_at_1 === null) return;
    const [first, all] = figureOf("pass@1 / pass^k", n).split(" / ");
    bars.push([n, repeated.pass_at_1, "pass@1 " + first, null, false], [n, repeated.pass_all, "pass^" + repeated.tries + " " + all, null, true]);
  });
  return bars.length ? shareChart("repeats-chart", "pass@1 (of the runs) and pass^k (of the tasks)", bars) : null;
}
function statusChart() {
  const width = 420, bar = 22, left = 160, chart = svg("svg", {width: width + left, height: configs.length * (bar + 8) + 30, class: "chart", id: "status-chart"});
  configs.forEach((c, row) => {
    const counts = Object.create(null); let total = 0;  // a status named "constructor" is a status
    for (const task of data.tasks) { const run = task.runs[row]; if (run) { counts[run.status] = (counts[run.status] || 0) + 1; total++; } }
    chart.append(mark(row, 6, row * (bar + 8) + 11, 10), svg("text", {x: 16, y: row * (bar + 8) + 15}, c.label.slice(0, 22)));
    let x = left;
    for (const status of STATUSES.concat(Object.keys(counts).filter(s => !STATUSES.includes(s)))) {
      if (!counts[status]) continue;
      const w = Math.max(1, width * counts[status] / total);
      const rect = svg("rect", {x: x, y: row * (bar + 8), width: w, height: bar, fill: Object.prototype.hasOwnProperty.call(COLOURS, status) ? COLOURS[status] : "#666"});
      rect.append(svg("title", {}, c.label + ": " + status + ": " + counts[status]));
      chart.append(rect);
      if (w > 7 * (status.length + String(counts[status]).length + 1)) chart.append(svg("text", {x: x + 4, y: row * (bar + 8) + 15, fill: "#fff", class: "inside"}, status + " " + counts[status]));
      x += w;
    }
  });
  let x = 0; const y = configs.length * (bar + 8) + 18;
  for (const status of STATUSES) { chart.append(svg("rect", {x: x, y: y - 9, width: 9, height: 9, fill: COLOURS[status]}), svg("text", {x: x + 12, y: y}, status)); x += 12 + status.length * 6.5 + 8; }
  chart.setAttribute("width", Math.max(width + left, x));
  return chart;
}
function histogram(title, value, id) {  // a bar a configuration in each bin, in the legend's order
  let most = 1e-9;  // no spread: 100,000 values overflow the stack
  for (const task of data.tasks) for (const run of task.runs) if (run && value(run) !== null && value(run) > most) most = value(run);
  const bins = 20, width = 400, height = 120, counts = configs.map(() => new Array(bins).fill(0));
  for (const task of data.tasks) task.runs.forEach((run, n) => { if (run && value(run) !== null) counts[n][Math.min(bins - 1, Math.floor(bins * value(run) / most))]++; });
  let top = 1; for (const each of counts) for (const count of each) if (count > top) top = count;
  const chart = svg("svg", {width: width + 40, height: height + 30, class: "chart", id: id}), step = width / bins, thick = (step - 2) / configs.length;
  chart.append(svg("text", {x: 0, y: 12}, title));
  counts.forEach((each, c) => each.forEach((count, n) => {
    const h = height * count / top, rect = svg("rect", {x: 30 + n * step + c * thick, y: height + 15 - h, width: thick, height: h, fill: look(c).colour, "data-config": c});
    rect.append(svg("title", {}, configs[c].label + ": " + figure(n * most / bins, 2) + " to " + figure((n + 1) * most / bins, 2) + ": " + count));
    chart.append(rect);
  }));
  chart.append(svg("text", {x: 30, y: height + 28}, "0"), svg("text", {x: width, y: height + 28}, figure(most, most < 10 ? 2 : 0)));
  return chart;
}
const charts = el("div", null, {class: "charts"});
for (const chart of [accuracyChart(), repeatsChart(), statusChart(), histogram("rounds per task", r => r.rounds, "rounds-chart"),
                     histogram("seconds per task", r => r.seconds, "seconds-chart")]) if (chart) charts.append(chart);
body.append(el("h2", "Charts"), legend(configs.map(c => c.label), "legend"), charts);
body.append(el("h2", "Tasks"));
const controls = el("div", null, {class: "controls"});
const statusFilter = el("select", null, {id: "status-filter"}); statusFilter.append(el("option", "any status", {value: ""}));
for (const status of STATUSES) statusFilter.append(el("option", status, {value: status}));
const correctFilter = el("select", null, {id: "correct-filter"});
for (const [value, text] of [["", "right or wrong"], ["true", "right"], ["false", "wrong"], ["none", "not scored"]]) correctFilter.append(el("option", text, {value: value}));
const search = el("input", null, {id: "search", type: "search", placeholder: "search ids, tasks, answers"});
const count = el("span", "", {id: "count"});
controls.append(statusFilter, correctFilter, search, count);
body.append(controls);
const table = el("table", null, {id: "tasks"});
const header = el("tr"); header.append(el("th", "id"), el("th", "task"), el("th", "expected"));
for (const c of configs) for (const name of ["status", "correct", "answer", "rounds", "tokens", "cost", "s"]) header.append(el("th", configs.length > 1 ? c.label + " " + name : name));
table.append(el("thead")); table.tHead.append(header);
const rows = el("tbody"); table.append(rows); body.append(table);
const more = el("button", "show more", {id: "more"}); body.append(more);
const PAGE = 200; let shown = PAGE;
function matches(task) {
  const status = statusFilter.value, correct = correctFilter.value, words = search.value.toLowerCase();
  const runs = task.runs.filter(run => run);
  if (status && !runs.some(run => run.status === status)) return false;
  if (correct && !runs.some(run => String(run.correct === null ? "none" : run.correct) === correct)) return false;
  if (words && ![task.id, task.task, task.expected].concat(runs.map(run => run.answer)).some(text => String(text).toLowerCase().includes(words))) return false;
  return true;
}
function detail(task) {
  const row = el("tr", null, {class: "detail"}), cell = el("td", null, {colspan: 3 + 7 * configs.length}), side = el("div", null, {class: "side"});
  task.runs.forEach((run, n) => {
    const part = el("div"); part.append(el("strong", configs.length > 1 ? configs[n].label : "trace"));
    part.append(el("pre", run ? (run.error ? run.error + "\n\n" : "") + (run.trace || "(no trace)") : "(not run)"));
    side.append(part);
  });
  cell.append(el("p", task.task), side); row.append(cell); return row;
}
function draw() {
  rows.replaceChildren();
  const found = data.tasks.filter(matches);
  count.textContent = found.length + " of " + data.tasks.length + " rows";
  for (const task of found.slice(0, shown)) {
    const row = el("tr", null, {class: "task" + (task.differs ? " differs" : "")});
    row.append(el("td", task.try > 1 ? task.id + " #" + task.try : task.id), el("td", task.task.slice(0, 80)), el("td", task.expected));
    for (const run of task.runs) {
      if (!run) { for (let i = 0; i < 7; i++) row.append(el("td", "")); continue; }
      const wrong = run.status === "finished" && run.correct === false;  // finished, but not right: not green
      row.append(el("td", run.status + (wrong ? " (wrong)" : "") + (run.in_words ? " (in words)" : ""), {class: wrong ? "wrong" : run.status}), el("td", run.correct === null ? "" : run.correct ? "right" : "wrong"),
        el("td", String(run.answer).slice(0, 120)), el("td", run.rounds, {class: "num"}), el("td", run.tokens, {class: "num"}),
        el("td", run.cost === null ? "" : figure(run.cost, 4), {class: "num"}), el("td", run.seconds === null ? "" : figure(run.seconds, 2), {class: "num"}));
    }
    let open = null;
    row.addEventListener("click", () => { if (open) { open.remove(); open = null; } else { open = detail(task); row.after(open); } });
    rows.append(row);
  }
  more.hidden = found.length <= shown;
}
for (const control of [statusFilter, correctFilter]) control.addEventListener("change", () => { shown = PAGE; draw(); });
search.addEventListener("input", () => { shown = PAGE; draw(); });
more.addEventListener("click", () => { shown += PAGE; draw(); });
draw();
}
"""
