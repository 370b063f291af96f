"""Working notes that survive every fold, and --check: a command that must accept the answer."""
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agent_demo_kit import prompts
from agent_demo_kit.cli import main
from agent_demo_kit.checks import run_check
from agent_demo_kit.settings import Settings
from agent_demo_kit.trace_file import TraceFile
from agent_demo_kit.screen_trace import ScreenTrace
from agent_demo_kit.terminal import Screen
from benchmark import prefix_figures
from conftest import KEY, said_lines, start_cli
from scripted_model import ScriptedModel, run
from scripted_server import action as act

NOTE = "Order A1002 is awaiting payment; 512 * 3 = 1536 is still to report."


def records(trace):
    return [json.loads(line) for line in trace.read_text().splitlines() if line.startswith("{")]


# --- notes ---------------------------------------------------------------------------------

def adding(rounds, note_in_round=None):
    """A long run of distinct sums, a note in one round if asked, then finish."""
    replies = [act("calculator", expression=f"{n} + 1") for n in range(rounds - 1)]
    if note_in_round:
        replies[note_in_round - 1] = act("note", text=NOTE)
    return replies + [act("finish", result="done")]


@pytest.mark.processes
def test_a_note_from_round_2_is_in_every_later_request_through_300_rounds_a_kill_9_and_resume(serve, tmp_path):
    """300 rounds at --max-context 8000: in-process up to a Ctrl-C in round 251, the command line resuming
    it up to a kill -9 in round 261, then --resume to the end."""
    without = ScriptedModel(*adding(300))
    assert run("keep adding", Settings(max_rounds=300, max_context=8000), without).status == "finished"
    replies, trace = adding(300, note_in_round=2), tmp_path / "run.jsonl"
    first, log = ScriptedModel(*replies[:250], KeyboardInterrupt()), TraceFile(str(trace))
    assert run("keep adding", Settings(max_rounds=300, max_context=8000), first, log=log).status == "interrupted"
    log.close()
    server = serve(replies[250:260] + [{"delay": 60, "content": "never answered"}] + replies[260:], key=None)
    process = start_cli("--resume", trace, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(server.requests) <= 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    assert main(["--resume", str(trace), "--quiet"]) == 0
    sent = [request["body"] for request in server.requests]
    assert sent[0]["messages"] == first.requests[-1]["messages"], "after Ctrl-C, the same request again"
    assert json.dumps(sent[11]) == json.dumps(sent[10]), "after kill -9, the same request again"
    bodies = first.requests[:250] + sent[:10] + sent[11:]
    assert len(bodies) == 300 and max(len(json.dumps(body)) for body in bodies) <= 8000
    pinned = []
    for body in bodies[2:]:  # the requests of rounds 3 to 300
        assert any(NOTE in message["content"] for message in body["messages"])
        task_message = body["messages"][1]["content"]
        if pinned or NOTE in task_message:
            pinned.append(task_message[task_message.index("\n\n" + prompts.NOTES_HEADER):])
    folds = sum(1 for record in records(trace) if record["event"] == "compaction")
    assert folds >= 10 and len(pinned) > 250, "pinned after the first folds, through many more"
    assert set(pinned) == {pinned[0]} and NOTE in pinned[0], "byte-identical in every request"
    with_note, without_note = prefix_figures(bodies)["reuse"], prefix_figures(without.requests)["reuse"]
    assert abs(with_note - without_note) <= 0.01, (with_note, without_note)


def test_notes_past_their_limit_drop_the_oldest_which_recall_still_reaches(tmp_path):
    notes = [f"note {n}: " + "x" * 800 for n in range(3)]
    prose = "Thinking aloud about the plan. " * 80  # kept verbatim, so the context fills up in a few rounds
    replies = [act("note", text=text) for text in notes]
    replies += [prose + act("calculator", expression=f"{n} + 1") for n in range(20)]
    replies += [act("recall", first_round=1), act("finish", result="done")]
    model = ScriptedModel(*replies)
    assert run("keep adding", Settings(max_rounds=30, max_context=24_000), model).status == "finished"
    told = model.messages(3)[-1]["content"]
    assert "notes are full" in told and "round 1" in told and "recall" in told
    task_message = model.messages(-1)[1]["content"]
    assert notes[1] in task_message and notes[2] in task_message, "the newest notes stay pinned"
    assert notes[0] not in task_message
    assert notes[0] in model.messages(-1)[-1]["content"], "recall gives the dropped note back"
    assert max(len(json.dumps(request)) for request in model.requests) <= 24_000


@pytest.mark.parametrize("mode", ["json", "schema", "tools"])
def test_note_is_offered_in_every_mode_and_under_tools(mode):
    model = ScriptedModel(act("note", text="plan: add, then finish"), act("finish", result="2"))
    outcome = run("add", Settings(mode=mode), model, registry={})
    assert outcome.status == "finished"
    system = model.messages(0)[0]["content"]
    assert "- note" in system and "what you ruled out" in system
    assert '"data": "noted' in model.messages(1)[-1]["content"]
    if mode == "schema":
        assert '"note"' in json.dumps(model.requests[0]["response_format"])
    if mode == "tools":
        assert "note" in [tool["function"]["name"] for tool in model.requests[0]["tools"]]


# --- --check --------------------------------------------------------------------------------

CHECK = "grep -qx 1536 || { echo \"expected 1536, got $AGENT_ANSWER for: $AGENT_TASK\"; exit 1; }"


@pytest.mark.processes
def test_a_wrong_answer_is_fed_back_with_the_checks_output_and_the_right_one_accepted(serve, capsys):
    server = serve([act("finish", result="1000"), act("finish", result="1536")], key=None)
    assert main(["--check", CHECK, "--json", "compute (12 + 500) * 3"]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert (printed["status"], printed["result"], printed["rounds"]) == ("finished", "1536", 2)
    assert [(c["round"], c["exit_code"]) for c in printed["checks"]] == [(1, 1), (2, 0)]
    assert len(server.requests) == 2
    assert "expected 1536, got 1000 for: compute (12 + 500) * 3" in server.sent_messages(1)[-1]["content"]
    assert len([line for line in err.splitlines() if line.startswith("check:")]) == 2
    assert "answer: 1000" in err.splitlines(), "the rejected answer is shown with the check's verdict"


@pytest.mark.processes
def test_a_check_that_never_passes_ends_the_run_failed_with_its_last_output(serve, tmp_path, capsys):
    check = 'echo "not accepted: $(cat)"; exit 3'
    serve([act("finish", result=str(n)) for n in range(5)], key=None)
    trace = tmp_path / "run.jsonl"
    assert main(["--check", check, "--trace", str(trace), "--quiet", "guess"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert said_lines(err)[0].startswith("agent-demo: not completed: the check rejected 3 answers")
    assert err.splitlines()[1:5] == ["  the last answer:", "    2", "  the check said:", "    not accepted: 2"]
    end = records(trace)[-1]
    assert (end["status"], end["rounds"], end["result"]) == ("failed", 3, "not accepted: 2\n")
    checks = [call["check"] for r in records(trace) if r["event"] == "round" for call in r["calls"]]
    assert [(c["command"], c["exit_code"], c["output"]) for c in checks] == [
        (check, 3, f"not accepted: {n}\n") for n in range(3)]
    assert all(isinstance(c["ms"], int) for c in checks)
    assert main(["--resume", str(trace)]) == 2, "a failed run is over"


@pytest.mark.processes
@pytest.mark.parametrize("check, said", [("no-such-check-program --flag", "cannot start"),
                                         ("grep -q 'unclosed", "quotation"),
                                         ("test -f x && (", "cannot be read by /bin/sh"),
                                         ("", "empty")])
def test_a_check_that_cannot_start_is_a_configuration_error_before_any_request(serve, capsys, check, said):
    server = serve([act("finish", result="1")], key=None)
    assert main(["--check", check, "x"]) == 2
    assert said in capsys.readouterr().err
    assert server.requests == []


@pytest.mark.processes
def test_resume_keeps_the_check_and_the_attempts_used(serve, tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    serve([act("finish", result="1"), act("finish", result="2")], key=None)
    assert main(["--check", "grep -q 1536", "--check-attempts", "3", "--max-rounds", "2", "--trace", str(trace),
                 "--quiet", "compute"]) == 1
    server = serve([act("finish", result="3")], key=None)
    assert main(["--resume", str(trace), "--check", "grep -q 1536", "--max-rounds", "5", "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert (printed["status"], printed["rounds"]) == ("failed", 3), "the third rejection: 2 were used before"
    assert len(server.requests) == 1


@pytest.mark.processes
def test_a_check_still_running_after_the_tool_timeout_rejects_the_answer(serve, capsys):
    server = serve([act("finish", result="slow"), act("finish", result="fast")], key=None)
    started = time.monotonic()
    # 2 s: long enough for the second check to start and pass on a busy machine, far short of the sleep.
    assert main(["--check", "grep -q fast || sleep 60", "--tool-timeout", "2", "--quiet", "x"]) == 0
    assert time.monotonic() - started < 30, "the check and what it started were stopped"
    assert "did not finish within 2 s" in server.sent_messages(1)[-1]["content"]


@pytest.mark.processes
def test_the_status_line_shows_a_running_check():
    screen = io.StringIO()
    log = ScreenTrace(Screen(screen, live=True))
    settings = Settings(check="sleep 0.3")
    assert run("x", settings, ScriptedModel(act("finish", result="1")), log=log).status == "finished"
    assert "check running (sleep 0.3)" in screen.getvalue()
    assert "check: sleep 0.3 -> exit 0" in screen.getvalue()


@pytest.mark.processes
def test_a_check_runs_without_the_key_and_its_output_reaches_the_model_without_it(serve, monkeypatch):
    monkeypatch.setenv("SOME_TOKEN", KEY)
    server = serve([act("finish", result="1"), act("finish", result="2")])
    check = ('echo "env: ${LLM_API_KEY:-none} ${OPENAI_API_KEY:-none} ${SOME_TOKEN:-none}"; cat leaked.txt;'
             " (printf x; cat leaked.txt) | base64 | tr -d '\\n' | fold -w 12; echo; fold -w 8 leaked.txt; exit 1")
    open("leaked.txt", "w").write(f"found {KEY}\n")
    assert main(["--check", check, "--check-attempts", "2", "--quiet", "x"]) == 1
    told = server.requests[1]["body"]["messages"][-1]["content"]
    assert KEY not in json.dumps(told) and "env: none none none" in told and "found [redacted]" in told
    wrapped = told[told.index("found [redacted]") + len("found [redacted]"):]
    assert wrapped.count("[redacted]") == 2, "a key in lines of 12 (base64 of it) or 8 characters is still the key"


@pytest.mark.processes
def test_a_check_is_over_when_its_own_process_exits_whatever_it_left_holding_the_output(tmp_path):
    pid_file = tmp_path / "pid"
    command = f"echo before; setsid sleep 30 & echo $! > {pid_file}; exit 1"
    try:  # before: the pipe's end was awaited, 30 s, past the timeout: "did not finish"
        said = run_check(["/bin/sh", "-c", command], command, "answer", "task", timeout=8)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert (said["exit_code"], said["output"]) == (1, "before\n")


FLOOD = r"""
import json, re, sys
sys.path[0] = sys.argv[1]
from agent_demo_kit.checks import run_check
command = "yes 123456789 | head -c 200000000; echo; echo the end"
output = run_check(["/bin/sh", "-c", command], command, "", "", timeout=60)["output"]
# This process's own peak (ru_maxrss would count the parent's, from before the fork and exec)
with open("/proc/self/status") as status:
    peak_mb = int(re.search(r"VmHWM:\s+(\d+) kB", status.read()).group(1)) // 1024
print(json.dumps([output[:20], output[66_660:66_720], output[-9:], peak_mb]))
"""


@pytest.mark.processes
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from /proc (Linux)")
def test_a_check_that_floods_its_output_is_read_in_bounded_memory():
    project = os.path.dirname(os.path.abspath(prompts.__file__))
    said = subprocess.run([sys.executable, "-c", FLOOD, project], capture_output=True, text=True, timeout=120)
    head, middle, end, peak_mb = json.loads(said.stdout or "null") or [said.stderr] * 4
    assert (head, end) == ("123456789\n123456789\n", "\nthe end\n")
    # 200,000,009 characters, of which 66,666 of the head and 33,333 of the tail are kept
    assert " ...[truncated 199900010 chars]... " in middle
    assert peak_mb < 100, f"{peak_mb} MB for 200 MB of output, of which 100,000 characters are kept"
