"""The key never leaves the process: every output path goes through one redacting writer.

Each test makes the key reach one path (a server and a tool that echo it) and checks
that the path shows [redacted] instead, so dropping the redaction from any one path fails.
"""
import json
import os
import sys
from pathlib import Path

import pytest

from agent_demo import main
from conftest import KEY, answer_on_a_terminal
from agent_demo_kit.terminal import Redactor, SafeStream
from scripted_server import ScriptedServer, action as act

ROOT = Path(__file__).resolve().parent.parent
# The model says the key, then makes a tool echo it (an order id of the wrong shape is quoted back), then finishes
# with it.
ECHOING_MODEL = [f"my key is {KEY} " + act("get_order_status", order_id=KEY),
                 act("finish", result=f"the key was {KEY}")]


def test_stdout_does_not_show_the_key_in_the_result(serve, capsys):
    serve(ECHOING_MODEL)
    assert main(["--quiet", "hi"]) == 0
    assert capsys.readouterr().out == "the key was [redacted]\n"


def test_the_json_object_does_not_show_the_key(serve, capsys):
    serve(ECHOING_MODEL)
    assert main(["--json", "--quiet", "hi"]) == 0
    out = capsys.readouterr().out
    assert KEY not in out and json.loads(out)["result"] == "the key was [redacted]"


def test_the_trace_on_stderr_does_not_show_the_key(serve, capsys):
    serve(ECHOING_MODEL)
    assert main(["hi"]) == 0
    err = capsys.readouterr().err
    assert KEY not in err
    assert "model: my key is [redacted]" in err, "the model's words"
    assert 'got \\"[redacted]\\"' in err, "the tool's result"


def test_the_trace_file_does_not_hold_the_key(serve, tmp_path):
    serve(ECHOING_MODEL)
    trace = tmp_path / "run.jsonl"
    assert main(["--quiet", "--trace", str(trace), "hi"]) == 0
    text = trace.read_text()
    assert KEY not in text
    assert "my key is [redacted]" in text and 'got \\"[redacted]\\"' in text


def test_an_error_message_and_its_debug_traceback_do_not_show_the_key(serve, capsys):
    serve([{"status": 401, "body": {"error": {"message": f"Incorrect API key provided: {KEY}"}}}])
    assert main(["--debug", "hi"]) == 3
    err = capsys.readouterr().err
    assert KEY not in err
    assert "Traceback" in err and err.count("Incorrect API key provided: [redacted]") == 2


def test_the_approval_question_on_the_terminal_does_not_show_the_key(tmp_path):
    tools_file = tmp_path / "echo.py"
    tools_file.write_text('def echo(text: str) -> str:\n    """Say it back."""\n    return text\n')
    with ScriptedServer([act("echo", text=KEY), act("finish", result="done")]) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "AGENT_"))}
        env.update(LLM_API_URL=server.url, LLM_API_KEY=KEY)
        shown, out, err, _ = answer_on_a_terminal(["--approve", "--quiet", "--tools-file", str(tools_file), "hi"],
                                                  env, tmp_path)
    assert b'approve echo {"text": "[redacted]"}? [y/N]' in shown
    assert KEY.encode() not in shown + out + err


@pytest.mark.parametrize("pieces", [
    [KEY],
    [KEY[:5], KEY[5:]],
    ["Bearer%20", KEY[:-1], KEY[-1:] + "&x=1"],
    [c for c in f"token={KEY}\n"],
])
def test_a_key_written_in_pieces_is_still_redacted(pieces):
    class Sink:
        text = ""

        def write(self, text):
            Sink.text += text

        def flush(self):
            pass
    stream = SafeStream(Sink(), Redactor(KEY))
    for piece in pieces:
        stream.write(piece)
        stream.flush()
    stream.finish()
    assert KEY not in Sink.text and "[redacted]" in Sink.text


def test_text_held_back_because_it_might_start_the_key_is_written_at_the_end(capsys):
    stream = SafeStream(sys.stdout, Redactor(KEY))
    stream.write("almost " + KEY[:6])
    stream.flush()
    assert capsys.readouterr().out == "almost "
    stream.finish()
    assert capsys.readouterr().out == KEY[:6]
