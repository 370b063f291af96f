"""The run log from a shell: --runs, naming a run, what --json says about it, --continue."""
import json
import time
from pathlib import Path

import pytest

from agent_demo import main
from conftest import run_cli, start_cli
from scripted_server import action as act

FINISH = act("finish", result="done")


def run_folder(tmp_path):
    """The run log folder of this test (under the state home conftest sets)."""
    return tmp_path / "state" / "agent-demo" / "runs"


def write_runs(folder, count, status="finished", task="compute something"):
    """count recorded runs, one a minute, the newest last; their paths, oldest first."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in range(count):
        started = time.time() - 60 * (count - n)
        path = folder / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}-{n:06x}.jsonl"
        path.write_text("\n".join(json.dumps(record) for record in [
            {"event": "start", "task": f"{task} {n}", "ts": started},
            {"event": "end", "status": status, "rounds": 1, "usage": {"total_tokens": 15}}]) + "\n")
        paths.append(path)
    return paths


# --- output closed early --------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--runs", "--help", "--version"])
def test_a_reader_that_goes_away_at_once_costs_no_traceback(tmp_path, flag):
    write_runs(run_folder(tmp_path), 30)
    process = start_cli(flag)
    process.stdout.close()  # before the child has written a line: its writes meet a closed pipe
    err = process.stderr.read()
    process.wait(timeout=30)
    assert (process.returncode, err) == (0, "")


def test_runs_into_head_gives_the_first_line_and_no_traceback(tmp_path):
    write_runs(run_folder(tmp_path), 30)
    for _ in range(3):
        process = start_cli("--runs", shell_tail="| head -1")
        out, err = process.communicate(timeout=30)
        assert (len(out.splitlines()), err) == (1, "")


# --- naming a run -----------------------------------------------------------------------------

def newest_run(tmp_path):
    return max(run_folder(tmp_path).glob("*.jsonl"), key=lambda path: path.stat().st_mtime)


@pytest.mark.parametrize("form", ["id", "start of the id", "short id", "file name"])
def test_resume_takes_a_run_by_its_id_the_start_of_it_or_its_file_name(serve, tmp_path, capsys, form):
    write_runs(run_folder(tmp_path), 3, status="interrupted")  # older runs beside it
    server = serve([act("calculator", expression="1 + 1"), FINISH])
    assert main(["--max-rounds", "1", "--quiet", "hi"]) == 1
    run_id = newest_run(tmp_path).stem
    name = {"id": run_id, "start of the id": run_id[:15], "short id": run_id[16:],
            "file name": run_id + ".jsonl"}[form]
    capsys.readouterr()
    assert main(["--resume", name, "--max-rounds", "2", "--quiet"]) == 0
    assert capsys.readouterr().out == "done\n"
    assert server.sent_messages(1)[1]["content"] == "Task: hi"


def test_resume_by_an_id_that_fits_several_runs_lists_them_with_exit_2(tmp_path):
    paths = write_runs(run_folder(tmp_path), 3, status="interrupted")
    code, out, err = run_cli("--resume", paths[0].stem[:4])
    assert code == 2 and "3 runs match" in err and all(path.stem in err for path in paths)


def test_resume_by_an_id_that_fits_no_run_says_where_it_looked_with_exit_2(tmp_path):
    write_runs(run_folder(tmp_path), 2, status="interrupted")
    code, out, err = run_cli("--resume", "ffffff0")
    assert code == 2 and f"no run ffffff0 in {run_folder(tmp_path)}" in err and "Traceback" not in err


# --- the --runs table ---------------------------------------------------------------------------

def test_runs_fits_80_columns_and_its_ids_resume_the_runs(serve, tmp_path, capsys):
    write_runs(run_folder(tmp_path), 3, task="a task with many words " * 10)
    serve([act("calculator", expression="1 + 1"), FINISH])
    assert main(["--max-rounds", "1", "--quiet", "the newest task, cut short by its round limit"]) == 1
    capsys.readouterr()
    assert main(["--runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "when", "status", "rounds", "tokens", "task"]
    assert len(lines) == 7 and lines[-2] == f"runs in {run_folder(tmp_path)}"
    assert all(len(line) <= 80 for line in lines[:-2] + lines[-1:]) and ".jsonl" not in "\n".join(lines)
    newest = lines[1].split()
    assert newest[0] == newest_run(tmp_path).stem[16:] and newest[3:6] == ["max_rounds", "1", "15"]
    assert lines[2].endswith("…")
    assert main(["--resume", newest[0], "--max-rounds", "2", "--quiet"]) == 0
    assert capsys.readouterr().out == "done\n"


# --- no "to continue" where continuing cannot help ---------------------------------------------

def continue_hints(err):
    return [line for line in err.splitlines() if line.startswith("agent-demo: to continue:")]


@pytest.mark.parametrize("why, flags, reply, code", [
    ("configuration", ["--max-context", "100"], FINISH, 2),
    ("key refused", [], {"status": 401, "body": {"error": {"message": "invalid api key"}}}, 3),
    ("key forbidden", [], {"status": 403, "body": {"error": {"message": "no access"}}}, 3),
])
def test_a_run_stopped_before_its_first_round_offers_no_resume_and_is_not_picked(serve, capsys, why, flags,
                                                                                 reply, code):
    serve([act("calculator", expression="1 + 1")])
    assert main(["--max-rounds", "1", "older task"]) == 1
    assert continue_hints(capsys.readouterr().err), "a run cut short by its round limit is offered"
    time.sleep(0.02)  # the next run is the newest by its last write
    serve([reply])
    assert main([*flags, "newer task"]) == code
    assert continue_hints(capsys.readouterr().err) == []
    server = serve([FINISH])
    assert main(["--resume", "--max-rounds", "2", "--quiet"]) == 0
    assert server.sent_messages(0)[1]["content"] == "Task: older task", "bare --resume skips the newer run"


def test_a_refused_key_after_some_rounds_offers_no_command_but_resume_takes_the_run_up(serve, capsys):
    serve([act("calculator", expression="1 + 1"), {"status": 401, "body": {"error": {"message": "key revoked"}}}])
    assert main(["hi"]) == 3
    err = capsys.readouterr().err
    assert "authentication failed" in err and continue_hints(err) == []
    server = serve([FINISH])
    assert main(["--resume", "--quiet"]) == 0, "once the key is fixed, the run goes on"
    assert len(server.sent_messages(0)) == 4


# --- --json names the run -------------------------------------------------------------------------

def test_json_names_the_run_and_its_trace_file_and_null_without_a_record(serve, tmp_path, capsys):
    serve([FINISH, FINISH, FINISH])
    assert main(["--json", "hi"]) == 0
    out = json.loads(capsys.readouterr().out)
    trace = newest_run(tmp_path)
    assert (out["run_id"], out["trace"]) == (trace.stem, str(trace))
    assert main(["--json", "--trace", "mine.jsonl", "hi"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["run_id"], out["trace"]) == ("mine", str(tmp_path / "mine.jsonl"))
    assert main(["--json", "--no-log", "hi"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "finished" and (out["run_id"], out["trace"]) == (None, None)
