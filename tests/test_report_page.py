"""The report page (report.html, --report, --show --html): what it holds, that nothing in it runs
but its own script, and, in headless Chromium where it is installed, what a person sees and does."""
import json
import re
import shutil
from pathlib import Path

import pytest

from agent_demo_kit.cli import main
from agent_demo_kit.report_page import SCRIPT, STYLE, _hash
from conftest import KEY
from scripted_server import ScriptedServer, action

HOSTILE = ["</script><script>window.pwned = 1</script>", '<img src=x onerror="window.pwned = 1">',
           '<a href="javascript:window.pwned = 1">click</a>']


def by_tag(body):
    """[finish] two rounds then 5, [wrong] answers 4, [fail] fails, [hostile N] answers HOSTILE[N]."""
    task = body["messages"][1]["content"]
    done = sum(message["role"] == "assistant" for message in body["messages"])
    tag = re.search(r"\[(\w+)( \d)?\]", task)
    if tag[1] == "finish":
        return {"content": action("calculator", expression="2 + 3") if done == 0 else action("finish", result="5")}
    if tag[1] == "wrong":
        return {"content": action("finish", result="4")}
    if tag[1] == "hostile":
        return {"content": action("finish", result=HOSTILE[int(tag[2])])}
    return {"content": action("fail", reason="cannot do it")}


def run_batch(folder, tags, monkeypatch, model="gpt-4o-mini", screen=by_tag, ids=None):
    tasks = folder / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": (ids or {}).get(n, f"t{n}"), "task": f"[{tag}] task {n}",
                                         "expected": "5"}) + "\n" for n, tag in enumerate(tags)))
    with ScriptedServer([], screen=screen) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        monkeypatch.setenv("LLM_API_KEY", KEY)
        main(["--batch", str(tasks), "--parallel", "4", "-q", "-m", model])
    return folder / "tasks-results" / model


def page_data(path):
    text = Path(path).read_text()
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S)[1])


FIFTY = ["finish"] * 30 + ["wrong"] * 10 + ["fail"] * 10


@pytest.fixture(scope="module")
def fifty(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        return run_batch(tmp_path_factory.mktemp("fifty"), FIFTY, monkeypatch)
    finally:
        monkeypatch.undo()


def repeated(body, tries={}):
    """Model a: t0..t12 always right, the rest never (39 of 48 runs, 81.25%: JavaScript's toFixed says
    81.3%, Python 81.2%); model b: t0..t9 always right, t10 and t11 on their first try only."""
    model, task = body["model"], body["messages"][1]["content"].split("Task: ", 1)[-1]
    number = int(task.split()[-1])
    tries[model, task] = seen = tries.get((model, task), 0) + 1
    right = number < 13 if model == "a" else number < 10 or number < 12 and seen == 1
    return {"content": action("finish", result="5" if right else "4")}


@pytest.fixture(scope="module")
def two_repeated(tmp_path_factory):
    """Two models' folders of 16 tasks, each tried 3 times."""
    folder, monkeypatch = tmp_path_factory.mktemp("repeated"), pytest.MonkeyPatch()
    monkeypatch.setenv("XDG_STATE_HOME", str(folder / "state"))  # not the developer's seal key
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder / "config"))
    tasks = folder / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{n}", "task": f"task {n}", "expected": "5"}) + "\n" for n in range(16)))
    try:
        with ScriptedServer([], screen=lambda body: repeated(body)) as server:
            monkeypatch.setenv("LLM_API_URL", server.url)
            monkeypatch.setenv("LLM_API_KEY", KEY)
            for model in ("a", "b"):
                main(["--batch", str(tasks), "--repeat", "3", "--parallel", "1", "-q", "-m", model])
    finally:
        monkeypatch.undo()
    return folder / "tasks-results" / "a", folder / "tasks-results" / "b"


def test_the_pages_figures_are_the_words_and_numbers_of_summary(two_repeated, cli, tmp_path):
    from agent_demo_kit.result_tables import figure_rows
    _, out, _ = cli("--summary", *two_repeated, "--json")
    compared = json.loads(out)
    _, table, _ = cli("--summary", *two_repeated)
    assert cli("--report", *two_repeated, "-o", tmp_path / "page.html")[0] == 0
    data = page_data(tmp_path / "page.html")
    assert [config["summary"] for config in data["configurations"]] == [
        config["summary"] for config in compared["configurations"]], "the same figures as --summary --json"
    assert data["figures"] == figure_rows(compared["configurations"])
    for name, *cells in data["figures"]:
        [line] = [line for line in table.splitlines() if line.startswith(name + "  ")]
        assert line.split() == (name + "  " + "  ".join(cells)).split(), "the same words as --summary"
    assert ["pass@1 / pass^k", "81.2% / 81.2%", "66.7% / 62.5%"] in data["figures"]
    _, alone, _ = cli("--summary", two_repeated[0])
    [said] = [line for line in alone.splitlines() if line.startswith("repeats ")]
    assert data["repeats"][0] == "a: " + said[len("repeats"):].strip()
    assert data["repeats"][1].startswith("b: 3 tries of 16 task(s): pass@1 66.7%, pass^3 62.5% (pass@1 of the runs,")


def test_a_batchs_own_page_shows_the_figures_summary_shows_for_its_folder(two_repeated, cli):
    from agent_demo_kit.result_tables import figure_rows
    _, out, _ = cli("--summary", two_repeated[1], "--json")
    alone = json.loads(out)
    data = page_data(two_repeated[1] / "report.html")
    assert data["figures"] == figure_rows([{"summary": alone, "failures": len(alone["failures"])}])
    assert data["repeats"] == ["b: 3 tries of 16 task(s): pass@1 66.7%, pass^3 62.5% (pass@1 of the runs, pass^3 of"
                               " the tasks); per try 75.0%, 62.5%, 62.5% (sd 5.9 points)"]


def test_a_batch_writes_its_report_page_with_a_row_a_task(fifty):
    data = page_data(fifty / "report.html")
    assert len(data["tasks"]) == 50
    results = {json.loads(line)["id"]: json.loads(line) for line in (fifty / "results.jsonl").read_text().splitlines()}
    for task in data["tasks"]:
        [run] = task["runs"]
        assert (run["status"], run["correct"], run["answer"]) == (results[task["id"]]["status"],
                                                                 results[task["id"]]["correct"],
                                                                 results[task["id"]]["answer"] or "")
    first = next(task for task in data["tasks"] if task["id"] == "t0")
    assert first["task"] == "[finish] task 0" and "--- round 2/" in first["runs"][0]["trace"]
    assert data["configurations"][0]["summary"]["status_counts"] == {"finished": 40, "failed": 10}


def test_nothing_from_a_model_or_a_task_file_becomes_markup(tmp_path, monkeypatch):
    folder = run_batch(tmp_path, ["hostile 0", "hostile 1", "hostile 2"], monkeypatch,
                       ids={0: HOSTILE[0], 1: HOSTILE[1], 2: HOSTILE[2]})
    text = (folder / "report.html").read_text()
    assert text.count("<script") == 2 and text.count("</script>") == 2, "the data block and the page's own script"
    assert "<img" not in text and "<a " not in text, "a < in the data is written \\u003c"
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', text)[1]
    assert f"script-src '{_hash(SCRIPT)}'" in policy and f"style-src '{_hash(STYLE)}'" in policy
    assert "default-src 'none'" in policy and "unsafe" not in policy
    data = page_data(folder / "report.html")
    assert sorted(task["runs"][0]["answer"] for task in data["tasks"]) == sorted(HOSTILE), "shown as written"
    assert sorted(task["id"] for task in data["tasks"]) == sorted(HOSTILE)


def test_a_report_of_two_models_shows_both_and_the_tasks_they_differ_on_first(tmp_path, monkeypatch, capsys):
    small = run_batch(tmp_path, ["finish", "finish", "finish", "finish"], monkeypatch, model="small")

    def stronger(body):
        answer = by_tag(body)
        task = body["messages"][1]["content"]
        return {"content": action("fail", reason="no")} if "task 2" in task else answer
    big = run_batch(tmp_path, ["finish", "finish", "finish", "finish"], monkeypatch, model="big", screen=stronger)
    assert main(["--report", str(small), str(big), "-o", str(tmp_path / "both.html")]) == 0
    data = page_data(tmp_path / "both.html")
    assert [config["label"] for config in data["configurations"]] == ["small", "big"]
    assert data["tasks"][0]["id"] == "t2" and data["tasks"][0]["differs"]
    assert [run["status"] for run in data["tasks"][0]["runs"]] == ["finished", "failed"]
    assert not any(task["differs"] for task in data["tasks"][1:])
    assert "report page: " in capsys.readouterr().err


def test_show_html_writes_one_run_as_a_page(tmp_path, serve, capsysbinary):
    serve([action("calculator", expression="2 + 3"), action("finish", result="5")])
    assert main(["--trace", str(tmp_path / "run.jsonl"), "-q", "add"]) == 0
    capsysbinary.readouterr()
    assert main(["--show", str(tmp_path / "run.jsonl"), "--html"]) == 0
    html = capsysbinary.readouterr().out.decode()
    assert html.startswith("<!DOCTYPE html>")
    data = json.loads(re.search(r'type="application/json">(.*?)</script>', html, re.S)[1])
    [task] = data["tasks"]
    assert task["task"] == "add" and task["runs"][0]["answer"] == "5" and "calculator" in task["runs"][0]["trace"]


def test_a_report_holds_no_key(tmp_path, monkeypatch):
    def leaky(body):
        return {"content": action("finish", result=f"the key is {KEY}")}
    folder = run_batch(tmp_path, ["finish"], monkeypatch, screen=leaky)
    assert KEY not in (folder / "report.html").read_text()


# --- in a real browser ----------------------------------------------------------------------------------

def chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no Chromium here (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    return found, sync_api


@pytest.fixture(scope="module")
def browser():
    found, sync_api = chromium()
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=found, args=["--no-sandbox"])
        yield launched
        launched.close()


def opened(browser, path):
    page = browser.new_page()
    problems = []
    page.on("console", lambda message: problems.append(message.text) if message.type in ("error", "warning") else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(Path(path).as_uri())
    page.wait_for_selector("#tasks tbody tr")
    return page, problems


@pytest.mark.processes
def test_in_a_browser_fifty_rows_a_filter_a_click_and_the_charts(browser, fifty):
    page, problems = opened(browser, fifty / "report.html")
    assert page.locator("#tasks tbody tr.task").count() == 50
    page.select_option("#status-filter", "failed")
    failed = page.locator("#tasks tbody tr.task")
    assert failed.count() == 10
    assert set(failed.locator("td:nth-child(4)").all_inner_texts()) == {"failed"}
    page.select_option("#status-filter", "")
    page.select_option("#correct-filter", "false")
    assert page.locator("#tasks tbody tr.task").count() == 20, "10 wrong answers and 10 that failed"
    page.select_option("#correct-filter", "")
    page.fill("#search", "task 7")
    assert page.locator("#tasks tbody tr.task").count() == 1
    page.locator("#tasks tbody tr.task").first.click()
    assert "--- round 2/" in page.locator("#tasks tbody tr.detail pre").inner_text()
    assert page.locator("#status-chart rect").count() >= 2 and page.locator("#rounds-chart rect").count() == 20
    assert problems == [], "the console is clean"
    page.close()


@pytest.mark.processes
def test_in_a_browser_a_hostile_answer_and_id_are_text_and_nothing_runs(browser, tmp_path, monkeypatch):
    folder = run_batch(tmp_path, ["hostile 0", "hostile 1", "hostile 2"], monkeypatch,
                       ids={0: HOSTILE[0], 1: HOSTILE[1], 2: HOSTILE[2]})
    page, problems = opened(browser, folder / "report.html")
    rows = page.locator("#tasks tbody tr.task")
    assert rows.count() == 3
    assert sorted(rows.locator("td:nth-child(1)").all_inner_texts()) == sorted(HOSTILE)
    assert sorted(rows.locator("td:nth-child(6)").all_inner_texts()) == sorted(HOSTILE)
    for n in range(3):
        rows.nth(n).click()
    assert page.evaluate("window.pwned") is None and page.locator("img, a").count() == 0
    assert problems == []
    page.close()


def test_a_report_says_a_tasks_error_on_the_page_not_on_stderr(tmp_path, monkeypatch, capsys):
    def crashing(body):
        return {"status": 500, "body": {"error": {"message": "the model crashed"}}}
    monkeypatch.setenv("AGENT_RETRIES", "0")
    folder = run_batch(tmp_path, ["finish"], monkeypatch, screen=crashing)
    err = capsys.readouterr().err
    assert main(["--report", str(folder), "-o", str(tmp_path / "page.html")]) == 0
    assert "agent-demo: error" not in capsys.readouterr().err and "agent-demo: error" not in err.split("report")[-1]
    [task] = page_data(tmp_path / "page.html")["tasks"]
    assert "agent-demo: error: HTTP 500" in task["runs"][0]["trace"]


@pytest.mark.parametrize("elsewhere", ["absolute", "up", "link"])
def test_a_damaged_trace_or_one_outside_the_folder_leaves_the_row_without_a_trace(tmp_path, monkeypatch, elsewhere):
    folder = run_batch(tmp_path, ["finish", "finish", "finish"], monkeypatch)
    (folder / "traces" / "t1.jsonl").write_text('{"event": "round"}\n')  # damaged: no start record
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "private.jsonl").write_text((folder / "traces" / "t2.jsonl").read_text().replace("task 2", "my secret"))
    named = {"absolute": str(mine / "private.jsonl"), "up": "traces/../../mine/private.jsonl",
             "link": "traces/t2-link.jsonl"}[elsewhere]
    (folder / "traces" / "t2-link.jsonl").symlink_to(mine / "private.jsonl")
    lines = (folder / "results.jsonl").read_text().splitlines()
    lines[2] = lines[2].replace('"traces/t2.jsonl"', json.dumps(named))
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["--report", str(folder), "-o", str(tmp_path / "page.html")]) == 0
    rows = {task["id"]: task for task in page_data(tmp_path / "page.html")["tasks"]}
    assert "--- round 2/" in rows["t0"]["runs"][0]["trace"]
    assert rows["t1"]["runs"][0]["trace"] == "" and rows["t2"]["runs"][0]["trace"] == ""
    assert "my secret" not in (tmp_path / "page.html").read_text()


def test_the_page_takes_the_line_of_a_task_that_summary_takes(tmp_path, monkeypatch):
    folder = run_batch(tmp_path, ["finish", "fail"], monkeypatch)
    lines = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    again = {**lines[0], "status": "failed", "answer": None}  # a second line for t0, ended at the same time
    (folder / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in [*lines, again]))
    from agent_demo_kit import report_page
    from agent_demo_kit.comparison import summarize
    page = b"".join(report_page.folder_pieces(folder))
    data = json.loads(re.search(rb'type="application/json">(.*?)</script>', page, re.S)[1])
    rows = {task["id"]: task["runs"][0]["status"] for task in data["tasks"]}
    assert rows == {"t0": "failed", "t1": "failed"} and len(data["tasks"]) == 2
    assert data["configurations"][0]["summary"]["status_counts"] == summarize([str(folder)])["status_counts"]


@pytest.mark.processes
def test_in_a_browser_odd_statuses_from_a_results_file_draw_cleanly(browser, tmp_path, monkeypatch):
    folder = run_batch(tmp_path, ["finish", "fail", "wrong"], monkeypatch)
    lines = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    for line, status in zip(lines, ["constructor", "__proto__", "toString"]):
        line["status"] = status
    (folder / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["--report", str(folder), "-o", str(tmp_path / "page.html")]) == 0
    page, problems = opened(browser, tmp_path / "page.html")
    assert page.locator("#tasks tbody tr.task").count() == 3
    assert page.locator("#status-chart rect").count() >= 3 and problems == []
    page.close()


@pytest.mark.parametrize("key, folded", [("sk-ascii-key-0123456789abcdef", False), ("sk-é0123-é4567-é89ab-écdef-é", False),
                                         ("sk-ascii-key-0123456789abcdef", True)], ids=["ascii", "non-ascii", "across lines"])
def test_a_page_holds_no_key_in_the_form_its_json_writes_it(key, folded):
    from agent_demo_kit import report_page
    from agent_demo_kit.redaction import Redactor
    said = "\n".join(key[at:at + 8] for at in range(0, len(key), 8)) if folded else key  # fold -w 8
    run = {"status": "finished", "answer": said, "trace": f"model: é {said}", "error": ""}
    data = {"title": "t", "configurations": [], "tasks": [{"id": "1", "try": 1, "task": f"use {said}", "expected": "",
                                                             "differs": False, "runs": [run]}]}
    html = report_page.page(data, Redactor(key)).decode()
    assert key not in html.replace("\\n", "") and json.dumps(key)[1:-1] not in html, \
        "neither as it is, nor as ASCII JSON writes it, nor across lines"
    assert html.count("[redacted]") == 3


@pytest.mark.processes
def test_in_a_browser_one_runs_page_shows_its_trace_without_a_click_and_no_batch_parts(browser, tmp_path, serve,
                                                                                          capsysbinary):
    serve([action("calculator", expression="2 + 3"), action("finish", result="5")])
    assert main(["--trace", str(tmp_path / "run.jsonl"), "-q", "add"]) == 0
    assert main(["--show", str(tmp_path / "run.jsonl"), "--html", "-o", str(tmp_path / "run.html")]) == 0
    page = browser.new_page()
    problems = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto((tmp_path / "run.html").as_uri())
    page.wait_for_selector("#trace")
    assert "calculator" in page.locator("#trace").inner_text() and page.locator("#trace").is_visible()
    assert page.locator("#answer").inner_text() == "5" and page.locator("#task").inner_text() == "add"
    assert page.locator("#tasks, #status-chart, #rounds-chart, #status-filter").count() == 0, "no batch page"
    assert "rows" not in page.locator("body").inner_text() and problems == []
    page.close()


def test_one_runs_page_is_marked_as_one_run(tmp_path, serve, capsys):
    serve([action("finish", result="5")])
    assert main(["--trace", str(tmp_path / "run.jsonl"), "-q", "add"]) == 0
    assert main(["--show", str(tmp_path / "run.jsonl"), "--html", "-o", str(tmp_path / "run.html")]) == 0
    assert page_data(tmp_path / "run.html")["kind"] == "run"


@pytest.mark.processes
def test_in_a_browser_the_figures_read_as_summary_says_them(browser, two_repeated, tmp_path):
    assert main(["--report", *map(str, two_repeated), "-o", str(tmp_path / "page.html")]) == 0
    data = page_data(tmp_path / "page.html")
    page, problems = opened(browser, tmp_path / "page.html")
    shown = [row.locator("th, td").all_inner_texts() for row in page.locator("#figures tr").all()]
    assert shown == [["", "a", "b"], *data["figures"]]
    assert ["pass@1 / pass^k", "81.2% / 81.2%", "66.7% / 62.5%"] in shown, "Python's rounding, not toFixed's 81.3%"
    assert page.locator("p.repeats").all_inner_texts() == data["repeats"] and problems == []
    page.close()


def fills(locator):
    return {element.get_attribute("fill") for element in locator.all()}


@pytest.mark.processes
def test_in_a_browser_each_configuration_has_one_colour_in_every_chart_and_the_legend(browser, two_repeated, tmp_path):
    assert main(["--report", *map(str, two_repeated), "-o", str(tmp_path / "page.html")]) == 0
    data = page_data(tmp_path / "page.html")
    page, problems = opened(browser, tmp_path / "page.html")
    assert page.locator("#legend .key").all_inner_texts() == ["a", "b"]
    colours = [fills(page.locator(f'#legend [data-config="{n}"]')) for n in range(2)]
    assert all(len(colour) == 1 for colour in colours) and colours[0] != colours[1]
    for chart in ("accuracy-chart", "repeats-chart", "status-chart", "rounds-chart", "seconds-chart"):
        for n in range(2):
            marked = page.locator(f'#{chart} [data-config="{n}"]')
            assert marked.count() and fills(marked) == colours[n], (chart, n)
    for chart in ("accuracy-chart", "repeats-chart", "status-chart"):  # told apart by label, not by colour alone
        assert {"a", "b"} <= set(page.locator(f"#{chart} text").all_text_contents()), chart
    accuracy = next(row for row in data["figures"] if row[0] == "accuracy")
    assert set(accuracy[1:]) <= set(page.locator("#accuracy-chart text").all_text_contents()), "--summary's words"
    assert {"pass@1 81.2%", "pass^3 81.2%", "pass@1 66.7%", "pass^3 62.5%"} <= set(
        page.locator("#repeats-chart text").all_text_contents())
    assert problems == []
    page.close()


@pytest.mark.processes
def test_in_a_browser_twelve_configurations_look_different_and_the_first_eight_differ_in_colour(browser, fifty):
    page, problems = opened(browser, fifty / "report.html")
    looks = page.evaluate("[...Array(12).keys()].map(n => look(n))")
    assert len({(each["colour"], each["shape"]) for each in looks}) == 12
    assert len({each["colour"] for each in looks[:8]}) == 8
    assert {each["colour"] for each in looks} <= {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00",
                                                  "#000000", "#F0E442"}, "Okabe and Ito's colour-blind-safe palette"
    page.close()


@pytest.mark.processes
def test_in_a_browser_markup_in_a_model_name_is_a_label_in_the_legend_and_charts(browser, tmp_path, monkeypatch):
    from agent_demo_kit.batch_folder import default_out
    model = HOSTILE[1]
    run_batch(tmp_path, ["hostile 0", "finish"], monkeypatch, model=model, ids={0: HOSTILE[0]})
    run_batch(tmp_path, ["finish", "finish"], monkeypatch, model=HOSTILE[0])
    folders = [default_out(str(tmp_path / "tasks.jsonl"), name) for name in (model, HOSTILE[0])]
    assert main(["--report", *map(str, folders), "-o", str(tmp_path / "page.html")]) == 0
    text = (tmp_path / "page.html").read_text()
    assert text.count("<script") == 2 and "<img" not in text
    page, problems = opened(browser, tmp_path / "page.html")
    assert page.locator("#legend .key").all_inner_texts() == [model, HOSTILE[0]]
    assert {model[:24], HOSTILE[0][:24]} <= set(page.locator("#accuracy-chart text").all_text_contents())
    assert page.evaluate("window.pwned") is None and page.locator("img, a").count() == 0 and problems == []
    page.close()
