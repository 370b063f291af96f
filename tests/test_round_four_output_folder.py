"""Issue 42, finding 2: a batch's output folder inside a folder others can write. Whoever can write a
folder above it can swap the folder, or a trace in it, for their own mid-batch; so every folder above
it is checked as the run log's are, before anything is made or sent, a results file is never read
through a link or from a FIFO, and a trace that ended elsewhere since the plan counts only with its seal."""
import json
import os

import pytest

from conftest import KEY
from scripted_server import ScriptedServer, action

NOBODY = 65534


def tasks_in(folder, *ids):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": ident, "task": f"compute {n}", "expected": str(n)}) + "\n"
                            for n, ident in enumerate(ids, 1)))
    return path


@pytest.fixture
def server(monkeypatch):
    with ScriptedServer([], screen=lambda body: action("finish", result="1")) as scripted:
        monkeypatch.setenv("LLM_API_URL", scripted.url)
        monkeypatch.setenv("LLM_API_KEY", KEY)
        yield scripted


@pytest.mark.parametrize("made_by_a_co_user", [
    "a results folder writable by everyone", "a results folder of another user", "a results folder setgid to a group"
    " that can write it", "a team folder its group can write"])
def test_an_output_folder_inside_a_folder_others_can_write_is_refused_before_anything_is_sent(
        tmp_path, cli, server, made_by_a_co_user):
    team = tmp_path / "team"
    tasks = tasks_in(team, "q1")
    results = team / "tasks-results"
    results.mkdir()
    if made_by_a_co_user == "a results folder writable by everyone":
        results.chmod(0o777)
    elif made_by_a_co_user == "a results folder of another user":
        os.chown(results, NOBODY, NOBODY)
    elif made_by_a_co_user.startswith("a results folder setgid"):
        results.chmod(0o2775)
    else:
        team.chmod(0o775)
    code, out, err = cli("--batch", tasks)
    assert (code, len(server.requests)) == (2, 0), err
    assert "the output folder" in err and ("writable by" in err or "belongs to" in err)
    assert not (results / "gpt-4o-mini" / "results.jsonl").exists()


def test_an_output_folder_under_a_sticky_folder_everyone_writes_is_yours_to_use(tmp_path, cli, server):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp is: nobody can rename what is not theirs
    tasks = tasks_in(tmp_path, "q1")
    code, out, err = cli("--batch", tasks, "--out", shared / "mine")
    assert code == 0, err


def test_a_trace_that_ended_since_the_plan_without_your_seal_is_not_counted(tmp_path, cli, server):
    tasks = tasks_in(tmp_path, "a", "b")
    folder = tmp_path / "tasks-results" / "gpt-4o-mini"
    cli("--batch", tasks)
    # b left unfinished (as after kill -9: its end record never written) and a to run again.
    trace_b = folder / "traces" / "b.jsonl"
    records = trace_b.read_text().splitlines()
    trace_b.write_text("\n".join(records[:-1]) + "\n")
    (folder / "traces" / "a.jsonl").unlink()
    (folder / "results.jsonl").write_text("")
    forged = [json.loads(line) for line in records]
    for record in forged:
        record.pop("seal", None)
    forged[-1].update(status="finished", result="2")

    def swap_while_a_runs(body):  # whoever could write the folder puts b's "end" in place meanwhile
        trace_b.write_text("".join(json.dumps(record) + "\n" for record in forged))
        return action("finish", result="1")
    server.screen = swap_while_a_runs
    code, out, err = cli("--batch", tasks, "--json")
    lines = {json.loads(line)["id"]: json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()}
    assert lines["b"]["status"] != "finished" and lines["b"]["correct"] is not True, err
    assert "without your seal" in lines["b"]["error"]
    assert json.loads(out)["correct"] == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_a_fifo_in_place_of_the_results_file_at_the_end_stops_with_a_line_not_a_hang(tmp_path, monkeypatch):
    from agent_demo_kit.batch_folder import put_results_in_order
    from agent_demo_kit.endings import ConfigError
    os.mkfifo(tmp_path / "results.jsonl")
    with pytest.raises(ConfigError, match="not a plain file"):
        put_results_in_order(tmp_path / "results.jsonl", [])


def test_two_local_servers_on_one_host_are_two_configurations_and_a_folder_of_the_other_is_refused(
        tmp_path, cli, monkeypatch):
    tasks = tasks_in(tmp_path, "q1", "q2")
    with ScriptedServer([], screen=lambda body: action("finish", result="1")) as first, \
            ScriptedServer([], screen=lambda body: action("finish", result="1")) as second:
        monkeypatch.setenv("LLM_API_URL", first.url)
        cli("--batch", tasks, "-m", "local")
        monkeypatch.setenv("LLM_API_URL", second.url)
        code, out, err = cli("--batch", tasks, "-m", "local")
    assert (code, len(second.requests)) == (2, 0), err
    assert "another configuration" in err and f"127.0.0.1:{second.url.split(':')[2].split('/')[0]}" in err
    config = json.loads((tmp_path / "tasks-results" / "local" / "results.jsonl").read_text().splitlines()[0])["config"]
    assert config["endpoint"] == first.url.rstrip("/")
