"""Figures you can trust: `expected` scored after the run (never shown to the model), results that
belong to one configuration, two models side by side, repeats, cost, and what failed."""
import json
import os
import re
import signal
import time
from itertools import groupby
from pathlib import Path

import pytest

from agent_demo_kit import scoring
from agent_demo_kit.metrics import dollars
from conftest import KEY, start_cli
from scripted_server import ScriptedServer, action


@pytest.mark.parametrize("answer, expected, match, right", [
    ("The result is 1,536.", "1536", None, True),
    ("1536", 1536, None, True),
    ("1,536", "1,536", None, True),
    ("about 1536.01", "1536", None, False),
    ("3.0", "3", None, True),
    ("pages 3-5", "5", None, True),
    ("It is -5.", "-5", None, True),
    ("1,5367", "1536", None, False),
    ("4", "5", None, False),
    ("  \"Paris.\" ", "paris", None, True),
    ("PARIS!", "Paris", None, True),
    ("Paris, France", "Paris", None, False),
    ("Paris, France", "paris", "includes", True),
    ("Lyon", "paris", "includes", False),
    ("Paris", "Paris.", "exact", False),
    (" Paris\n", "Paris", "exact", True),
    ("order A1002 is 待支付", r"A100\d", "regex", True),
    ("order A1002", r"^A100\d$", "regex", False),
    ("seven", ["7", "seven"], None, True),
    ("eight", ["7", "seven"], None, False),
    ("the answer: 42", "42", "number", True),
    ("no number here", "42", "number", False),
    ({"total": 1536}, "1536", None, True),
])
@pytest.mark.processes
def test_an_answer_is_scored_the_way_people_read_it(answer, expected, match, right):
    assert scoring.score(answer, expected, match) is right


def test_the_interval_and_the_paired_test_are_the_textbook_ones():
    assert scoring.interval(7, 10) == (0.3968, 0.8922)  # Wilson, 95%
    assert scoring.interval(0, 0) is None
    assert scoring.paired_test(5, 1) == pytest.approx(0.21875)  # exact McNemar: 2 * P(X <= 1), X ~ B(6, 1/2)
    assert scoring.paired_test(10, 0) == pytest.approx(2 / 1024)
    assert scoring.paired_test(0, 0) == 1.0


class Answers:
    """Answers each task with what `answers` holds for its text (a finish), by model: {model: {task: answer}}.
    The tasks' texts say nothing of their answers, so a request that held an expected value leaked it."""

    def __init__(self, answers, tool_first=()):
        self.answers, self.tool_first, self.bodies = answers, set(tool_first), []

    def __call__(self, body):
        self.bodies.append(json.dumps(body, ensure_ascii=False))
        task = body["messages"][1]["content"].split("Task: ", 1)[-1]
        said = self.answers[body["model"]][task]
        if task in self.tool_first and not any(m["role"] == "assistant" for m in body["messages"]):
            return action("calculator", expression="2 + 3")
        if said is None:
            return action("fail", reason="cannot")
        return action("finish", result=said)


def scripted_batch(tmp_path, monkeypatch, screen):
    server = ScriptedServer([], screen=screen).__enter__()
    monkeypatch.setenv("LLM_API_URL", server.url)
    monkeypatch.setenv("LLM_API_KEY", KEY)
    return server


# answer, expected, match, right: 30 tasks with `expected`, 10 without
SCRIPTED = [
    ("The result is 1,536.", "1536", None, True), ("1536", 1536, None, True), ("Paris.", "paris", None, True),
    ("'Rome'", "Rome", None, True), ("BERLIN", "berlin", None, True), ("4", "5", None, False),
    ("Paris, France", "paris", "includes", True), ("Lyon", "paris", "includes", False),
    ("A1002", r"^A\d{4}$", "regex", True), ("B1002", r"^A\d{4}$", "regex", False),
    ("seven", ["7", "seven"], None, True), ("six", ["7", "seven"], None, False),
    ("12,000.5 in all", "12000.5", None, True), ("3.14", "3.14159", None, False),
    ("Answer: -2", "-2", "number", True), ("yes", "Yes.", "exact", False), ("Yes.", "Yes.", "exact", True),
    (None, "42", None, False), (None, "x", None, False), ("x", "x", None, True),
] + [(f"answer {n}", f"answer {n}", None, True) for n in range(6)] + [
    (f"answer {n}", f"other {n}", None, False) for n in range(4)]


def write_scored_tasks(path):
    lines = []
    for n, (answer, expected, match, right) in enumerate(SCRIPTED):
        lines.append({"id": f"s{n}", "task": f"question {n}", "expected": expected, **({"match": match} if match else {})})
    lines += [{"id": f"u{n}", "task": f"unscored {n}"} for n in range(10)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    answers = {f"question {n}": answer for n, (answer, *_) in enumerate(SCRIPTED)}
    answers.update({f"unscored {n}": f"free text {n}" for n in range(10)})
    return answers


def results_of(folder):
    return {line["id"]: line for line in map(json.loads, (Path(folder) / "results.jsonl").read_text().splitlines())}


@pytest.mark.processes  # the regex judge
def test_forty_tasks_are_scored_as_scripted_and_no_request_ever_holds_what_was_expected(tmp_path, cli, monkeypatch):
    answers = write_scored_tasks(tmp_path / "tasks.jsonl")
    screen = Answers({"gpt-4o-mini": answers}, tool_first={"question 0"})
    scripted_batch(tmp_path, monkeypatch, screen)
    code, out, err = cli("--batch", tmp_path / "tasks.jsonl", "--parallel", 4, "--json")
    summary = json.loads(out)
    lines = results_of(tmp_path / "tasks-results" / "gpt-4o-mini")
    assert [lines[f"s{n}"]["correct"] for n in range(30)] == [right for *_, right in SCRIPTED]
    assert all(lines[f"u{n}"]["correct"] is None for n in range(10)), "no expected answer: not counted as wrong"
    right = sum(right for *_, right in SCRIPTED)
    assert (summary["scored"], summary["correct"]) == (30, right)
    assert summary["accuracy"] == round(right / 30, 4)
    assert summary["accuracy_interval"] == list(scoring.interval(right, 30))
    assert summary["status_counts"] == {"failed": 2, "finished": 38}
    assert code == 1, "wrong answers are not a success"
    assert f"accuracy         {right / 30:.1%} ({right} of 30 with an expected answer; 95% interval" in err
    assert "s5: wrong: answered '4', expected '5'" in err, err
    leaked = [expected for _, expected, _, _ in SCRIPTED if isinstance(expected, str) and len(expected) > 3
              and any(expected in body for body in screen.bodies)]
    assert leaked == [], "the model never sees what is expected"


def test_two_models_get_a_folder_each_and_the_summary_puts_them_side_by_side(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": str(n)}) + "\n" for n in range(16)))
    small = {f"q{n}": str(n) if n < 4 or n == 15 else "no idea" for n in range(16)}
    big = {f"q{n}": str(n) if n != 15 else None for n in range(16)}
    server = scripted_batch(tmp_path, monkeypatch, Answers({"small": small, "big": big}))
    assert cli("--batch", path, "-m", "small", "-q")[0] == 1
    assert cli("--batch", path, "-m", "big", "-q")[0] == 1
    first, second = tmp_path / "tasks-results" / "small", tmp_path / "tasks-results" / "big"
    assert len(results_of(first)) == len(results_of(second)) == 16, "two folders, both complete"
    assert results_of(first)["t0"]["config"]["model"] == "small"

    code, out, err = cli("--summary", first, second, "--json")
    compared = json.loads(out)
    assert [column["label"] for column in compared["configurations"]] == ["small", "big"]
    assert [column["summary"]["correct"] for column in compared["configurations"]] == [5, 15]
    assert [entry["id"] for entry in compared["differences"]] == [f"t{n}" for n in range(4, 16)]
    [test] = compared["tests"]
    assert (test["only_first"], test["only_second"]) == (1, 11)
    assert test["p_value"] == pytest.approx(scoring.paired_test(1, 11), rel=1e-3)
    code, out, _ = cli("--summary", tmp_path / "tasks-results")  # the folder of both: the same two columns
    assert code == 0 and "small" in out.splitlines()[0] and "big" in out.splitlines()[0]
    assert "exact McNemar test p = 0.00635 (more than noise at 0.05)" in out
    assert "t15" in out and "failed" in out
    code, out, _ = cli("--summary", first, second, "--markdown")
    assert out.splitlines()[0].startswith("|  | small | big |") and "| accuracy |" in out

    sent = len(server.requests)
    code, out, err = cli("--batch", path, "-m", "big", "--out", first)
    assert (code, len(server.requests)) == (2, sent), "another configuration into a folder: refused, nothing sent"
    assert "holds results of another configuration (model small, now big)" in err
    code, out, err = cli("--batch", path, "-m", "small", "--max-rounds", 3, "--out", first)
    assert code == 2 and "max_rounds 6, now 3" in err


def test_repeats_give_each_try_a_trace_and_pass_at_1_and_pass_all(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": "yes"}) + "\n" for n in range(10)))
    tries = {}

    def flaky(body):  # q0..q4 always right, q5..q6 right on the first try only, q7..q9 never
        task = body["messages"][1]["content"].split("Task: ", 1)[-1]
        number = int(task[1:])
        tries[task] = tries.get(task, 0) + 1
        right = number < 5 or number < 7 and tries[task] == 1
        return action("finish", result="yes" if right else "no")
    scripted_batch(tmp_path, monkeypatch, flaky)
    code, out, err = cli("--batch", path, "--repeat", 3, "--parallel", 1, "--json")
    summary = json.loads(out)
    folder = tmp_path / "tasks-results" / "gpt-4o-mini"
    assert len(list((folder / "traces").iterdir())) == 30
    assert (summary["tasks"], summary["runs"], summary["repeats"]["tasks"]) == (10, 30, 10)
    assert summary["accuracy"] == round(17 / 30, 4)
    assert summary["accuracy_interval"] == list(scoring.interval(17 / 30 * 10, 10)), "the interval of 10 tasks, not 30"
    assert summary["repeats"]["pass_at_1"] == round(17 / 30, 4)
    assert summary["repeats"]["pass_all"] == 0.5
    assert summary["repeats"]["per_try"] == [0.7, 0.5, 0.5]
    assert "pass@1 56.7%, pass^3 50.0%" in err


@pytest.mark.processes
def test_a_repeated_batch_killed_then_run_again_ends_each_try_once(tmp_path, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": "5"}) + "\n" for n in range(10)))

    def slow(body):
        return {"content": action("finish", result="5"), "delay": 0.05}
    with ScriptedServer([], screen=slow) as server:
        env = {"LLM_API_URL": server.url, "LLM_API_KEY": KEY}
        args = ("--batch", path, "--repeat", 3, "--parallel", 2, "-q")
        process = start_cli(*args, env=env, cwd=tmp_path)
        folder = tmp_path / "tasks-results" / "gpt-4o-mini"
        deadline = time.monotonic() + 30
        while len(server.requests) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        process = start_cli(*args, "--json", env=env, cwd=tmp_path)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert json.loads(out)["status_counts"] == {"finished": 30}
    ends = {}
    for trace in (folder / "traces").iterdir():
        records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
        ends[trace.name] = sum(record["event"] == "end" for record in records)
    assert len(ends) == 30 and set(ends.values()) == {1}, ends


def test_a_price_gives_the_cost_the_token_counts_imply(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}"}) + "\n" for n in range(3)))

    def priced(body):  # 1,000 prompt tokens (400 of them cached) and 200 completion tokens a round
        return {"content": action("finish", result="ok"), "usage": {
            "prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
            "prompt_tokens_details": {"cached_tokens": 400}}}
    scripted_batch(tmp_path, monkeypatch, priced)
    code, out, err = cli("--batch", path, "--price", "2,8,1", "--json")
    each = (600 * 2 + 400 * 1 + 200 * 8) / 1e6
    summary = json.loads(out)
    assert code == 0 and summary["cost"] == pytest.approx(3 * each)
    lines = results_of(tmp_path / "tasks-results" / "gpt-4o-mini")
    assert [line["cost"] for line in lines.values()] == [pytest.approx(each)] * 3
    assert lines["t0"]["models"]["gpt-4o-mini"]["cost"] == pytest.approx(each)
    assert "cost             $0.0096, $0.0032 a run" in err

    code, out, _ = cli("--price", "2,8", "--json", "--no-log", "q0")
    assert json.loads(out)["cost"] == pytest.approx((1000 * 2 + 200 * 8) / 1e6), "no cached price: the input price"


@pytest.mark.processes
def test_a_batch_stopped_by_ctrl_c_says_the_command_that_goes_on(tmp_path, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}"}) + "\n" for n in range(6)))
    with ScriptedServer([], screen=lambda body: {"content": action("finish", result="ok"), "delay": 0.2}) as server:
        process = start_cli("--batch", path, "--parallel", 1, env={"LLM_API_URL": server.url}, cwd=tmp_path)
        deadline = time.monotonic() + 30
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert f"agent-demo: to go on: agent-demo --batch {path} --parallel 1" in err


def test_a_task_answered_in_words_says_so_in_its_results_line_and_the_completion_rate_reads_both_ways(
        tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "words", "task": "q0"}\n{"id": "action", "task": "q1"}\n')
    scripted_batch(tmp_path, monkeypatch, lambda body: "It is five." if "q0" in body["messages"][1]["content"]
                   else action("finish", result="five"))
    code, out, err = cli("--batch", path, "--json", "--mode", "tools")
    summary = json.loads(out)
    lines = results_of(tmp_path / "tasks-results" / "gpt-4o-mini")
    assert (lines["words"]["answered_in_words"], lines["action"]["answered_in_words"]) == (True, False)
    assert (summary["completion_rate"], summary["completion_rate_by_finish"], summary["answered_in_words"]) == \
        (1.0, 0.5, 1)
    assert "completion rate  100.0% (50.0% by a finish action; 1 answered in words)" in err


def test_with_escalate_each_model_is_priced_at_its_own_price(tmp_path, cli, monkeypatch):
    def by_model(body):  # small sends nothing usable three times, big finishes: 100 + 10 tokens a round each
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        if body["model"] == "small":
            return {"content": "{bad json", "usage": usage}
        return {"content": action("finish", result="ok"), "usage": usage}
    scripted_batch(tmp_path, monkeypatch, by_model)
    code, out, err = cli("-m", "small", "--escalate", "big", "--price", "1,2", "--escalate-price", "10,20",
                         "--json", "--no-log", "task")
    printed = json.loads(out)
    assert (code, printed["models"]["small"]["rounds"], printed["models"]["big"]["rounds"]) == (0, 3, 1), err
    assert printed["cost"] == pytest.approx(3 * (100 * 1 + 10 * 2) / 1e6 + (100 * 10 + 10 * 20) / 1e6)
    code, out, err = cli("-m", "small", "--escalate", "big", "--price", "1,2", "--json", "--no-log", "task")
    assert "cost" not in json.loads(out), "a model without a price: no cost rather than a wrong one"


def test_the_side_by_side_table_shows_model_text_escaped_even_into_a_pipe(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "t\u202e1", "task": "q", "expected": "5"}) + "\n")
    hostile = "\x1b[2J\x1b]0;pwned\x07 \x9b31m \u202eevil"
    scripted_batch(tmp_path, monkeypatch, Answers({"small": {"q": hostile}, "big": {"q": "5"}}))
    cli("--batch", path, "-m", "small", "-q")
    cli("--batch", path, "-m", "big", "-q")
    for flags in ((), ("--markdown",)):
        code, out, err = cli("--summary", tmp_path / "tasks-results", *flags)
        assert code == 0 and "\\x1b[2J" in out
        assert not any(character in out for character in "\x1b\x07\x9b\u202e"), flags
    code, out, err = cli("--summary", tmp_path / "tasks-results" / "small")
    assert "t\\u202e1" in out and "\u202e" not in out


@pytest.mark.parametrize("first, second", [("openai/gpt-4o", "openai-gpt-4o"), ("a:b", "a-b"), (".", "..")])
def test_model_names_a_folder_cannot_hold_as_they_are_still_get_folders_of_their_own(first, second):
    from agent_demo_kit.batch_folder import default_out
    assert default_out("tasks.jsonl", first) != default_out("tasks.jsonl", second)
    assert default_out("tasks.jsonl", first).parent == Path("tasks-results")


@pytest.mark.parametrize("expected", ["NaN", "1e999", "[]", "true", "{}", "[1, null]"])
def test_an_expected_answer_that_nothing_could_match_is_refused_before_anything_is_sent(tmp_path, cli, expected):
    (tmp_path / "tasks.jsonl").write_text('{"task": "q", "expected": %s}\n' % expected)
    code, out, err = cli("--batch", tmp_path / "tasks.jsonl", "--url", "http://127.0.0.1:9/v1")
    assert code == 2 and "line 1" in err


@pytest.mark.parametrize("amount, shown", [(0, "$0.00"), (1234.5, "$1,234.50"), (0.1, "$0.10"), (0.000135, "$0.000135"),
                                           (0.0000045, "$0.0000045"), (0.0125, "$0.0125"), (0.999, "$0.999")])
def test_an_amount_of_dollars_is_cents_or_three_significant_digits_without_trailing_zeros(amount, shown):
    assert dollars(amount) == shown


def test_a_comparison_with_repeats_tests_every_try_and_names_its_units(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": "yes"}) + "\n" for n in range(10)))
    tries = {}

    def flaky(body):  # steady is always right; shaky is right on its first try, and on later ones only for q8, q9
        model, task = body["model"], body["messages"][1]["content"].split("Task: ", 1)[-1]
        tries[model, task] = tries.get((model, task), 0) + 1
        right = model == "steady" or tries[model, task] == 1 or task in ("q8", "q9")
        return action("finish", result="yes" if right else "no")
    scripted_batch(tmp_path, monkeypatch, flaky)
    for model in ("steady", "shaky"):
        cli("--batch", path, "-m", model, "--repeat", 3, "--parallel", 1, "-q")
    code, out, err = cli("--summary", tmp_path / "tasks-results" / "steady", tmp_path / "tasks-results" / "shaky",
                         "--json")
    [test] = json.loads(out)["tests"]
    assert (test["only_first"], test["only_second"]) == (8, 0), "the first tries alone would show no difference"
    assert test["more_than_noise"] and test["test"] == "exact sign test of the tasks' pass rates over every try"
    code, out, err = cli("--summary", tmp_path / "tasks-results" / "steady", tmp_path / "tasks-results" / "shaky")
    assert "exact sign test of the tasks' pass rates over every try p = 0.00781" in out
    assert "10 (30 runs)" in out and "16 runs" in out  # failed or wrong: runs, beside tasks
    code, out, err = cli("--summary", tmp_path / "tasks-results" / "shaky")
    assert "(14 of 30 runs with an expected answer; 95% interval of the 10 tasks" in out
    assert "(pass@1 of the runs, pass^3 of the tasks)" in out


def test_a_rerun_without_repeat_keeps_the_tries_it_has_and_says_so(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": "yes"}) + "\n" for n in range(4)))
    scripted_batch(tmp_path, monkeypatch, lambda body: action("finish", result="yes"))
    cli("--batch", path, "--repeat", 3, "-q")
    folder = tmp_path / "tasks-results" / "gpt-4o-mini"
    code, out, err = cli("--batch", path)
    assert len((folder / "results.jsonl").read_text().splitlines()) == 12, "no try was cut"
    assert "results.jsonl keeps 8 tries from an earlier --repeat past this one's 1" in err
    code, out, err = cli("--summary", folder, "--json")
    assert json.loads(out)["repeats"]["tries"] == 3


def gate_folders(tmp_path, cli, monkeypatch, new_right):
    """A baseline that got 16 of 20 tasks right and a new batch (another model) that got new_right of them."""
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": str(n)}) + "\n" for n in range(20)))
    old = {f"q{n}": str(n) if n < 16 else "no idea" for n in range(20)}
    new = {f"q{n}": str(n) if n in new_right else "no idea" for n in range(20)}
    scripted_batch(tmp_path, monkeypatch, Answers({"old": old, "new": new}))
    cli("--batch", path, "-m", "old", "-q")
    cli("--batch", path, "-m", "new", "-q")
    return tmp_path / "tasks-results" / "new", tmp_path / "tasks-results" / "old"


def test_a_gate_fails_when_the_new_results_are_worse_than_the_baseline_beyond_noise(tmp_path, cli, monkeypatch):
    new, old = gate_folders(tmp_path, cli, monkeypatch, new_right={*range(8), 18})
    code, out, err = cli("--summary", new, "--baseline", old)
    assert code == 1, err
    assert "verdict: worse than the baseline, more than noise (exact McNemar test p = 0.0391, level 0.05; on 20" \
           " task(s) both ran, 8 turned wrong, 1 turned right)" in out, out
    assert "turned wrong: t8, t9, t10, t11, t12, t13, t14, t15" in out and "turned right: t18" in out
    code, out, _ = cli("--summary", new, "--baseline", old, "--json")
    gated = json.loads(out)["gate"]
    assert (code, gated["verdict"], gated["turned_wrong"], gated["turned_right"]) == (
        1, "worse", [f"t{n}" for n in range(8, 16)], ["t18"])
    assert gated["p_value"] == pytest.approx(scoring.paired_test(8, 1), rel=1e-3)
    code, out, _ = cli("--summary", new, "--baseline", old, "--significance", "0.01")
    assert code == 0 and "verdict: no difference from the baseline beyond noise" in out
    code, out, _ = cli("--summary", old, "--baseline", new)  # the other way round: better, and a gate passes
    assert code == 0 and "verdict: better than the baseline, more than noise" in out


def test_a_gate_passes_when_the_difference_could_be_noise(tmp_path, cli, monkeypatch):
    new, old = gate_folders(tmp_path, cli, monkeypatch, new_right={*range(14), 16, 17})
    code, out, _ = cli("--summary", new, "--baseline", old, "--json")
    gated = json.loads(out)["gate"]
    assert (code, gated["verdict"], len(gated["turned_wrong"]), len(gated["turned_right"])) == (0, "within noise", 2, 2)
    code, _, err = cli("--summary", new, "--baseline", tmp_path / "tasks-results")  # both models' folders
    assert code == 2 and "holds the results of 2 configurations; a gate compares one with one" in err


@pytest.mark.parametrize("argv, said", [
    (["--baseline", "x"], "--baseline goes with --summary NEW"),
    (["--summary", "x", "--significance", "0.1"], "--significance goes with --baseline"),
    (["--summary", "x", "--baseline", "y", "--significance", "1"], "must be a level between 0 and 1"),
])
def test_a_gate_given_wrongly_says_how_in_one_line(cli, argv, said):
    code, _, err = cli(*argv)
    assert code == 2 and said in err, err


SCORER = '''
def closeness(task, answer, expected):
    """1 for the expected number, less the further the answer is from it; None without one."""
    if expected is None:
        return None
    return max(0.0, 1 - abs(float(answer) - float(expected)) / 10)


def short(task, answer, expected):
    return len(str(answer)) <= 2


def fragile(task, answer, expected):
    return 1 / (int(answer) - 3)  # raises for 3; gives more than 1 for 2 (refused), 0.25 for 7
'''


def test_a_users_scorer_scores_every_answer_of_twenty_tasks_line_by_line(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", **({"expected": str(n)} if n < 18 else {})})
                            + "\n" for n in range(20)))
    (tmp_path / "score.py").write_text(SCORER)
    answers = {f"q{n}": str(n + n % 3) if n != 5 else None for n in range(20)}  # off by 0, 1, 2; t5 fails
    server = scripted_batch(tmp_path, monkeypatch, Answers({"gpt-4o-mini": answers}))
    code, out, err = cli("--batch", path, "--json", "-q", "--scorer", f"{tmp_path}/score.py:closeness",
                         "--scorer", f"{tmp_path}/score.py:short")
    lines = results_of(tmp_path / "tasks-results" / "gpt-4o-mini")
    for n in range(20):
        closeness = None if n >= 18 else 0.0 if n == 5 else round(1 - (n % 3) / 10, 6)
        short = 0.0 if n == 5 else float(len(str(n + n % 3)) <= 2)
        assert lines[f"t{n}"]["scores"] == {**({"closeness": closeness} if closeness is not None else {}),
                                            "short": short}, n
    summary = json.loads(out)
    scored = [1 - (n % 3) / 10 for n in range(18) if n != 5] + [0.0]
    assert summary["scores"]["closeness"] == {"mean": round(sum(scored) / 18, 4), "runs": 18}
    assert summary["scores"]["short"]["runs"] == 20
    assert all("closeness" not in json.dumps(request["body"]) for request in server.requests), "never seen by the model"
    code, out, _ = cli("--summary", tmp_path / "tasks-results" / "gpt-4o-mini")
    assert f"scores           closeness {summary['scores']['closeness']['mean']:.3g} (mean of 18 runs); short" in out


def test_a_scorer_that_fails_on_an_answer_costs_that_answer_its_score_not_the_batch(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}"}) + "\n" for n in (2, 3, 7)))
    (tmp_path / "score.py").write_text(SCORER)
    scripted_batch(tmp_path, monkeypatch, Answers({"gpt-4o-mini": {f"q{n}": str(n) for n in (2, 3, 7)}}))
    code, out, _ = cli("--batch", path, "--json", "-q", "--scorer", f"{tmp_path}/score.py:fragile")
    lines = results_of(tmp_path / "tasks-results" / "gpt-4o-mini")
    assert lines["t7"]["scores"] == {"fragile": 0.25}
    assert lines["t3"]["scores"] == {} and lines["t3"]["scorer_error"].startswith("fragile: ZeroDivisionError")
    assert "a score is True, False, a number from 0 to 1, or None" in lines["t2"]["scorer_error"]
    assert json.loads(out)["scorer_errors"] == 2 and json.loads(out)["status_counts"] == {"finished": 3}


@pytest.mark.parametrize("spec, said", [("score.py", "give FILE:FUNCTION"), ("nowhere.py:f", "no such file"),
                                        ("score.py:absent", "has no function absent"),
                                        ("broken.py:f", "importing broken.py failed: SyntaxError")])
def test_a_scorer_that_cannot_be_loaded_stops_the_batch_before_anything_is_sent(tmp_path, cli, monkeypatch, spec,
                                                                                  said):
    (tmp_path / "tasks.jsonl").write_text('{"task": "q"}\n')
    (tmp_path / "score.py").write_text(SCORER)
    (tmp_path / "broken.py").write_text("def f(:\n")
    server = scripted_batch(tmp_path, monkeypatch, Answers({"gpt-4o-mini": {"q": "1"}}))
    code, _, err = cli("--batch", tmp_path / "tasks.jsonl", "--scorer", spec)
    assert (code, server.requests) == (2, []) and said in err, err


def test_the_report_page_says_the_verdict_in_the_words_of_the_summary(tmp_path, cli, monkeypatch):
    import re
    new, old = gate_folders(tmp_path, cli, monkeypatch, new_right={*range(8), 18})
    code, out, _ = cli("--summary", old, new)
    said = [line for line in out.splitlines() if "exact McNemar test p =" in line]
    page = tmp_path / "report.html"
    assert cli("--report", old, new, "-o", page)[0] == 0
    text = page.read_text()
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S)[1])
    assert data["verdicts"] == said and len(said) == 1 and "(more than noise at 0.05)" in said[0]
    assert [column["summary"]["accuracy_interval"] for column in data["configurations"]][0] == \
        list(scoring.interval(16, 20))
    assert 'wrong ? "wrong" : run.status' in text, "a finished answer that is wrong is not shown as finished alone"


def test_a_plan_says_what_a_batch_would_take_and_sends_nothing(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": str(n)}) + "\n" for n in range(20)))
    server = scripted_batch(tmp_path, monkeypatch, Answers({"gpt-4o-mini": {f"q{n}": str(n) for n in range(20)}},
                                                           tool_first={f"q{n}" for n in range(20)}))
    code, out, err = cli("--batch", path, "--plan", "--json", "--price", "0.15,0.60")
    guessed = json.loads(out)
    assert (code, server.requests, (tmp_path / "tasks-results").exists()) == (0, [], False), err
    assert (guessed["runs"], guessed["requests"], guessed["from_earlier_results"]) == (20, 40, False)
    assert guessed["requests_at_most"] == 20 * 6 and guessed["cost"] < guessed["cost_at_most"]
    assert (guessed["fewest_differing"], guessed["detectable"]) == (6, None), "20 tasks: too few for a fifth differing"
    assert cli("--batch", path, "-q")[0] == 0  # each task: the calculator, then the answer
    code, out, _ = cli("--batch", path, "--plan", "--json", "--repeat", "2")
    planned = json.loads(out)
    assert (planned["from_earlier_results"], planned["runs"], planned["requests"]) == (True, 40, 80), planned
    code, out, _ = cli("--batch", path, "--plan")
    assert "requests    about 40 (2 a run, as the earlier results in its folder averaged)" in out, out
    assert "nothing was sent" in out
    folder = tmp_path / "tasks-results" / "gpt-4o-mini"
    for other in (("--max-rounds", "3"), ("-m", "big"), ("--task-checks",)):  # what the run itself would refuse
        code, _, err = cli("--batch", path, "--out", folder, "--plan", *other)
        assert code == 2 and f"{folder} holds results of another configuration" in err, (other, err)


def test_the_smallest_difference_a_plan_names_is_connors_for_mcnemars_test():
    from agent_demo_kit.planning import fewest_differing, smallest_difference
    assert [fewest_differing(level) for level in (0.05, 0.01)] == [6, 8]
    assert smallest_difference(155, 0.05) == pytest.approx(0.1, abs=0.002)  # n = 154.6 for a 10-point difference
    assert smallest_difference(10_000, 0.05) < smallest_difference(1_000, 0.05) < smallest_difference(155, 0.05)
    assert smallest_difference(5, 0.05) is None, "five tasks show nothing"


def test_a_gate_refuses_new_results_that_lack_tasks_or_hold_other_ones(tmp_path, cli, monkeypatch):
    new, old = gate_folders(tmp_path, cli, monkeypatch, new_right=set(range(20)))
    lines = (new / "results.jsonl").read_text().splitlines()
    (new / "results.jsonl").write_text("\n".join(lines[:5]) + "\n")  # a batch stopped after five tasks
    code, _, err = cli("--summary", new, "--baseline", old)
    assert code == 2 and "the new results lack 15 of the baseline's 20 tasks (t5, t6, t7, t8, t9, ...)" in err, err
    changed = [json.loads(line) for line in lines]
    changed[0]["task_hash"] = "0" * 16  # the same id, another task
    (new / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in changed))
    code, _, err = cli("--summary", new, "--baseline", old)
    assert code == 2 and "1 task(s) have another text under the same id (t0)" in err, err


@pytest.mark.parametrize("raised, said", [("sys.exit(3)", "SystemExit: 3"), ("raise Stop('no')", "Stop: no"),
                                           ("raise KeyboardInterrupt", "KeyboardInterrupt")])
def test_a_scorer_that_exits_or_raises_anything_costs_that_answer_its_score(tmp_path, cli, monkeypatch, raised, said):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(f'{{"id": "t{n}", "task": "q{n}"}}\n' for n in range(4)))
    (tmp_path / "score.py").write_text("import sys\nclass Stop(BaseException):\n    pass\n"
                                       f"def quits(task, answer, expected):\n    if task == 'q1':\n        {raised}\n"
                                       "    return 1\n")
    scripted_batch(tmp_path, monkeypatch, Answers({"gpt-4o-mini": {f"q{n}": "1" for n in range(4)}}))
    code, out, err = cli("--batch", path, "--json", "-q", "--parallel", "2", "--scorer", f"{tmp_path}/score.py:quits")
    assert (code, json.loads(out)["scorer_errors"], json.loads(out)["status_counts"]) == (0, 1, {"finished": 4}), err
    code, out, _ = cli("--summary", tmp_path / "tasks-results" / "gpt-4o-mini", "--markdown")
    assert "| scorer failed | 1 run(s) |" in out, out
    lines = results_of(tmp_path / "tasks-results" / "gpt-4o-mini")
    assert lines["t1"]["scorer_error"] == f"quits: {said}" and lines["t2"]["scores"] == {"quits": 1.0}
    assert "Traceback" not in err


def markdown_cells(line):
    """The cells of a Markdown table row, split where GitHub splits them (at a | not escaped)."""
    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


def test_markdown_for_a_pull_request_shows_ids_answers_and_metadata_as_text_never_as_markup(tmp_path, cli,
                                                                                              monkeypatch):
    hostile = "<img src=x onerror=alert(1)> | @alice [link](http://x) **bold** `code`"
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}|<b>{n}</b>", "task": f"q{n}", "expected": "5",
                                        "metadata": {"kind": "a|b <i>"}}) + "\n" for n in range(12)))
    scripted_batch(tmp_path, monkeypatch, Answers({"old": {f"q{n}": "5" for n in range(12)},
                                                   "new": {f"q{n}": hostile for n in range(12)}}))
    cli("--batch", path, "-m", "old", "-q")
    cli("--batch", path, "-m", "new", "-q")
    folders = tmp_path / "tasks-results"
    for flags in (("--summary", folders), ("--summary", folders / "new", "--baseline", folders / "old"),
                  ("--summary", folders / "new")):
        code, out, err = cli(*flags, "--markdown")
        assert "<" not in out and "@alice" not in out and "](" not in out and "**" not in out and "`" not in out, out
        tables = [list(rows) for is_row, rows in groupby(out.splitlines(), lambda line: line.startswith("|")) if is_row]
        assert tables and all(len({len(markdown_cells(row)) for row in rows}) == 1 for rows in tables), out
        assert "by kind: a&#124;b &lt;i&gt;" in out, out


def test_several_models_in_one_command_get_a_folder_each_and_end_with_the_comparison(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": str(n)}) + "\n" for n in range(12)))
    server = scripted_batch(tmp_path, monkeypatch, Answers({"small": {f"q{n}": "0" for n in range(12)},
                                                            "big": {f"q{n}": str(n) for n in range(12)}}))
    code, out, err = cli("--batch", path, "-m", "small", "-m", "big", "-q")
    assert code == 1, err  # small got 11 of 12 wrong
    folders = tmp_path / "tasks-results"
    assert len(results_of(folders / "small")) == len(results_of(folders / "big")) == 12
    assert sorted(request["body"]["model"] for request in server.requests) == ["big"] * 12 + ["small"] * 12
    assert "|" not in out and "small" in out.splitlines()[0] and "big" in out.splitlines()[0], out
    assert "big vs small: on 12 task(s) both ran, right only with big 11, only with small 0" in out, out
    code, out, err = cli("--batch", path, "-m", "small", "-m", "big", "--json", "--out", tmp_path / "both")
    compared = json.loads(out)
    assert [column["label"] for column in compared["configurations"]] == ["small", "big"], out
    assert [column["summary"]["correct"] for column in compared["configurations"]] == [1, 12]
    assert sorted(os.listdir(tmp_path / "both")) == ["big", "small"]
    code, _, err = cli("-m", "small", "-m", "big", "compute 2 + 3")
    assert code == 2 and "several models (-m small -m big) go with --batch" in err, err
    code, _, err = cli("--batch", path, "-m", "small", "-m", "small")
    assert code == 2 and "-m small is named twice" in err, err
    monkeypatch.setenv("AGENT_BATCH_MODELS", "big, small")  # as a settings file may say
    code, out, err = cli("--batch", path, "--out", tmp_path / "listed", "--json", "-q")
    assert [column["label"] for column in json.loads(out)["configurations"]] == ["big", "small"], err
    code, out, err = cli("--batch", path, "--out", tmp_path / "listed" / "big", "-m", "big", "--json", "-q")
    assert (code, json.loads(out)["tasks"]) == (0, 12), "-m wins over the list"


@pytest.mark.parametrize("models, said", [(("good", " good"), "-m  good is named twice"),
                                          (("good/x", "good-x-" + __import__("hashlib").sha256(b"good/x").hexdigest()[:8]),
                                           "would share the folder")])
def test_two_models_of_one_folder_are_refused_before_anything_is_sent(tmp_path, cli, monkeypatch, models, said):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "t0", "task": "q0", "expected": "0"}\n')
    server = scripted_batch(tmp_path, monkeypatch, Answers({model.strip(): {"q0": "0"} for model in models}))
    code, _, err = cli("--batch", path, *(word for model in models for word in ("-m", model)))
    assert code == 2 and said in err and server.requests == [], err


@pytest.mark.parametrize("listed", [",", " , ", ""])
def test_an_empty_list_of_models_is_no_list(tmp_path, cli, monkeypatch, listed):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "t0", "task": "q0", "expected": "0"}\n')
    scripted_batch(tmp_path, monkeypatch, Answers({"gpt-4o-mini": {"q0": "0"}}))
    monkeypatch.setenv("AGENT_BATCH_MODELS", listed)
    code, _, err = cli("--batch", path, "-q")
    assert code == 0 and (tmp_path / "tasks-results" / "gpt-4o-mini").is_dir(), err


def test_markdown_keeps_its_tables_whole_whatever_comes_after_or_inside(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"q{n}", "expected": "5"}) + "\n" for n in range(3)))
    name = "good\n| injected | row |\n\n# Heading"
    scripted_batch(tmp_path, monkeypatch, Answers({name: {f"q{n}": "4" for n in range(3)}}))
    cli("--batch", path, "-m", name, "-q", "--out", tmp_path / "folder")
    code, out, _ = cli("--summary", tmp_path / "folder", "--markdown")
    lines = out.splitlines()
    assert not any(line.startswith(("| injected", "# Heading")) for line in lines), out
    last_row = max(number for number, line in enumerate(lines) if line.startswith("|"))
    assert lines[last_row + 1] == "" and "did not finish or were wrong" in out, out


def test_a_plan_refuses_a_folder_the_batch_would_refuse(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "t0", "task": "q0", "expected": "0"}\n')
    server = scripted_batch(tmp_path, monkeypatch, Answers({"gpt-4o-mini": {"q0": "0"}}))
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o777)
    code, _, plan_said = cli("--batch", path, "--out", team / "x", "--plan")
    code_of_batch, _, batch_said = cli("--batch", path, "--out", team / "x")
    assert (code, code_of_batch, server.requests) == (2, 2, []), plan_said
    assert plan_said.splitlines()[-1] == batch_said.splitlines()[-1], (plan_said, batch_said)


def test_the_command_that_runs_failed_tasks_again_keeps_the_tools_of_their_configuration(tmp_path, cli, monkeypatch):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "t0", "task": "q0", "expected": "0"}\n')
    server = scripted_batch(tmp_path, monkeypatch, Answers({"gpt-4o-mini": {"q0": "1"}}))
    for tools in ("none", "calculator"):
        out = tmp_path / tools
        cli("--batch", path, "--tools", tools, "--out", out, "-q")
        code, _, err = cli("--summary", out)
        again = err.split("to run them again: ", 1)[1].splitlines()[0]
        assert f"--tools {tools}" in again, err
        sent = len(server.requests)
        assert cli(*__import__("shlex").split(again)[1:])[0] == 1 and len(server.requests) == sent + 1, again
