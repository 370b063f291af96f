"""Text from outside (the model, tools, the endpoint) is shown, never obeyed: escape codes reach no
terminal, and an endpoint's token counts cannot give back the budget.
"""
import json
import os

import pytest

from agent_demo import main
from agent_demo_kit.terminal import inert
from conftest import run_cli
from scripted_server import ScriptedServer, action as act

# An escape code for each way text could act on a terminal: colour (hidden text), a window title
# (OSC), clear screen, a carriage return that overwrites the line, and a bidi override.
HOSTILE = "\x1b[30;40mhidden\x1b[0m \x1b]0;owned\x07 \x1b[2J back\rover \u202eevil"
SHOWN = "\\x1b[30;40mhidden\\x1b[0m \\x1b]0;owned\\x07 \\x1b[2J back\\rover \\u202eevil"


def terminal_env(server, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "AGENT_"))}
    return {**env, "LLM_API_URL": server.url, **extra}


# --- text is inert ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    (HOSTILE, SHOWN),
    ("lines\nand\ttabs stay, so does a line end\r\n", "lines\nand\ttabs stay, so does a line end\r\n"),
    ("C1 \x9b2J, DEL \x7f, NUL \x00, bell \x07", "C1 \\u009b2J, DEL \\u007f, NUL \\x00, bell \\x07"),
    ("hidden\u200b \u2066isolate\u2069 \u200fmark", "hidden\\u200b \\u2066isolate\\u2069 \\u200fmark"),
    ("订单 👨\u200d👩\u200d👧 می\u200cخواهم", "订单 👨\u200d👩\u200d👧 می\u200cخواهم"),
])
def test_what_a_terminal_would_act_on_is_shown_as_an_escape(text, shown):
    assert inert(text) == shown


def test_inert_json_is_still_json_meaning_the_same():
    value = {"path": "\x1b[2J\x7f\x9b\u202e\r\n\u2028"}
    text = inert(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value and "\u202e" not in text and "\x7f" not in text


def test_the_trace_shows_escape_codes_from_the_model_tools_and_endpoint_as_text(serve, capsys, tmp_path):
    serve([{"content": f"{HOSTILE} " + act("get_order_status", order_id=HOSTILE), "reasoning_content": HOSTILE},
           {"status": 500, "body": {"error": {"message": HOSTILE}}}], key=None)
    trace = tmp_path / "t.jsonl"
    assert main(["--retries", "1", "--trace", str(trace), "hi"]) == 3
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err and "\r" not in err
    assert f"model: {SHOWN}" in err, "the model's text"
    assert '\\u202eevil"' in err, "the tool's result"
    one_line = SHOWN.replace("\\r", " ")  # an error is one line: its whitespace is folded
    assert f"agent-demo: error: HTTP 500 after 1 retries: {one_line}" in err, "the endpoint's message"
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert records[1]["model_output"].startswith(HOSTILE), "the trace file keeps the exact text"


def test_the_answer_is_exact_data_off_a_terminal_and_inert_on_one(tmp_path):
    import pty
    with ScriptedServer([act("finish", result=HOSTILE)]) as server:
        code, out, _ = run_cli("--quiet", "hi", env=terminal_env(server), text=False)
        assert (code, out) == (0, (HOSTILE + "\n").encode())
        controller, terminal = pty.openpty()
        code, _, _ = run_cli("--quiet", "hi", env=terminal_env(server), stdout=terminal)
        os.close(terminal)
        shown = os.read(controller, 65536).decode()
        os.close(controller)
    assert code == 0 and shown == SHOWN + "\r\n"  # the terminal ends each line with \r\n


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
