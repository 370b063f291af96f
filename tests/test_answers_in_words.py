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
