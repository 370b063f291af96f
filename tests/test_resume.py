"""--resume: continue an unfinished run from its trace, with nothing lost or repeated."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent_demo_kit.cli import main
from agent_demo_kit.settings import Settings
from agent_demo_kit.trace_file import TraceFile
from scripted_model import run
from scripted_model import ScriptedModel
from conftest import answer_on_a_terminal, child_environment, run_cli, start_cli
from scripted_server import ScriptedServer, action as act
from agent_demo_kit.tools import REGISTRY, describe, tool

ROOT = Path(__file__).resolve().parent.parent


def records(trace):
    """The whole records of a trace file, skipping a line torn by a crash."""
    whole = []
    for line in Path(trace).read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            whole.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return whole


def round_numbers(trace):
    return [r["round"] for r in records(trace) if r["event"] == "round"]


def interrupted_run(trace, replies, stop_at, max_rounds=6):
    """Run in-process until request number stop_at raises Ctrl-C; return what each request carried."""
    model = ScriptedModel(*replies[:stop_at - 1], KeyboardInterrupt(), usage={"total_tokens": 15})
    log = TraceFile(str(trace))
    outcome = run("add things up", Settings(max_rounds=max_rounds), model, log=log)
    log.close()
    assert outcome.status == "interrupted"
    return [request["messages"] for request in model.requests]


def test_resume_after_ctrl_c_sends_the_same_conversation_and_finishes(serve, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    sent = interrupted_run(trace, [act("calculator", expression="1 + 1"),
                                   act("calculator", expression="2 + 2")], stop_at=3)
    server = serve([act("finish", result=6)], key=None)
    assert main(["--resume", str(trace), "--quiet"]) == 0
    assert capsys.readouterr().out == "6\n"
    assert server.sent_messages(0) == sent[2], "the redone request carries the same conversation"
    assert round_numbers(trace) == [1, 2, 3]
    events = [r["event"] for r in records(trace)]
    assert events == ["start", "round", "round", "end", "resume", "round", "end"]
    assert records(trace)[-1]["status"] == "finished" and records(trace)[-1]["rounds"] == 3


def test_the_round_limit_and_token_budget_count_the_whole_run(serve, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    interrupted_run(trace, [act("calculator", expression="1 + 1"), act("calculator", expression="2 + 2")],
                    stop_at=3)
    server = serve([act("calculator", expression="3 + 3")], key=None)
    assert main(["--resume", str(trace), "--max-rounds", "3", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["rounds"], out["usage"]["total_tokens"]) == ("max_rounds", 3, 45)
    assert len(server.requests) == 1
    assert main(["--resume", str(trace), "--max-rounds", "9", "--max-tokens", "45", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "budget"
    assert len(server.requests) == 1


def test_a_resumed_run_remembers_earlier_calls(serve, tmp_path):
    trace = tmp_path / "run.jsonl"
    interrupted_run(trace, [act("calculator", expression="1 + 1")], stop_at=2)
    server = serve([act("calculator", expression="1 + 1"), act("finish", result=2)], key=None)
    assert main(["--resume", str(trace), "--quiet"]) == 0
    assert "already made this exact call in round 1" in server.sent_messages(1)[-1]["content"]


def test_a_torn_last_line_is_ignored_and_its_round_redone(serve, tmp_path):
    trace = tmp_path / "run.jsonl"
    interrupted_run(trace, [act("calculator", expression="1 + 1")], stop_at=2)
    lines = trace.read_text().splitlines()[:-1]  # drop the end record, as kill -9 would
    trace.write_text("\n".join(lines) + '\n{"event": "round", "round": 2, "model_out')
    serve([act("finish", result=2)], key=None)
    assert main(["--resume", str(trace), "--quiet"]) == 0
    assert round_numbers(trace) == [1, 2]
    assert [r["event"] for r in records(trace)][-3:] == ["resume", "round", "end"], "nothing glued to the torn line"
    assert records(trace)[-1]["status"] == "finished"


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the trace file"),
    ("hello\n", "is not an agent-demo trace"),
    ('{"event": "round", "round": 1}\n', "is not an agent-demo trace"),
    ('{"event": "start", "task": "t"}\n{"event": "end", "status": "finished"}\n', "already ended with status 'finished'"),
    ('{"event": "start", "task": "t"}\n{"event": "end", "status": "failed"}\n', "already ended with status 'failed'"),
])
def test_what_cannot_be_resumed_is_a_clear_error_with_exit_2(tmp_path, capsys, monkeypatch, content, message):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    trace = tmp_path / "run.jsonl"
    if content is not None:
        trace.write_text(content)
    assert main(["--resume", str(trace)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_resume_takes_no_task(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    (tmp_path / "run.jsonl").write_text('{"event": "start", "task": "t"}\n')
    assert main(["--resume", str(tmp_path / "run.jsonl"), "another task"]) == 2
    assert "give no task" in capsys.readouterr().err


@pytest.mark.processes
def test_kill_9_in_the_middle_of_a_request_then_resume_loses_and_repeats_nothing(tmp_path):
    trace = tmp_path / "run.jsonl"
    replies = [act("calculator", expression="1 + 1"), act("calculator", expression="2 + 2"),
               {"delay": 60, "content": act("calculator", expression="never answered")},
               act("calculator", expression="3 + 3"), act("finish", result=12)]
    with ScriptedServer(replies) as server:
        env = {"LLM_API_URL": server.url}
        process = start_cli("--trace", trace, "--max-rounds", "9", "add", env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while len(server.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        assert round_numbers(trace) == [1, 2] and records(trace)[-1]["event"] == "round"
        resumed = run_cli("--resume", trace, "--max-rounds", "9", "--quiet", env=env)
    assert resumed == (0, "12\n", "")
    assert server.sent_messages(3) == server.sent_messages(2), "the unfinished round is redone as it was"
    assert round_numbers(trace) == [1, 2, 3, 4]
    end = records(trace)[-1]
    assert (end["event"], end["status"], end["rounds"]) == ("end", "finished", 4)


def test_a_file_holding_several_runs_resumes_the_last_one(serve, tmp_path):
    trace = tmp_path / "run.jsonl"
    log = TraceFile(str(trace))
    run("first task", Settings(), ScriptedModel(act("finish", result=1)), log=log)
    log.close()
    interrupted_run(trace, [act("calculator", expression="1 + 1")], stop_at=2)
    server = serve([act("finish", result=2)], key=None)
    assert main(["--resume", str(trace), "--quiet"]) == 0
    assert server.sent_messages(0)[1]["content"] == "Task: add things up"
    assert [m["role"] for m in server.sent_messages(0)] == ["system", "user", "assistant", "user"]


def test_resume_keeps_the_runs_own_round_limit_and_token_budget(serve, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    assert interrupted_run(trace, [act("calculator", expression=f"{n} + 1") for n in range(9)], stop_at=4,
                           max_rounds=9)
    server = serve([act("calculator", expression=f"7 + {n}") for n in range(9)], key=None)
    assert main(["--resume", str(trace), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "max_rounds"
    assert len(server.requests) == 6, "rounds 4 to 9: the recorded limit of 9, not the default 6"
    start = records(trace)[0]
    assert start["max_rounds"] == 9 and "max_tokens" in start


def test_a_torn_line_cut_inside_a_character_is_skipped(serve, tmp_path):
    trace = tmp_path / "run.jsonl"
    interrupted_run(trace, [act("get_order_status", order_id="A1002")], stop_at=2)
    data = trace.read_bytes()
    round_line = data.split(b"\n")[1]
    cut = round_line.index("待".encode()) + 1
    trace.write_bytes(b"\n".join(data.split(b"\n")[:1]) + b"\n" + round_line[:cut])
    server = serve([act("finish", result="ok")], key=None)
    assert main(["--resume", str(trace), "--quiet"]) == 0
    assert round_numbers(trace) == [1]
    assert len(server.requests) == 1


def test_a_run_that_finished_but_lost_its_end_record_is_not_resumed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    trace = tmp_path / "run.jsonl"
    log = TraceFile(str(trace))
    run("t", Settings(), ScriptedModel(act("finish", result=1)), log=log)
    log.close()
    trace.write_text("\n".join(trace.read_text().splitlines()[:-1]) + "\n")
    assert main(["--resume", str(trace)]) == 2
    assert "already ended with status 'finished'" in capsys.readouterr().err


def test_resume_keeps_the_allowlist_approval_and_call_cap(serve, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    serve([act("calculator", expression="1 + 1")], key=None)
    assert main(["--tools", "calculator", "--approve", "--max-calls", "1", "--max-rounds", "1",
                 "--trace", str(trace), "--quiet", "hi"]) == 1
    server = serve([json.dumps([json.loads(act("get_order_status", order_id="A1002")),
                                json.loads(act("calculator", expression="2 + 2"))]), act("fail", reason="x")], key=None)
    assert main(["--resume", str(trace), "--max-rounds", "3", "--quiet"]) == 1
    fed = server.sent_messages(1)[-1]["content"]
    assert "unknown tool 'get_order_status'" in fed
    assert "not run: at most 1 calls per reply" in fed
    assert '"tool": "get_order_status"' not in json.dumps(server.requests[0]["body"]["messages"][0])
    first_run = [r for r in records(trace) if r["event"] == "round"][0]
    assert first_run["calls"][0]["result"]["cancelled"] is True, "no terminal under pytest: refused"


def test_a_fallback_to_json_holds_across_resumes(serve, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    serve([{"status": 400, "body": {"error": {"message": "tools are not supported"}}},
           act("calculator", expression="1 + 1")], key=None)
    assert main(["--mode", "tools", "--max-rounds", "1", "--trace", str(trace), "--quiet", "hi"]) == 1
    server = serve([act("finish", result=2)], key=None)
    assert main(["--resume", str(trace), "--max-rounds", "2", "--quiet"]) == 0
    assert len(server.requests) == 1 and "tools" not in server.requests[0]["body"]


def test_a_run_that_finished_after_an_earlier_interruption_is_not_resumed(serve, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    interrupted_run(trace, [act("calculator", expression="1 + 1")], stop_at=2)
    serve([act("finish", result=2)], key=None)
    assert main(["--resume", str(trace), "--quiet"]) == 0
    trace.write_text("\n".join(trace.read_text().splitlines()[:-1]) + "\n")  # lose the final end record
    assert main(["--resume", str(trace)]) == 2
    assert "already ended with status 'finished'" in capsys.readouterr().err


def test_a_resumed_tools_run_does_not_fall_back_on_a_later_400(serve, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    serve([{"tool_calls": [{"id": "a", "type": "function",
                            "function": {"name": "calculator", "arguments": '{"expression": "1 + 1"}'}}]}], key=None)
    assert main(["--mode", "tools", "--max-rounds", "1", "--trace", str(trace), "--quiet", "hi"]) == 1
    server = serve([{"status": 400, "body": {"error": {"message": "maximum context length exceeded"}}}], key=None)
    assert main(["--resume", str(trace), "--max-rounds", "3", "--quiet"]) == 3
    assert len(server.requests) == 1
    assert not [r for r in records(trace) if r["event"] == "fallback"]


def test_a_tool_taken_away_on_resume_is_unknown_even_if_called_before(serve, tmp_path):
    trace = tmp_path / "run.jsonl"
    interrupted_run(trace, [act("get_order_status", order_id="A1002")], stop_at=2)
    server = serve([act("get_order_status", order_id="A1002"), act("fail", reason="x")], key=None)
    assert main(["--resume", str(trace), "--tools", "calculator", "--quiet"]) == 1
    assert "unknown tool 'get_order_status'" in server.sent_messages(1)[-1]["content"]


# --- a damaged trace is refused, not trimmed ------------------------------------------------------

def damage(trace, how):
    """Damage the trace of a run cut short after 4 rounds: lines 1 start, 2-5 rounds 1-4, 6 end."""
    lines = trace.read_text().splitlines()
    second = json.loads(lines[2])
    if how == "round 2 deleted":
        del lines[2]
    elif how == "round a string":
        lines[2] = json.dumps({**second, "round": "2"})
    elif how == "feedback without content":
        del second["feedback"][0]["content"]
        lines[2] = json.dumps(second)
    elif how == "not JSON":
        lines[2] = lines[2][:40]
    elif how == "a call of another round":
        lines[2] = json.dumps({"event": "call", "round": 7, "tool": "calculator", "args": {}})
    elif how == "a compaction without a digest":
        lines[2] = json.dumps({"event": "compaction", "before_round": 2, "folded": 1})
    elif how == "a compaction out of place":
        lines[2] = json.dumps({"event": "compaction", "before_round": 9, "folded": 1, "digest": ""})
    elif how == "a follow-up after no round":
        lines[2] = json.dumps({"event": "follow_up", "text": "and?", "after_round": 5})
    elif how == "no event":
        lines[2] = json.dumps({"round": 2})
    trace.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("how, why", [
    ("round 2 deleted", "round 3 where round 2 was due"),
    ("round a string", "round '2' where round 2 was due"),
    ("feedback without content", "round 2 cannot be read by this version"),
    ("not JSON", "not a JSON record"),
    ("a call of another round", "a call of round 7 where round 2 was going"),
    ("a compaction without a digest", "a compaction this version cannot read"),
    ("a compaction out of place", "a compaction before round 9 after round 1"),
    ("a follow-up after no round", "a follow-up this version cannot read"),
    ("no event", "a record without an event"),
])
def test_a_damaged_line_before_the_last_refuses_the_trace_naming_the_line(serve, tmp_path, capsys, how, why):
    trace = tmp_path / "run.jsonl"
    interrupted_run(trace, [act("calculator", expression=f"{n} + 1") for n in range(4)], stop_at=5, max_rounds=9)
    damage(trace, how)
    server = serve([act("finish", result="ok")], key=None)
    assert main(["--resume", str(trace), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"agent-demo: error: {trace} line 3 is damaged ({why}); cannot resume: only a"
                                       " line torn by a crash at the end of the file is skipped\n")
    assert server.requests == []


def test_a_line_torn_by_a_crash_stays_harmless_after_the_run_went_on(serve, tmp_path):
    trace = tmp_path / "run.jsonl"
    interrupted_run(trace, [act("calculator", expression="1 + 1")], stop_at=2)
    lines = trace.read_text().splitlines()[:-1]  # drop the end record, as kill -9 would
    trace.write_text("\n".join(lines) + '\n{"event": "round", "round": 2, "model_out')
    serve([act("calculator", expression="2 + 2"), act("finish", result=4)], key=None)
    assert main(["--resume", str(trace), "--max-rounds", "2", "--quiet"]) == 1
    assert main(["--resume", str(trace), "--max-rounds", "3", "--quiet"]) == 0, "the torn line is now in the middle"
    assert round_numbers(trace) == [1, 2, 3]


# --- one resumer at a time -----------------------------------------------------------------------

MARKING_TOOLS = '''
import time
open("imported-" + str(time.time()), "w").close()
time.sleep(0.1)  # long enough for the other resume to reach the lock meanwhile


def shout(text: str) -> str:
    """Shout."""
    return text.upper()
'''


def test_a_resume_takes_the_lock_before_it_reads_the_trace_or_imports_its_tools(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    tools_file = tmp_path / "marking.py"
    tools_file.write_text(MARKING_TOOLS)
    trace = tmp_path / "run.jsonl"
    trace.write_text(json.dumps({"event": "start", "task": "t", "tools_files": [str(tools_file)]}) + "\n"
                     + json.dumps({"event": "end", "status": "finished"}) + "\n")
    holder = TraceFile(str(trace))  # another resumer, still going
    try:
        assert main(["--resume", str(trace)]) == 2
    finally:
        holder.close()
    assert "still going" in capsys.readouterr().err, "refused for the lock, before the trace was read"
    assert not list(tmp_path.glob("imported-*"))


@pytest.mark.processes
def test_two_resumes_at_once_run_the_rounds_once(serve, tmp_path, capsys):
    tools_file = tmp_path / "marking.py"
    tools_file.write_text(MARKING_TOOLS)
    trace = tmp_path / "run.jsonl"
    serve([act("shout", text="a"), act("shout", text="b"), act("finish", result="B"), act("finish", result="B")],
          key=None)
    assert main(["--tools-file", str(tools_file), "--trace", str(trace), "--max-rounds", "1", "--quiet", "x"]) == 1
    both = [start_cli("--resume", trace, "--tools-file", tools_file, "--max-rounds", "5", "--quiet")
            for _ in range(2)]  # at once
    for process in both:
        process.communicate(timeout=60)
    assert sorted(process.returncode for process in both) == [0, 2]
    assert round_numbers(trace) == [1, 2, 3]


# --- calls with side effects are written ahead ---------------------------------------------------

SIDE_EFFECTS = '''
import os
import signal

from agent_demo_kit.tools import tool


@tool(side_effects=True)
def append_line(n: int) -> str:
    """Append n to effects.txt."""
    with open("effects.txt", "a") as effects:
        effects.write(f"{n}\\n")
    if str(n) in os.environ.get("KILL_AFTER", "").split(",") and not os.path.exists(f"killed-{n}"):
        open(f"killed-{n}", "w").close()
        os.kill(os.getppid(), signal.SIGKILL)  # agent-demo dies right after the side effect
    return f"appended {n}"
'''


def test_a_call_with_side_effects_is_recorded_before_it_runs(tmp_path):
    trace = tmp_path / "run.jsonl"

    @tool(side_effects=True)
    def send(text: str) -> list:
        """Send a text."""
        return [r["event"] for r in records(trace)]
    log = TraceFile(str(trace))
    model = ScriptedModel(act("send", text="hi"), act("calculator", expression="1 + 1"), act("finish", result=2))
    settings = Settings(yes=True)
    outcome = run("t", settings, model, registry={**REGISTRY, "send": describe(send)}, log=log)
    log.close()
    assert outcome.calls[0]["result"]["data"] == ["start", "call"], "the call was on record when it ran"
    assert [(r["event"], r.get("tool")) for r in records(trace)] == [
        ("start", None), ("call", "send"), ("round", None), ("round", None), ("round", None), ("end", None)]


@pytest.mark.processes
def test_kill_9_right_after_a_side_effect_then_resume_never_repeats_it_unannounced(tmp_path):
    tools_file = tmp_path / "effects.py"
    tools_file.write_text(SIDE_EFFECTS)
    trace = tmp_path / "run.jsonl"
    killed = [1, 3]  # at the first call, and after a call that went well
    replies = [reply for n in range(1, 4) for reply in [act("append_line", n=n)] * (2 if n in killed else 1)]
    with ScriptedServer(replies + [act("finish", result="done")]) as server:
        env = {"LLM_API_URL": server.url, "KILL_AFTER": ",".join(map(str, killed))}
        code = run_cli("--tools-file", tools_file, "--trace", trace, "--yes", "--max-rounds", "20", "--quiet", "go",
                       env=env)[0]
        runs = 1
        while code == -signal.SIGKILL and runs <= len(killed):
            code, out, err = run_cli("--resume", trace, "--tools-file", tools_file, "--yes", "--quiet", env=env)
            runs += 1
    assert (code, runs) == (0, 1 + len(killed))
    assert (tmp_path / "effects.txt").read_text().split() == ["1", "2", "3"]
    told = [call["args"]["n"] for r in records(trace) if r["event"] == "round" for call in r["calls"]
            if call["result"].get("error", "").startswith("outcome unknown")]
    assert told == killed, "the model was told the outcome is unknown, each time"
    notes = [r["text"] for r in records(trace) if r["event"] == "note"]
    assert [note for note in notes if "may have happened: in round" in note] == [
        f'append_line {{"n": {n}}} started in round {round_} before the run was cut short and may have happened:'
        f" in round {round_}, no call of append_line runs unless you approve it" for n, round_ in ((1, 1), (3, 3))]
    assert [note for note in notes if "was not run" in note] == [
        f'append_line {{"n": {n}}} was not run: a call of append_line may have happened before the run was cut short'
        " (--yes does not approve that)" for n in killed], "and the user too"


@pytest.mark.processes
def test_a_reworded_call_after_kill_9_is_not_run_and_the_model_is_told_what_may_have_happened(tmp_path):
    tools_file = tmp_path / "effects.py"
    tools_file.write_text(SIDE_EFFECTS)
    trace = tmp_path / "run.jsonl"
    replies = [act("append_line", n=1), act("append_line", n=11), act("append_line", n=2), act("finish", result="done")]
    with ScriptedServer(replies) as server:
        env = {"LLM_API_URL": server.url, "KILL_AFTER": "1"}
        assert run_cli("--tools-file", tools_file, "--trace", trace, "--yes", "--quiet", "go", env=env)[0] \
            == -signal.SIGKILL
        code, out, err = run_cli("--resume", trace, "--tools-file", tools_file, "--yes", env=env)
        redone = server.sent_messages(1)
    assert (code, out.splitlines()[-1]) == (0, "done")
    assert (tmp_path / "effects.txt").read_text().split() == ["1", "2"], "11, the same call reworded, did not run"
    assert 'These calls were started before that and may already have happened; their results are unknown:' \
           ' append_line {"n": 1}.' in redone[1]["content"], "the model is told before it redoes the round"
    assert 'append_line {"n": 11} was not run: a call of append_line may have happened' in err


@pytest.mark.processes
@pytest.mark.parametrize("again", [1, 11], ids=["the same call", "a reworded call"])
def test_under_approve_the_user_decides_whether_a_call_that_may_have_run_runs_again(tmp_path, again):
    tools_file = tmp_path / "effects.py"
    tools_file.write_text(SIDE_EFFECTS)
    trace = tmp_path / "run.jsonl"
    with ScriptedServer([act("append_line", n=1), act("append_line", n=again), act("finish", result="done")]) as server:
        env = {**child_environment(), "LLM_API_URL": server.url, "KILL_AFTER": "1"}
        code = run_cli("--tools-file", tools_file, "--trace", trace, "--yes", "--quiet", "go", env=env)[0]
        assert code == -signal.SIGKILL
        shown, out, err, code = answer_on_a_terminal(["--resume", str(trace), "--tools-file", str(tools_file),
                                                      "--approve", "--quiet"], env, tmp_path)
    assert f'approve append_line {{"n": {again}}} again (it may have run before the run was cut short)? [y/N/a]' \
        .encode() in shown
    assert code == 0
    assert (tmp_path / "effects.txt").read_text().split() == ["1", str(again)], "the user said yes"


@pytest.mark.processes
def test_a_resume_that_ends_before_a_round_keeps_what_may_have_happened_for_the_next(tmp_path):
    tools_file = tmp_path / "effects.py"
    tools_file.write_text(SIDE_EFFECTS)
    trace = tmp_path / "run.jsonl"
    refused = {"status": 401, "body": {"error": {"message": "invalid key"}}}
    replies = [act("append_line", n=1), refused, act("append_line", n=11), act("finish", result="done")]
    with ScriptedServer(replies) as server:
        env = {"LLM_API_URL": server.url, "KILL_AFTER": "1"}
        assert run_cli("--tools-file", tools_file, "--trace", trace, "--yes", "go", env=env)[0] == -signal.SIGKILL
        assert run_cli("--resume", trace, "--tools-file", tools_file, "--yes", env=env)[0] == 3  # in round 1 still
        code, out, err = run_cli("--resume", trace, "--tools-file", tools_file, "--yes", env=env)
        told = server.sent_messages(2)[1]["content"]
    assert (code, out.splitlines()[-1]) == (0, "done")
    assert (tmp_path / "effects.txt").read_text().split() == ["1"], "11, after two resumes, did not run"
    assert 'may already have happened; their results are unknown: append_line {"n": 1}' in told
