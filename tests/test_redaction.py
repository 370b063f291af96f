"""The key never leaves the process: every output path goes through one redacting writer.

Each test makes the key reach one path (a server and a tool that echo it) and checks
that the path shows [redacted] instead, so dropping the redaction from any one path fails.
"""
import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from agent_demo_kit.cli import main
from conftest import KEY, answer_on_a_terminal, child_environment
from agent_demo_kit.redaction import FRAGMENT_AT_A_CUT
from agent_demo_kit.redaction import REDACTED, Redactor
from agent_demo_kit.terminal import SafeStream
from agent_demo_kit.prompts import clip
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


@pytest.mark.processes
def test_the_approval_question_on_the_terminal_does_not_show_the_key(tmp_path):
    tools_file = tmp_path / "echo.py"
    tools_file.write_text('def echo(text: str) -> str:\n    """Say it back."""\n    return text\n')
    with ScriptedServer([act("echo", text=KEY), act("finish", result="done")]) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "AGENT_"))}
        env.update(LLM_API_URL=server.url, LLM_API_KEY=KEY)
        shown, out, err, _ = answer_on_a_terminal(["--approve", "--quiet", "--tools-file", str(tools_file), "hi"],
                                                  env, tmp_path)
    assert b'approve echo {"text": "[redacted]"}? [y/N/a]' in shown
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


# --- the forms a key takes, and a key cut short ------------------------------------------------

ENCODED_KEY = "sk+live/KEY=0123456789"  # characters that base64 and percent-encoding change


def lowercase_escapes(text):
    return re.sub(r"%[0-9A-F]{2}", lambda escape: escape.group().lower(), text)


@pytest.mark.parametrize("shown", [
    base64.b64encode(ENCODED_KEY.encode()).decode(),
    base64.urlsafe_b64encode(ENCODED_KEY.encode()).decode(),
    *(base64.b64encode(f"{user}:{ENCODED_KEY}".encode()).decode() for user in ("", "u", "me", "bob")),
    base64.urlsafe_b64encode(f"bob:{ENCODED_KEY}".encode()).decode(),
    lowercase_escapes(quote(ENCODED_KEY, safe="")),
    lowercase_escapes(quote_plus(ENCODED_KEY)),
], ids=["base64", "url-safe", "user0", "user1", "user2", "user3", "user url-safe", "percent", "percent plus"])
def test_the_key_is_redacted_in_base64_and_in_lowercase_percent_encoding(shown):
    redacted = Redactor(ENCODED_KEY)(f"Authorization: Basic {shown}&next")
    left = redacted.replace("Authorization: Basic ", "").replace("&next", "").replace(REDACTED, "")
    assert REDACTED in redacted and len(left) <= 8, "at most the user's name and a character of the key's edges"


def test_what_a_cut_leaves_of_a_key_is_redacted():
    key = "sk-0123456789abcdefgh"[:20]
    cut = clip("x" * 186 + key + "y" * 200, 300)
    assert key[:14] in cut, "the cut leaves 14 of its 20 characters"
    assert key[:FRAGMENT_AT_A_CUT] not in Redactor(key)(cut)


def test_an_endpoint_message_cut_through_the_key_does_not_show_what_is_left_of_it(serve, capsys):
    key = "sk-0123456789abcdefgh"[:20]
    serve([{"status": 401, "body": {"error": {"message": "x" * 186 + key + " was not accepted" + "." * 200}}}], key=key)
    assert main(["hi"]) == 3
    err = capsys.readouterr().err
    assert "authentication failed" in err and "...[truncated" in err and key[:FRAGMENT_AT_A_CUT] not in err


# --- a short placeholder key ------------------------------------------------------------------

def test_a_short_placeholder_key_never_breaks_the_json_output_or_the_trace(serve, capsys, tmp_path):
    trace = tmp_path / "run.jsonl"
    serve([act("calculator", expression="2 + 3"), act("calculator", expression="5 * 1")], key="5")
    assert main(["--json", "--quiet", "--max-rounds", "2", "--trace", str(trace), "add"]) == 1
    outcome = json.loads(capsys.readouterr().out)
    assert outcome["rounds"] == 2 and outcome["calls"][0]["result"] == {"ok": True, "data": 5}
    assert outcome["usage"]["completion_tokens"] == 10
    records = [json.loads(line) for line in trace.read_text().splitlines()]  # every line parses
    assert [r["round"] for r in records if r["event"] == "round"] == [1, 2]
    server = serve([act("finish", result=5)], key="5")
    assert main(["--json", "--quiet", "--resume", str(trace), "--max-rounds", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == 5
    assert len(server.requests) == 1 and '"data": 5' in server.sent_messages(0)[-1]["content"], "no round redone"


# --- what goes to the endpoint ---------------------------------------------------------------

@pytest.mark.processes
def test_a_tools_file_cannot_read_the_key_and_one_it_returns_is_not_sent_to_the_endpoint(serve, tmp_path, capsys,
                                                                                         monkeypatch):
    tools_file = tmp_path / "env.py"
    tools_file.write_text('import os\n\n\ndef read_env(name: str) -> str:\n    """A variable."""\n'
                          '    return "value: " + os.environ.get(name, "(not set)")\n\n\n'
                          'def read_file(path: str) -> str:\n    """A file."""\n    return open(path).read()\n')
    (tmp_path / "leaked.txt").write_text(f"key={KEY}")
    monkeypatch.setenv("SOME_TOKEN", KEY)  # the key in a variable of another name
    server = serve([act("read_env", name="LLM_API_KEY"), act("read_env", name="SOME_TOKEN"),
                    act("read_file", path=str(tmp_path / "leaked.txt")), act("finish", result="done")])
    assert main(["--quiet", "--tools-file", str(tools_file), "hi"]) == 0
    sent = [json.dumps(request["body"]) for request in server.requests]
    assert KEY not in "".join(sent)
    assert "value: (not set)" in sent[1] and "value: (not set)" in sent[2], "the worker never had the key"
    assert "key=[redacted]" in sent[3], "a key it found elsewhere goes no further"


@pytest.mark.processes
@pytest.mark.parametrize("width", [8, 12])
def test_a_key_a_tool_returns_across_lines_is_sent_and_recorded_redacted(serve, tmp_path, width):
    import textwrap
    folded = "\n".join(textwrap.wrap(f"key={KEY}", width, break_on_hyphens=False))  # as fold -w writes it
    (tmp_path / "folded.txt").write_text(folded)
    tools_file = tmp_path / "files.py"
    tools_file.write_text('def read_file(path: str) -> str:\n    """A file."""\n    return open(path).read()\n')
    server = serve([act("read_file", path=str(tmp_path / "folded.txt")), act("finish", result="done")])
    trace = tmp_path / "run.jsonl"
    assert main(["--quiet", "--tools-file", str(tools_file), "--trace", str(trace), "hi"]) == 0
    sent = json.dumps(server.requests[1]["body"])
    for where in (sent, trace.read_text()):
        joined = re.sub(r"\\*\n|\\+n", "", where)  # its line breaks gone, as written or escaped once or twice
        assert KEY not in joined and "[redacted]" in where


def test_piped_material_with_the_key_is_not_sent_to_the_endpoint(serve, cli):
    server = serve([act("finish", result="summed up")])
    code, out, _ = cli("summarize this", stdin=f"config: api_key={KEY}\n")
    sent = json.dumps(server.requests[0]["body"])
    assert code == 0 and KEY not in sent and "api_key=[redacted]" in sent


# --- a traceback -------------------------------------------------------------------------------

@pytest.mark.processes
def test_a_traceback_that_escapes_to_the_top_goes_through_the_redacting_writer():
    program = ("import sys; sys.path.insert(0, sys.argv[1])\n"
               "from agent_demo_kit.terminal import Redactor, protected\n"
               "with protected(Redactor(sys.argv[2])):\n    pass\n"
               "raise RuntimeError('key ' + sys.argv[2] + ' and \\x1b[2J')\n")
    done = subprocess.run([sys.executable, "-c", program, str(ROOT), KEY], capture_output=True, text=True,
                          env=child_environment())
    assert "Traceback" in done.stderr and "RuntimeError: key [redacted] and \\x1b[2J" in done.stderr
    assert KEY not in done.stderr and "\x1b" not in done.stderr


def test_a_key_written_across_lines_is_held_back_but_a_line_ending_in_its_first_letter_is_not():
    from agent_demo_kit.redaction import Redactor
    redactor = Redactor(KEY)
    assert redactor.unsafe_tail("the key:\n" + KEY[:8] + "\n" + KEY[8:12]) == len(KEY[:8] + "\n" + KEY[8:12])
    assert redactor.unsafe_tail("round limit reached after 6 round(s), 90 tokens\n") == 0
    assert redactor.unsafe_tail("it is " + KEY[:5]) == 5


@pytest.mark.parametrize("break_", ["\r", "\n\n", "\r\n\r\n", "\r\r"])
def test_a_key_split_by_a_lone_carriage_return_or_a_blank_line_is_a_key(break_):
    redactor = Redactor(KEY)
    split = KEY[:10] + break_ + KEY[10:20] + break_ + KEY[20:]
    assert redactor(f"key: {split} end") == f"key: {REDACTED} end"
    assert KEY[:10] not in redactor.dumps({"result": f"key: {split}"})
    assert redactor.unsafe_tail("key: " + KEY[:10] + break_ + KEY[10:14]) == len(KEY[:10] + break_ + KEY[10:14])
    shown = []
    stream = SafeStream(type("Sink", (), {"write": lambda self, text: shown.append(text),
                                         "flush": lambda self: None})(), redactor)
    for piece in re.findall(".{1,3}", f"key: {split} end", re.DOTALL):  # streamed a few characters at a time
        stream.write(piece)
    stream.finish()
    assert KEY[:10] not in "".join(shown) and REDACTED in "".join(shown)


@pytest.mark.processes
def test_a_near_miss_of_a_key_wrapped_a_character_a_line_is_found_out_at_once():
    # In a process of its own: a regular expression that backtracks holds the interpreter until it is done.
    program = ("import sys; sys.path.insert(0, sys.argv[1])\n"
               "from agent_demo_kit.redaction import Redactor\n"
               "key = 'sk-proj-' + 'a1B2c3D4' * 5\n"
               "redactor = Redactor(key)\n"
               "redactor('\\r\\n'.join(key[:-1]) + '\\r\\nX')\n"  # 2**47 ways to read its breaks with alternatives
               "print(redactor('\\r\\n'.join(key)))\n")
    try:
        done = subprocess.run([sys.executable, "-c", program, str(ROOT)], capture_output=True, text=True, timeout=60,
                              env=child_environment())
    except subprocess.TimeoutExpired:
        pytest.fail("the pattern backtracks through every way to read the line breaks")
    assert done.stdout == REDACTED + "\n", done.stderr


def test_redactors_of_the_same_secrets_share_nothing_a_later_secret_changes():
    first, second = Redactor("sk-shared-secret-0123456789"), Redactor("sk-shared-secret-0123456789")
    first.add("sk-only-the-first-knows-this-one")
    text = "sk-shared-secret-0123456789 and sk-only-the-first-knows-this-one"
    assert first(text) == f"{REDACTED} and {REDACTED}"
    assert second(text) == f"{REDACTED} and sk-only-the-first-knows-this-one", "its own secrets alone"
    assert Redactor("sk-shared-secret-0123456789").unsafe_tail("... sk-only-the-first") == 0


@pytest.mark.parametrize("secret", ["sk-proj-Abc123/def+GHI=jkl", "short5", "sk-benchmark", "pässwörd-1234",
                                    "sk-line\nbreak-0123"])
def test_the_quick_look_for_secrets_redacts_exactly_what_the_patterns_do(secret):
    import random
    from agent_demo_kit.prompts import TRUNCATED
    redactor = Redactor(secret)
    rng = random.Random(7)

    def wrapped(form):  # broken over lines, as base64 -w and fold write it
        cut = rng.randrange(1, len(form)) if len(form) > 1 else 1
        return form[:cut] + rng.choice(["\n", "\r\n", "\r", "\n\n", "\r\n\r\n"]) + form[cut:]

    def risky():
        form = rng.choice(redactor.forms)
        return rng.choice([
            form, wrapped(form), re.sub(r"%[0-9A-F]{2}", lambda escape: escape.group().lower(), form),
            rng.choice(redactor.seeds or (form,)), form[:rng.randint(4, len(form))], form[-rng.randint(1, len(form)):],
            form[:6] + f" ...{TRUNCATED.format(count=12)}... ", f" ...{TRUNCATED.format(count=3)}... " + form[-6:]])
    filler = ["data", " ", "\n", "\r\n", "%", '{"a": "', '"}', "x1", "é"]
    for _ in range(4000):
        text = "".join(rng.choice(filler) for _ in range(rng.randint(0, 4)))
        text += risky() + "".join(rng.choice(filler) for _ in range(rng.randint(0, 4)))
        for placeholders in (True, False):
            pattern = redactor.pattern if placeholders else redactor.secret_pattern
            by_patterns = redactor._fragments(pattern.sub(REDACTED, text)) if pattern else text
            assert redactor(text, placeholders=placeholders) == by_patterns, (text, placeholders)
