"""--trend DIR...: result folders over time, a row a batch in the order they ran (when its first task
ended), its model, tasks, accuracy and interval, tokens and cost; as JSON; as a page, a line a model.
The folders are made by real batches against the scripted server, two models on two days."""
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from agent_demo_kit.cli import main
from conftest import KEY
from scripted_server import ScriptedServer, action

RIGHT = {("a", 1): 3, ("b", 1): 4, ("a", 2): 5, ("b", 2): 4, ("a", 3): 2}  # of each day's tasks, the first N right


def answers(body, day):
    task = body["messages"][1]["content"].split("Task: ", 1)[-1]
    right = int(task.split()[-1]) < RIGHT[body["model"], day[0]]
    return {"content": action("finish", result="5" if right else "4")}


def write_tasks(path, count, words="task"):
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"{words} {n}", "expected": "5"}) + "\n"
                            for n in range(count)))
    return path


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """The state folder (its seal key) of this file's batches and of each of its tests: their lines are yours."""
    return tmp_path_factory.mktemp("state")


@pytest.fixture(autouse=True)
def sealed_by_you(state, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(state))


def batches(state):
    """A monkeypatch for a module's batches: their own state folder, no developer's settings file."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(state / "config"))
    return monkeypatch


@pytest.fixture(scope="module")
def days(tmp_path_factory, state):
    """runs/1/{a,b} and runs/2/{a,b} of six tasks (day 2's b tried 3 times), priced; other/a, a day
    later, of four other tasks."""
    root, monkeypatch, day = tmp_path_factory.mktemp("days"), batches(state), [1]
    tasks, other = write_tasks(root / "tasks.jsonl", 6), write_tasks(root / "other.jsonl", 4, "another task")
    try:
        with ScriptedServer([], screen=lambda body: answers(body, day)) as server:
            monkeypatch.setenv("LLM_API_URL", server.url)
            monkeypatch.setenv("LLM_API_KEY", KEY)
            for day[0], model, repeat in ((1, "a", 1), (1, "b", 1), (2, "a", 1), (2, "b", 3)):
                main(["--batch", str(tasks), "-m", model, "--out", str(root / "runs" / str(day[0]) / model), "-q",
                      "--price", "1,2", "--repeat", str(repeat), "--parallel", "1"])
            day[0] = 3
            main(["--batch", str(other), "-m", "a", "--out", str(root / "other" / "a"), "-q", "--parallel", "1"])
    finally:
        monkeypatch.undo()
    return root


def folders(root):
    return [root / "runs" / "2" / "b", root / "runs" / "1" / "a", root / "runs" / "2" / "a", root / "runs" / "1" / "b"]


def test_a_row_a_batch_in_the_order_they_ran_with_the_figures_summary_gives_each(days, cli):
    code, out, err = cli("--trend", *folders(days), "--json")
    assert code == 0, err
    trend = json.loads(out)
    assert [(row["folder"], row["model"]) for row in trend["rows"]] == [
        (str(days / "runs" / day / model), model) for day, model in (("1", "a"), ("1", "b"), ("2", "a"), ("2", "b"))]
    assert trend["models"] == ["a", "b"] and trend["same_tasks"] and trend["task_sets"] == 1
    for row in trend["rows"]:
        _, alone, _ = cli("--summary", row["folder"], "--json")
        summary = json.loads(alone)
        assert (row["tasks"], row["runs"], row["scored"], row["correct"], row["accuracy"], row["accuracy_interval"],
                row["tokens"], row["cost"], row.get("repeats")) == (
            summary["tasks"], summary["runs"], summary["scored"], summary["correct"], summary["accuracy"],
            summary["accuracy_interval"], summary["tokens"]["total"], summary["cost"], summary.get("repeats"))
        ended = [json.loads(line)["ended_at"] for line in Path(row["folder"], "results.jsonl").read_text().splitlines()]
        assert (row["first_ended_at"], row["last_ended_at"]) == (min(ended), max(ended)), "when its tasks ended"
    assert [row["accuracy"] for row in trend["rows"]] == [0.5, round(4 / 6, 4), round(5 / 6, 4), round(4 / 6, 4)]
    assert trend["rows"][3]["repeats"]["tries"] == 3 and trend["rows"][3]["runs"] == 18
    assert all(row["cost"] for row in trend["rows"])


def test_the_terminal_gets_a_plain_table_ordered_by_time(days, cli):
    from agent_demo_kit.metrics import dollars
    code, out, err = cli("--trend", *folders(days))
    trend = json.loads(cli("--trend", *folders(days), "--json")[1])
    lines = out.splitlines()
    assert code == 0 and re.split(r"\s{2,}", lines[0]) == ["when", "model", "tasks", "accuracy", "95% interval",
                                                           "tokens", "cost", "folder"]
    assert len(lines) == 5, "a row a batch, and nothing else when the tasks are the same and sealed by you"
    for line, row in zip(lines[1:], trend["rows"]):
        low, high = row["accuracy_interval"]
        assert re.split(r"\s{2,}", line) == [
            datetime.fromisoformat(row["first_ended_at"]).astimezone().strftime("%Y-%m-%d %H:%M"), row["model"],
            f"{row['tasks']}" + (f" ({row['runs']} runs)" if row["runs"] != row["tasks"] else ""),
            f"{row['accuracy']:.1%}", f"{low:.1%}-{high:.1%}", f"{row['tokens']:,}", dollars(row["cost"]), row["folder"]]
    assert re.split(r"\s{2,}", lines[4])[2:4] == ["6 (18 runs)", "66.7%"]


def test_a_folder_of_model_folders_is_each_of_them(days, cli):
    code, out, _ = cli("--trend", days / "runs" / "2", days / "runs" / "1", "--json")
    assert code == 0 and [row["folder"] for row in json.loads(out)["rows"]] == [
        str(days / "runs" / day / model) for day, model in (("1", "a"), ("1", "b"), ("2", "a"), ("2", "b"))]


def test_folders_of_other_tasks_are_shown_and_said_to_be_no_trend(days, cli):
    code, out, _ = cli("--trend", *folders(days), days / "other" / "a", "--json")
    trend = json.loads(out)
    assert code == 0 and not trend["same_tasks"] and trend["task_sets"] == 2
    assert [row["task_set"] for row in trend["rows"]] == [1, 1, 1, 1, 2]
    code, out, _ = cli("--trend", *folders(days), days / "other" / "a")
    lines = out.splitlines()
    assert "task set" in lines[0] and len(lines) == 8
    assert lines[5].split()[-2:] == ["2", str(days / "other" / "a")]
    assert lines[7] == ("not all of the same tasks: 2 task sets (the column \"task set\"); accuracy over"
                        " different tasks is not a trend: compare the rows of one task set")


def test_a_folder_that_does_not_say_when_it_ran_is_refused_by_name(days, tmp_path, cli):
    undated = tmp_path / "undated"
    undated.mkdir()
    lines = [json.loads(line) for line in (days / "runs" / "1" / "a" / "results.jsonl").read_text().splitlines()]
    (undated / "results.jsonl").write_text("".join(json.dumps({**line, "ended_at": None}) + "\n" for line in lines))
    code, out, err = cli("--trend", days / "runs" / "1" / "b", undated)
    assert (code, out) == (2, "")
    assert err.strip() == (f"agent-demo: error: --trend: {undated} does not say when it ran (no results line has an"
                           " ended_at): leave it out, or see it with --summary")


@pytest.mark.parametrize("ended_at, shown", [
    ("2026-12-04T07:10:31.927+00:00", "2026-12-04T07:10:31.927+00:00"), (1.7e9, "2023-11-14T22:13:20.000+00:00"),
    ("9999-12-31T23:59:59+00:00", None), (1e300, None), (-5, None), (True, None), ("yesterday", None),
    ([2026], None), (float("nan"), None)])
def test_only_a_time_a_batch_could_have_run_at_dates_a_folder(days, tmp_path, cli, ended_at, shown):
    folder = tmp_path / "odd"
    folder.mkdir()
    line = json.loads((days / "runs" / "1" / "a" / "results.jsonl").read_text().splitlines()[0])
    (folder / "results.jsonl").write_text(json.dumps({**line, "ended_at": ended_at}) + "\n")
    code, out, err = cli("--trend", folder, "--json")
    assert (code, json.loads(out)["rows"][0]["first_ended_at"] if code == 0 else None) == (0 if shown else 2, shown)
    assert "Traceback" not in err and (shown or "does not say when it ran" in err)


@pytest.mark.parametrize("args, said", [
    (("--trend", "nowhere"), "/nowhere is not a folder of batch results"),
    (("--trend", ".", "-o", "page.html"), "-o goes with --report, --show --html or --trend --html"),
    (("--html",), "--html goes with --show or --trend"),
    (("--batch", "tasks.jsonl", "--trend", "."), "--trend does not go with it"),
    (("--summary", ".", "--trend", "."), "--trend shows result folders over time; --summary does not go with it"),
    (("--trend", ".", "--report", "."), "--trend shows result folders over time; --report does not go with it"),
    (("--trend", ".", "--runs"), "--trend shows result folders over time; --runs does not go with it"),
])
def test_trend_flags_are_checked(cli, args, said):
    code, out, err = cli(*args)
    assert code == 2 and said in err


def test_a_model_name_from_a_results_file_reaches_the_terminal_escaped(days, tmp_path, cli):
    forged = tmp_path / "forged"
    forged.mkdir()
    lines = [json.loads(line) for line in (days / "runs" / "1" / "a" / "results.jsonl").read_text().splitlines()]
    (forged / "results.jsonl").write_text("".join(json.dumps({**line, "config": {
        **line["config"], "model": "\x1b]0;owned\x07\x1b[2J\u202eevil"}}) + "\n" for line in lines))
    code, out, _ = cli("--trend", forged)
    assert code == 0 and "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b]0;owned\\x07\\x1b[2J\\u202eevil" in out
    assert out.splitlines()[-1] == ("forged: 6 line(s) not sealed by you (written by another user, or changed"
                                    " since): their figures are that folder's word, not your results")
    assert json.loads(cli("--trend", forged, "--json")[1])["rows"][0]["not_sealed_by_you"] == 6


# --- the page ----------------------------------------------------------------------------------------

HOSTILE_ID, HOSTILE_MODEL = "</script><script>window.pwned = 1</script>", '<img src=x onerror="window.pwned = 1">'


def page_data(html):
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)[1])


def test_html_puts_the_rows_on_a_page_on_stdout_or_into_a_file(days, cli, tmp_path):
    trend = json.loads(cli("--trend", *folders(days), days / "other" / "a", "--json")[1])
    _, table, _ = cli("--trend", *folders(days), days / "other" / "a")
    code, out, err = cli("--trend", *folders(days), days / "other" / "a", "--html")
    assert code == 0 and out.startswith("<!DOCTYPE html>")
    data = page_data(out)
    assert data["kind"] == "trend" and data["trend"]["models"] == ["a", "b"]
    assert [{key: value for key, value in row.items() if key != "cells"} for row in data["trend"]["rows"]] == trend["rows"]
    shown = table.splitlines()
    assert data["trend"]["columns"] == re.split(r"\s{2,}", shown[0])
    assert [row["cells"] for row in data["trend"]["rows"]] == [re.split(r"\s{2,}", line) for line in shown[1:6]]
    assert data["trend"]["notes"] == [shown[-1]]
    code, out, err = cli("--trend", *folders(days), "--html", "-o", tmp_path / "trend.html")
    assert (code, out) == (0, "") and f"report page: {tmp_path / 'trend.html'}" in err
    assert page_data((tmp_path / "trend.html").read_text())["trend"]["notes"] == []


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, state):
    """A folder whose task id and model name are markup."""
    root, monkeypatch = tmp_path_factory.mktemp("hostile"), batches(state)
    tasks = root / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": HOSTILE_ID, "task": "task 0", "expected": "5"}) + "\n")
    try:
        with ScriptedServer([], screen=lambda body: {"content": action("finish", result="5")}) as server:
            monkeypatch.setenv("LLM_API_URL", server.url)
            monkeypatch.setenv("LLM_API_KEY", KEY)
            main(["--batch", str(tasks), "-m", HOSTILE_MODEL, "--out", str(root / "out"), "-q"])
    finally:
        monkeypatch.undo()
    return root / "out"


def test_markup_in_an_id_or_a_model_name_is_data_on_the_page(hostile, cli):
    code, html, _ = cli("--trend", hostile, "--html")
    assert code == 0 and html.count("<script") == 2 and html.count("</script>") == 2
    assert "<img" not in html and "onerror=\"" not in html
    data = page_data(html)
    assert data["trend"]["models"] == [HOSTILE_MODEL] and data["trend"]["rows"][0]["cells"][1] == HOSTILE_MODEL


# --- in a real browser ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    import shutil
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no Chromium here (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=found, args=["--no-sandbox"])
        yield launched
        launched.close()


def opened(browser, path):
    page, problems = browser.new_page(), []
    page.on("console", lambda message: problems.append(message.text) if message.type in ("error", "warning") else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(Path(path).as_uri())
    page.wait_for_selector("#trend-table")
    return page, problems


def attributes(locator, name):
    return [element.get_attribute(name) for element in locator.all()]


@pytest.mark.processes
def test_in_a_browser_a_line_a_model_in_its_colour_named_at_its_end(browser, days, tmp_path):
    assert main(["--trend", *map(str, folders(days)), str(days / "other" / "a"), "--html", "-o",
                 str(tmp_path / "trend.html")]) == 0
    data = page_data((tmp_path / "trend.html").read_text())
    page, problems = opened(browser, tmp_path / "trend.html")
    assert page.locator("#legend .key").all_inner_texts() == ["a", "b"]
    colours = [attributes(page.locator(f'#legend [data-config="{n}"]'), "fill") for n in range(2)]
    assert colours[0] != colours[1] and all(len(colour) == 1 for colour in colours)
    for chart, key in (("accuracy-trend", "accuracy"), ("tokens-trend", "tokens"), ("cost-trend", "cost")):
        for n, model in enumerate(["a", "b"]):
            marks = page.locator(f'#{chart} .mark[data-config="{n}"]')
            assert marks.count() == sum(row["model"] == model and row[key] is not None
                                        for row in data["trend"]["rows"]), (chart, model)
            assert set(attributes(marks, "fill")) == set(colours[n])
            assert set(attributes(page.locator(f'#{chart} polyline[data-config="{n}"]'), "stroke")) == set(colours[n])
        assert {"a", "b"} <= set(page.locator(f"#{chart} text.end").all_text_contents()), "named, not colour alone"
    [line] = page.locator('#accuracy-trend polyline[data-config="0"]').all()
    assert len(line.get_attribute("points").split()) == 2, "a's third batch is of other tasks: not on its line"
    assert page.locator("#accuracy-trend text.end").all_text_contents().count("a") == 2, "each of a's lines named"
    assert page.locator("p.note").all_inner_texts() == data["trend"]["notes"]
    shown = [row.locator("th, td").all_inner_texts() for row in page.locator("#trend-table tr").all()]
    assert shown == [data["trend"]["columns"], *(row["cells"] for row in data["trend"]["rows"])]
    assert problems == []
    page.close()


@pytest.mark.processes
def test_in_a_browser_markup_in_a_model_name_is_text_and_nothing_runs(browser, hostile, tmp_path):
    assert main(["--trend", str(hostile), "--html", "-o", str(tmp_path / "trend.html")]) == 0
    page, problems = opened(browser, tmp_path / "trend.html")
    assert page.locator("#legend .key").all_inner_texts() == [HOSTILE_MODEL]
    assert page.locator("#trend-table td:nth-child(2)").all_inner_texts() == [HOSTILE_MODEL]
    assert page.evaluate("window.pwned") is None and page.locator("img, a").count() == 0 and problems == []
    page.close()


def test_a_model_name_with_line_breaks_stays_in_its_cell(tmp_path, cli, monkeypatch):
    forged = "small\n2031-01-01 09:00  gpt-5  6  100.0%  61.0%-100.0%  90  n/a  forged"
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    with ScriptedServer([], screen=lambda body: {"content": action("finish", result="5")}) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        monkeypatch.setenv("LLM_API_KEY", KEY)
        cli("--batch", tasks, "-m", forged, "--out", tmp_path / "runs", "-q")
        cli("--batch", tasks, "-m", "other", "--out", tmp_path / "other", "-q")
    for flags in (("--trend", tmp_path / "runs"), ("--summary", tmp_path / "runs", tmp_path / "other")):
        code, out, err = cli(*flags)
        assert code == 0 and not any(line.startswith(("2031", "gpt-5")) for line in out.splitlines()), out
        assert "small\\n2031-01-01" in out, out


def test_the_same_tasks_judged_another_way_are_another_task_set(tmp_path, cli, monkeypatch):
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    with ScriptedServer([], screen=lambda body: {"content": action("finish", result="5")}) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        monkeypatch.setenv("LLM_API_KEY", KEY)
        cli("--batch", tasks, "--out", tmp_path / "first", "-q")
        cli("--batch", tasks, "--out", tmp_path / "then", "-q", "--match", "exact")
    code, out, _ = cli("--trend", tmp_path / "first", tmp_path / "then", "--json")
    assert json.loads(out)["task_sets"] == 2, out
