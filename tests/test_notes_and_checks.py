"""Working notes that survive every fold."""
import json
import os
import signal
import subprocess
import time

import pytest

import prompts
from agent_demo import main
from agent_demo_kit.settings import Settings
from benchmark import prefix_figures
from conftest import start_cli
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


def test_a_note_from_round_2_is_in_every_later_request_through_300_rounds_a_kill_9_and_resume(serve, tmp_path):
    without = ScriptedModel(*adding(300))
    assert run("keep adding", Settings(max_rounds=300, max_context=8000), without).status == "finished"
    stop, trace = 150, tmp_path / "run.jsonl"
    replies = adding(300, note_in_round=2)
    server = serve(replies[:stop] + [{"delay": 60, "content": "never answered"}] + replies[stop:], key=None)
    process = start_cli("--trace", trace, "--max-rounds", "300", "--max-context", "8000", "keep adding",
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(server.requests) <= stop and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    assert main(["--resume", str(trace), "--quiet"]) == 0
    bodies = [request["body"] for request in server.requests]
    assert json.dumps(bodies[stop + 1]) == json.dumps(bodies[stop]), "the redone request is the killed one"
    del bodies[stop]
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
    assert run("keep adding", Settings(max_rounds=30), model).status == "finished"
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
