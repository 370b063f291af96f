"""--batch and --summary: many tasks against a scripted endpoint that answers each task by the tag
in its text ([finish], [fail], ...), whatever order the tasks' requests arrive in."""
import json
import os
import re
import signal
import threading
import time

import pytest

from agent_demo_kit.task_file import file_name, read_tasks
from agent_demo_kit.endings import ConfigError
from conftest import KEY, run_cli, start_cli
from scripted_server import ScriptedServer, action

CHECK = 'test "$AGENT_ANSWER" = "$AGENT_EXPECTED"'


class ByTask:
    """Answers each request by its task's tag and round; counts the requests of each task."""

    def __init__(self, delay=0.0):
        self.requests, self.delay, self.lock = {}, delay, threading.Lock()

    def __call__(self, body):
        task = body["messages"][1]["content"]
        done = sum(message["role"] == "assistant" for message in body["messages"])
        with self.lock:
            self.requests[task] = seen = self.requests.get(task, 0) + 1
        tag = re.search(r"\[(\w+)\]", task)[1]
        if self.delay:
            time.sleep(self.delay)
        if tag == "finish":  # two rounds: the calculator, then the answer
            return action("calculator", expression="2 + 3") if done == 0 else action("finish", result="5")
        if tag == "fail":
            return action("fail", reason="cannot do it")
        if tag == "wrong":  # an answer the check rejects
            return action("finish", result="4")
        if tag == "error":
            return {"status": 500, "body": {"error": {"message": "the model crashed"}}}
        if tag == "storm":  # three 429s with Retry-After, then a good answer
            if seen <= 3:
                return {"status": 429, "headers": {"Retry-After": "0"}, "body": {"error": {"message": "slow down"}}}
            return action("finish", result="5")
        if tag == "long":  # five rounds, then the answer
            return action("calculator", expression=f"{done} + 1") if done < 5 else action("finish", result="5")
        raise AssertionError(f"no script for {task}")


def write_tasks(path, tags):
    """A task file: one line a tag, each expecting 5."""
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"[{tag}] task {n}", "expected": "5"}) + "\n"
                            for n, tag in enumerate(tags)))
    return path


def results(folder, name="results.jsonl"):
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


@pytest.mark.processes
def test_fifty_scripted_outcomes_are_counted_exactly_and_a_rerun_does_no_new_work(tmp_path, cli, monkeypatch):
    tags = ["finish"] * 20 + ["fail"] * 8 + ["wrong"] * 8 + ["error"] * 4 + ["storm"] * 10
    tasks = write_tasks(tmp_path / "tasks.jsonl", tags)
    script = ByTask()
    with ScriptedServer([], screen=script) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        monkeypatch.setenv("LLM_API_KEY", KEY)
        args = ("--batch", tasks, "--parallel", 6, "--check", CHECK, "--check-attempts", 1, "--json")
        code, out, err = cli(*args)
        sent = len(server.requests)
        summary = json.loads(out)
        assert code == 1
        assert summary["tasks"] == 50
        assert summary["status_counts"] == {"finished": 30, "failed": 16, "error": 4}
        assert summary["checked"] == 38 and summary["check_pass_rate"] == pytest.approx(30 / 38, abs=1e-4)
        assert summary["completion_rate"] == 0.6
        lines = results(tmp_path / "tasks-results" / "gpt-4o-mini")
        assert [line["id"] for line in lines] == [f"t{n}" for n in range(50)], "one line a task, in the file's order"
        by_id = {line["id"]: line for line in lines}
        assert all(by_id[f"t{n}"]["status"] == "finished" and by_id[f"t{n}"]["rounds"] == 2 for n in range(20))
        assert by_id["t0"]["answer"] == "5" and by_id["t0"]["tool_calls"] == 1 and by_id["t0"]["tokens"]["total"] == 30
        assert by_id["t30"]["checks"] == {"runs": 1, "passed": 0} and "check rejected" in by_id["t30"]["summary"]
        assert by_id["t36"]["errors"] == 2, by_id["t36"]
        assert "the model crashed" in by_id["t36"]["error"]
        assert all(by_id[f"t{n}"]["status"] == "finished" for n in range(40, 50)), "a 429 storm is weathered"
        assert all((tmp_path / "tasks-results" / "gpt-4o-mini" / line["trace"]).is_file() for line in lines)
        assert json.loads((tmp_path / "tasks-results" / "gpt-4o-mini" / "summary.json").read_text()) == summary
        assert "[50/50]" in err and "completion rate  60.0%" in err

        code, out, err = cli(*args)
        extra = [request["body"]["messages"][1]["content"] for request in server.requests[sent:]]
        assert (code, len(server.requests)) == (1, sent), ("the same command again sends nothing", extra)
        assert json.loads(out)["status_counts"] == summary["status_counts"]
        assert "50 already ended, 0 go on from their traces, 0 start" in err


def test_an_endpoint_that_takes_four_requests_at_once_serves_sixteen_parallel_tasks(tmp_path, cli, monkeypatch):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["long"] * 24)
    with ScriptedServer([], screen=ByTask(delay=0.005), most_in_flight=4) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        monkeypatch.setenv("AGENT_RETRIES", "1")  # a 429 that cost a retry would soon end a task
        code, out, err = cli("--batch", tasks, "--parallel", 16, "--max-rounds", 10, "--json", "-q")
        assert server.too_many > 0, "the endpoint did answer 429s"
        assert server.peak_in_flight <= 4
    summary = json.loads(out)
    assert (code, summary["status_counts"]) == (0, {"finished": 24}), err
    assert summary["retries"] >= server.too_many - 16  # each 429 is in a trace (some came back to requests cut short)


@pytest.mark.processes
def test_four_shards_merged_count_as_one_whole_run(tmp_path, cli, monkeypatch):
    tags = ["finish", "fail", "wrong", "finish", "storm", "fail", "finish"] * 2
    tasks = write_tasks(tmp_path / "tasks.jsonl", tags)
    monkeypatch.setenv("LLM_API_KEY", KEY)
    common = ("--batch", tasks, "--check", CHECK, "--check-attempts", 1, "--parallel", 2, "-q")
    with ScriptedServer([], screen=ByTask()) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        assert cli(*common, "--out", tmp_path / "whole")[0] == 1
    with ScriptedServer([], screen=ByTask()) as server:  # its own 429 storms
        monkeypatch.setenv("LLM_API_URL", server.url)
        for index in range(4):  # two shards share a folder, two have their own
            folder = tmp_path / ("shared" if index < 2 else f"own{index}")
            assert cli(*common, "--shard", f"{index}/4", "--out", folder)[0] in (0, 1)
    assert sorted(path.name for path in (tmp_path / "shared").iterdir()) == [
        "report.html", "results-0of4.jsonl", "results-1of4.jsonl", "summary-0of4.json", "summary-1of4.json", "traces"]
    assert [line["id"] for line in results(tmp_path / "own2", "results-2of4.jsonl")] == ["t2", "t6", "t10"]
    whole = json.loads(cli("--summary", tmp_path / "whole", "--json")[1])
    code, out, _ = cli("--summary", tmp_path / "shared", tmp_path / "own2", tmp_path / "own3", "--json")
    merged = json.loads(out)
    assert code == 0 and merged["tasks"] == whole["tasks"] == 14
    for figure in ("status_counts", "rounds", "tokens", "tool_calls", "retries", "check_pass_rate"):
        assert merged[figure] == whole[figure], figure
    code, out, _ = cli("--summary", tmp_path / "whole")
    assert code == 0 and out.startswith("tasks            14: failed 6, finished 8\n")


def rounds_without_end(trace):
    """The rounds a trace holds while its run has not ended (0 once it has)."""
    events = [json.loads(line)["event"] for line in trace.read_text().splitlines() if line.endswith("}")]
    return 0 if "end" in events else events.count("round")


@pytest.mark.processes
def test_kill_9_mid_batch_then_the_same_command_ends_every_task_once_without_redoing_rounds(tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["long"] * 12)
    out = tmp_path / "out"
    script = ByTask(delay=0.05)
    with ScriptedServer([], screen=script) as server:
        env = {"LLM_API_URL": server.url, "LLM_API_KEY": KEY}
        args = ("--batch", tasks, "--out", out, "--parallel", 3, "--max-rounds", 10, "-q")
        process = start_cli(*args, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                (out / "results.jsonl").is_file() and len((out / "results.jsonl").read_text().splitlines()) >= 3
                and any(rounds_without_end(path) >= 2 for path in (out / "traces").iterdir())):
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.communicate()
        cut = {path.name: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
               for path in (out / "traces").iterdir()}
        midway = {name: sum(r["event"] == "round" for r in records) for name, records in cut.items()
                  if not any(r["event"] == "end" for r in records)}
        assert any(midway.values()), "some task was killed with rounds recorded"
        script.delay = 0
        code, _, err = run_cli(*args, env=env)
    assert code == 0, err
    assert [line["status"] for line in results(out)] == ["finished"] * 12
    for path in (out / "traces").iterdir():
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        events = [record["event"] for record in records]
        assert events.count("start") == 1 and events.count("end") == 1 + events.count("resume") - (
            path.name in midway), path.name
        assert [r["round"] for r in records if r["event"] == "round"] == list(range(1, 7)), "no round run twice"
        if midway.get(path.name):
            resume = next(r for r in records if r["event"] == "resume")
            assert resume["after_round"] == midway[path.name]


def started_batch(server, args, env, requests):
    """The batch command in a child process, once the server has had `requests` requests."""
    process = start_cli(*args, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(server.requests) < requests:
        time.sleep(0.02)
    return process


@pytest.mark.processes
def test_ctrl_c_ends_the_running_tasks_as_resumable_and_the_same_command_finishes_them(tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["long"] * 6)
    out = tmp_path / "out"
    script = ByTask(delay=0.1)
    with ScriptedServer([], screen=script) as server:
        env = {"LLM_API_URL": server.url, "LLM_API_KEY": KEY}
        args = ("--batch", tasks, "--out", out, "--parallel", 2, "--max-rounds", 10)
        process = started_batch(server, args, env, 4)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 130, err
        assert "stopping: no new task starts" in err
        stopped = results(out)
        assert [line["status"] for line in stopped] == ["interrupted", "interrupted"], err
        for line in stopped:
            end = json.loads((out / line["trace"]).read_text().splitlines()[-1])
            assert (end["event"], end["status"], end["resumable"]) == ("end", "interrupted", True)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status_counts"] == {"interrupted": 2, "pending": 4} and summary["tasks"] == 6
        script.delay = 0
        code, _, err = run_cli(*args, env=env)
    assert code == 0, err
    assert "0 already ended, 2 go on from their traces, 4 start" in err
    assert [line["status"] for line in results(out)] == ["finished"] * 6


def test_a_refused_key_stops_the_batch(tmp_path, cli, monkeypatch):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"] * 5)
    with ScriptedServer([{"status": 401, "body": {"error": {"message": "bad key"}}}]) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--batch", tasks, "--json")
        assert len(server.requests) == 1
    assert code == 3 and "the endpoint refused the key" in err, "exit 3, as a single run's refused key"
    assert json.loads(out)["status_counts"] == {"error": 1, "pending": 4}
    assert f"agent-demo: to go on: agent-demo --batch {tasks} --json" in err


@pytest.mark.processes
def test_a_tasks_own_check_and_expected_answer_reach_the_check(tmp_path, cli, serve):
    (tmp_path / "tasks.jsonl").write_text(
        json.dumps({"task": "[finish] add", "expected": "5"}) + "\n"
        + json.dumps({"task": "[finish] again", "expected": "6"}) + "\n"
        + json.dumps({"task": "[finish] own check", "expected": "6", "check": "test \"$AGENT_EXPECTED\" = 6"}) + "\n")
    serve([], screen=ByTask())
    code, out, _ = cli("--batch", tmp_path / "tasks.jsonl", "--check", CHECK, "--check-attempts", 1, "--json",
                       "--task-checks")
    assert code == 1
    assert [(line["id"], line["status"]) for line in results(tmp_path / "tasks-results" / "gpt-4o-mini")] == [
        ("1", "finished"), ("2", "failed"), ("3", "failed")], "the line's own check and --check: both must pass"


def test_rerun_failed_starts_again_what_did_not_finish_and_retry_errors_counts_across_runs(tmp_path, cli, serve):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish", "fail", "error"])
    server = serve([], screen=ByTask())
    cli("--batch", tasks, "--retry-errors", 0)
    assert len(server.requests) == 2 + 1 + 4  # the error: its first attempt and three retries, not run again
    server.requests.clear()
    code, out, _ = cli("--batch", tasks, "--retry-errors", 1, "--json")
    assert len(server.requests) == 4, "the error's second attempt"
    server.requests.clear()
    code, out, _ = cli("--batch", tasks, "--retry-errors", 1, "--rerun-failed", "--json")
    assert len(server.requests) == 1, "the failed task, from the start; the finished one is kept"
    trace = (tmp_path / "tasks-results" / "gpt-4o-mini" / "traces" / "t1.jsonl").read_text()
    assert trace.count('"event": "start"') == 2, "the first run stays in its trace"
    assert json.loads(out)["status_counts"] == {"error": 1, "failed": 1, "finished": 1}


@pytest.mark.processes
def test_the_live_line_is_on_a_terminal_only(tmp_path, serve):
    import pty
    import subprocess
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"] * 3)
    server = serve([], screen=ByTask())
    env = {"LLM_API_URL": server.url, "LLM_API_KEY": KEY}
    controller, terminal = pty.openpty()
    process = start_cli("--batch", tasks, "--out", tmp_path / "a", env=env, stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        try:
            piece = os.read(controller, 4096)
        except OSError:
            break
        if not piece:
            break
        shown += piece
    process.wait(timeout=30)
    os.close(controller)
    assert b"3/3 done (finished 3), 90 tokens" in shown and b"\r\x1b[K" in shown
    code, _, err = run_cli("--batch", tasks, "--out", tmp_path / "b", env=env, stderr=subprocess.PIPE)
    assert code == 0 and "\r" not in err and "done (" not in err and "[3/3]" in err


def test_the_summary_of_the_run_log_counts_single_runs(cli, serve):
    serve([action("finish", result="ok"), action("fail", reason="no")])
    assert cli("first")[0] == 0
    assert cli("second")[0] == 1
    code, out, _ = cli("--summary", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["tasks"] == 2 and summary["status_counts"] == {"failed": 1, "finished": 1}


@pytest.mark.parametrize("text, problem", [
    ('{"task": "a"}\n{"task": ', "line 2: not a JSON object"),
    ('{"id": "x"}\n', 'line 1: "task" must be a text'),
    ('{"id": "x", "task": "a"}\n\n{"id": "x", "task": "b"}\n', "line 3: the id 'x' is also line 1's"),
    ('{"task": "a", "check": 5}\n', '"check" must be a command line'),
])
def test_a_task_file_that_cannot_be_read_names_its_line(text, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        read_tasks(text, "tasks.jsonl")


def test_ids_become_file_names_that_stay_in_the_folder_and_never_collide():
    tasks = read_tasks('{"id": "../../etc/x", "task": "a"}\n{"id": "A", "task": "b"}\n{"id": "a", "task": "c"}\n'
                       'plain text task\n', "tasks")
    names = [task.file for task in tasks]
    assert names[0].startswith("etc_x-") and "/" not in names[0]
    assert len({name.lower() for name in names}) == 4 and tasks[3].id == "4" and tasks[3].task == "plain text task"
    assert file_name("t-1.a_b") == "t-1.a_b"


@pytest.mark.parametrize("args, said", [
    (("--parallel", "2", "task"), "--parallel goes with --batch"),
    (("--batch", "f", "task"), "a task does not go with it"),
    (("--batch", "f", "--approve"), "nobody is there to ask"),
    (("--batch", "f", "--shard", "4/4"), "must be I/N with 0 <= I < N"),
    (("--batch", "f", "--pass-rate", "2"), "must be a share from 0 to 1"),
])
def test_batch_flags_are_checked(cli, args, said):
    code, _, err = cli(*args)
    assert code == 2 and said in err


def test_pass_rate_sets_the_share_that_counts_as_a_pass(tmp_path, cli, serve):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"] * 3 + ["fail"])
    serve([], screen=ByTask())
    assert cli("--batch", tasks, "--pass-rate", "75%", "-q")[0] == 0
    assert cli("--batch", tasks, "--pass-rate", "0.8", "-q")[0] == 1
    assert cli("--batch", tasks, "-q")[0] == 1


@pytest.mark.processes
def test_a_batch_from_python_gives_its_summary_and_goes_on_where_it_stopped(tmp_path, serve):
    from agent_demo_kit.batch import run_batch
    server = serve([], screen=ByTask())
    tasks = ["[finish] one", {"id": "two", "task": "[fail] two"}, {"task": "[wrong] three", "expected": "5"}]
    check = f'test -z "$AGENT_EXPECTED" || {CHECK}'
    summary = run_batch(tasks, tmp_path / "out", parallel=2, check=check, check_attempts=1)
    assert summary["status_counts"] == {"failed": 2, "finished": 1} and summary["tasks"] == 3
    assert [line["id"] for line in results(tmp_path / "out")] == ["1", "two", "3"]
    sent = len(server.requests)
    assert run_batch(tasks, tmp_path / "out", check=check)["status_counts"] == summary["status_counts"]
    assert len(server.requests) == sent


@pytest.mark.processes
def test_a_second_ctrl_c_stops_at_once_and_sigterm_ends_like_the_first(tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["long"] * 4)
    out = tmp_path / "out"
    script = ByTask(delay=2)  # far longer than the 0.2 s between the two Ctrl-Cs, on a busy machine too
    with ScriptedServer([], screen=script) as server:
        env = {"LLM_API_URL": server.url, "LLM_API_KEY": KEY}
        args = ("--batch", tasks, "--out", out, "--parallel", 2, "--max-rounds", 10)
        process = started_batch(server, args, env, 2)
        process.send_signal(signal.SIGINT)
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 130, err
        assert "stopped at once" in err
        assert err.splitlines()[-1].startswith(f"agent-demo: to go on: agent-demo --batch {tasks}"), err
        assert any('"event": "end"' not in trace.read_text() for trace in (out / "traces").iterdir()), \
            "a task whose request was in flight is cut short: no end record"
        script.delay = 0.2
        process = started_batch(server, args, env, len(server.requests) + 2)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 143, err
        script.delay = 0
        code, _, err = run_cli(*args, env=env, timeout=90)
    assert code == 0, err
    assert [line["status"] for line in results(out)] == ["finished"] * 4


def test_a_local_servers_window_is_asked_once_a_batch(tmp_path, cli, monkeypatch):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"] * 6)
    with ScriptedServer([], screen=ByTask(), window=32_000) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, _, err = cli("--batch", tasks, "--parallel", 1, "-q")
        assert (code, server.gets) == (0, 1), err


@pytest.mark.processes
def test_ctrl_c_stops_a_running_check_and_leaves_none_behind(tmp_path):
    import subprocess
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"] * 2)
    marker = f"agent-demo-test-{os.getpid()}"
    with ScriptedServer([], screen=ByTask()) as server:
        env = {"LLM_API_URL": server.url, "LLM_API_KEY": KEY}
        process = started_batch(server, ("--batch", tasks, "--parallel", 2, "--check", f"sleep 30; echo {marker}"),
                                env, 4)
        time.sleep(0.3)  # the checks are running
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)  # had it waited for the checks, they sleep 30 s
    assert process.returncode == 130, err
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert left == "", "no check left running"
    assert [line["status"] for line in results(tmp_path / "tasks-results" / "gpt-4o-mini")] == ["interrupted"] * 2


def test_a_refused_key_or_a_dead_endpoint_costs_no_retry_and_the_same_command_goes_on(tmp_path, cli, monkeypatch):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"] * 3)
    monkeypatch.setenv("LLM_API_KEY", KEY)
    with ScriptedServer([{"status": 401, "body": {"error": {"message": "bad key"}}}]) as refusing:
        monkeypatch.setenv("LLM_API_URL", refusing.url)
        assert cli("--batch", tasks, "--parallel", 1, "-q")[0] == 3
    # The same endpoint, now down: its server has stopped (another port would be another configuration),
    # and no connection to it is kept open.
    from agent_demo_kit.client import shared_connections
    shared_connections().close()
    monkeypatch.setenv("AGENT_RETRIES", "0")
    code, out, err = cli("--batch", tasks, "--parallel", 1, "--json")
    assert code == 3 and err.count("no more tasks start") == 1, err
    assert json.loads(out)["status_counts"] == {"error": 3}, "the table counts what results.jsonl holds"
    said = [line for line in err.splitlines() if "cannot reach" in line]
    assert len([line for line in said if line.startswith("[")]) == 3, "three tasks without a connection, each a line"
    assert len([line for line in said if "no more tasks start" in line]) == 1, "then a stop said once"
    with ScriptedServer([], screen=ByTask(), port=int(refusing.url.split(":")[2].split("/")[0])):  # up again
        code, out, err = cli("--batch", tasks, "--json", "--retry-errors", 0)
    assert (code, json.loads(out)["status_counts"]) == (0, {"finished": 3}), err


def test_summary_takes_its_folders_after_other_flags_and_counts_each_once(tmp_path, cli, serve):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish", "fail"])
    serve([], screen=ByTask())
    cli("--batch", tasks, "--out", tmp_path / "r", "-q")
    for args in (("--summary", "--json", tmp_path / "r"), ("--summary", tmp_path / "r", f"{tmp_path}/r/", "--json")):
        code, out, _ = cli(*args)
        assert code == 0 and json.loads(out)["tasks"] == 2, args


def test_a_task_whose_text_changed_or_whose_trace_is_gone_runs_again(tmp_path, cli, serve):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "task": "[finish] one"}\n{"id": "b", "task": "[fail] two"}\n'
                    '{"id": "c", "task": "[finish] three"}\n')
    server = serve([], screen=ByTask())
    cli("--batch", path, "-q")
    path.write_text('\ufeff{"id": "a", "task": "[finish] one"}\n{"id": "b", "task": "[finish] two, now"}\n'
                    '{"id": "c", "task": "[finish] three"}\n')
    (tmp_path / "tasks-results" / "gpt-4o-mini" / "traces" / "c.jsonl").unlink()
    server.requests.clear()
    code, out, err = cli("--batch", path, "--json")
    assert code == 0 and json.loads(out)["status_counts"] == {"finished": 3}, err
    assert "1 task(s) say something else than when they last ran (b): they start again" in err
    asked = {request["body"]["messages"][1]["content"] for request in server.requests}
    assert asked == {"Task: [finish] two, now", "Task: [finish] three"}, "a with its BOM is the same task"
    path.write_text('{"id": "a", "task": "[finish] one"}\n')
    cli("--batch", path, "-q")
    assert [line["id"] for line in results(tmp_path / "tasks-results" / "gpt-4o-mini")] == ["a"], "no line of a task gone from the file"


def test_an_out_that_cannot_be_a_folder_is_a_usage_error(tmp_path, cli, serve):
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"])
    (tmp_path / "afile").write_text("")
    serve([], screen=ByTask())
    code, _, err = cli("--batch", tasks, "--out", tmp_path / "afile")
    assert code == 2 and "cannot make the output folder there" in err


@pytest.mark.parametrize("group", [False, True])
def test_group_readable_lets_the_folders_group_read_and_never_write(tmp_path, cli, serve, group):
    serve([], screen=ByTask())
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish", "fail"])
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    (out / "notes.txt").write_text("mine")  # not the batch's: left as it is
    (out / "notes.txt").chmod(0o600)
    (out / "private").mkdir(mode=0o700)  # nor a folder of the user's in it
    assert cli("--batch", tasks, "--out", out, "-q", *(["--group-readable"] if group else []))[0] == 1
    modes = {path.relative_to(out).as_posix(): oct(path.stat().st_mode & 0o777)
             for path in [out, *out.rglob("*")] if path.name not in ("notes.txt", "private")}
    folders = {name: mode for name, mode in modes.items() if name in (".", "traces")}
    files = {name: mode for name, mode in modes.items() if name not in folders}
    assert set(files) >= {"results.jsonl", "summary.json", "report.html", "traces/t0.jsonl", "traces/t1.jsonl"}
    assert set(folders.values()) == {"0o750" if group else "0o700"}
    assert set(files.values()) == {"0o640" if group else "0o600"}, files
    assert (out / "notes.txt").stat().st_mode & 0o777 == 0o600 and (out / "private").stat().st_mode & 0o777 == 0o700
    assert cli("--batch", tasks, "--out", out, "-q")[0] == 1, "the folder is still one a batch takes up"


@pytest.mark.parametrize("answer, key, said", [
    ({"status": 500, "body": "Internal Server Error"}, None,
     "HTTP 500 to every request without a key (its list of models too): a proxy that wants one (LiteLLM's, with"
     " a master_key) answers so; set LLM_API_KEY"),
    ({"status": 400, "body": {"error": {"message": "No connected db.", "type": "no_db_connection", "code": "400"}}},
     "sk-wrong-but-long-enough-123", "the proxy has no database to check keys against (HTTP 400: No connected db.):"
     " give LLM_API_KEY its master key, or connect its database"),
], ids=["500 without a key", "400 no database"])
def test_a_proxy_that_is_not_set_up_for_the_requests_stops_the_batch_once(tmp_path, cli, serve, monkeypatch, answer,
                                                                          key, said):
    server = serve([], screen=lambda body: answer, key=key)
    server.get_answer = answer  # a proxy that wants a key fails its list of models too
    monkeypatch.setenv("AGENT_RETRIES", "1")
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"] * 12)
    code, out, err = cli("--batch", tasks, "--parallel", 1)
    assert code == 3
    assert f"the endpoint is not set up for these requests ({said}" in err
    asked = {request["body"]["messages"][1]["content"] for request in server.requests}
    assert len(asked) == 1, "the first task told it all: no other started"


def test_a_keyless_server_that_crashed_on_one_prompt_is_no_set_up_problem(tmp_path, cli, serve, monkeypatch):
    def screen(body):
        crash = "task 0" in body["messages"][1]["content"]
        return {"status": 500, "body": "Internal Server Error"} if crash else {"content": action("finish", result="5")}
    serve([], screen=screen, key=None)  # its list of models answers (a 404 here): only that prompt fails
    monkeypatch.setenv("AGENT_RETRIES", "0")
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["finish"] * 4)
    code, out, err = cli("--batch", tasks, "--parallel", 1)
    assert code == 1 and "not set up" not in err
    assert [line["status"] for line in results(tmp_path / "tasks-results" / "gpt-4o-mini")] == \
        ["error", "finished", "finished", "finished"]
