"""An answer in words is what it is everywhere: the model called no finish, so nothing says it did
(issue 43, item 2): not the trace, not --json's calls, not --show."""
import json

from agent_demo_kit.cli import main


def test_an_answer_in_words_is_no_finish_call_in_the_trace_or_in_json(serve, capsys):
    serve(["The answer is 4.", "The answer is 4."])
    assert main(["--json", "compute 2 + 2"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["answered_in_words"] is True and out["result"] == "The answer is 4."
    assert [call["tool"] for call in out["calls"]] == [], "the model made no call"
    assert "finish(" not in captured.err and "taken as the answer (not a finish call)" in captured.err
    assert main(["--show", out["run_id"]]) == 0
    shown = capsys.readouterr().err
    assert "finish(" not in shown and "taken as the answer (not a finish call)" in shown


def test_an_answer_in_words_is_marked_in_results_the_summary_and_the_page(tmp_path, cli, monkeypatch):
    from agent_demo_kit import report_page
    from scripted_server import ScriptedServer, action
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "t0", "task": "what is 2 + 2?", "expected": "4"}) + "\n")
    words = {"content": "4"}  # in tools mode, a reply of words is the answer at once

    def by_model(body):
        return words if body["model"] == "talker" else {"content": None, "tool_calls": [{
            "id": "c1", "type": "function", "function": {"name": "finish", "arguments": '{"result": "5"}'}}]}
    with ScriptedServer([], screen=by_model) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        for model in ("talker", "caller"):
            cli("--batch", path, "-m", model, "--mode", "tools", "-q")
    talker = tmp_path / "tasks-results" / "talker"
    [line] = [json.loads(text) for text in (talker / "results.jsonl").read_text().splitlines()]
    assert line["answered_in_words"] is True
    code, out, err = cli("--summary", talker, tmp_path / "tasks-results" / "caller")
    assert "right (in words): 4" in out and "wrong: 5" in out
    [task] = report_page.batch_data([str(talker)])["tasks"]
    assert task["runs"][0]["in_words"] is True
