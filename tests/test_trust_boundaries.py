"""Text from outside (the model, tools, the endpoint) is shown, never obeyed: an endpoint's token
counts cannot give back the budget.
"""
import json

import pytest

from agent_demo import main
from scripted_server import action as act


# --- token counts ----------------------------------------------------------------------------

@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": -1_000_000_000},
    {"prompt_tokens": -5_000, "completion_tokens": 5},
    {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": True},
    {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 10 ** 15},
], ids=["negative total", "negative prompt", "bool", "absurd"])
def test_token_counts_that_cannot_be_true_are_estimated_and_the_budget_holds(serve, capsys, tmp_path, usage):
    serve([{"content": act("calculator", expression=f"{n} + 1"), "usage": usage} for n in range(10)])
    trace = tmp_path / "t.jsonl"
    assert main(["--max-tokens", "1000", "--json", "--trace", str(trace), "count"]) == 1
    outcome = json.loads(capsys.readouterr().out)
    assert outcome["status"] == "budget" and outcome["usage"]["estimated"] is True
    assert 1000 <= outcome["usage"]["total_tokens"] < 3000
    notes = [r["text"] for r in map(json.loads, trace.read_text().splitlines()) if r["event"] == "note"]
    assert notes and notes[0].startswith("the endpoint reported token counts that cannot be right")
