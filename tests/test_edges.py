"""Hostile edges: no traceback, no lost reply, no leaked secret, and a trace that always ends."""
import base64
import json
import shlex
import os
import signal
import time
from pathlib import Path

import pytest

from agent_demo_kit.cli import main
from agent_demo_kit.redaction import Redactor
from conftest import KEY, run_cli as run_to_end, said_lines, signal_once, start_cli
from scripted_server import ScriptedServer, action as act
from agent_demo_kit.urls import chat_completions_url

ROOT = Path(__file__).resolve().parent.parent


def events(trace):
    return [json.loads(line)["event"] for line in Path(trace).read_text().splitlines() if line.strip()]


def cli(*args, env_extra=None, **popen):
    return start_cli(*args, env=env_extra, **popen)


# --- losing a reply that arrived ------------------------------------------------------------

@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_a_slow_writer_is_never_cut_off_only_silence_is(serve, capsys, stream):
    server = serve([{"trickle": 0.05, "piece_delay": 0.015, "content": act("finish", result="slow but steady " * 8)},
                    {"trickle": 0.5, "content": act("finish", result="stalled")}])
    started = time.monotonic()
    assert main(["--timeout", "0.2", stream, "--quiet", "hi"]) == 0  # 8 pieces (or 25 events) over 0.4 s
    assert capsys.readouterr().out.startswith("slow but steady") and time.monotonic() - started > 0.3
    assert main(["--timeout", "0.2", "--no-stream", "--retries", "0", "hi"]) == 3
    assert said_lines(capsys.readouterr().err) == ["agent-demo: error: the reply stopped arriving: nothing more came"
                                                   " within 0.2 s (after 0 retries)"]
    assert len(server.requests) == 2


def test_a_local_server_that_says_nothing_is_not_sent_the_request_again(serve, capsys):
    server = serve([{"delay": 0.5, "content": act("finish", result="late")}, act("finish", result="again")])
    assert main(["--timeout", "0.2", "--retries", "3", "hi"]) == 3
    [said] = said_lines(capsys.readouterr().err)
    assert said.startswith("agent-demo: error: no reply within 0.2 s from http://127.0.0.1:")
    assert said.endswith("a local server may still be working on it, so it is not sent again"
                         " (give it longer with --timeout)")
    assert len(server.requests) == 1, "no copies stacked behind the first"


@pytest.mark.parametrize("canned, said", [
    ({"delay": 0.5, "content": "{}"}, "no reply within 0.2 s from http://127.0.0.1:"),
    ({"trickle": 0.4, "content": act("finish", result="slow")}, "the reply stopped arriving: nothing more came"
                                                                " within 0.2 s"),
    ({"short": True, "content": act("finish", result="x")}, "the reply stopped arriving"),
    ({"drop": True}, "the server closed the connection without replying"),
])
def test_a_server_that_was_reached_is_not_called_unreachable(serve, capsys, canned, said):
    serve([canned])
    assert main(["--timeout", "0.2", "--retries", "0", "hi"]) == 3
    err = capsys.readouterr().err
    [line] = said_lines(err)
    assert said in line and "cannot reach" not in line


def test_a_dead_endpoint_is_called_unreachable(monkeypatch, capsys):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    assert main(["--retries", "0", "hi"]) == 3
    assert "cannot reach http://127.0.0.1:9/v1/chat/completions: connection refused" in capsys.readouterr().err


def empty_reply(finish_reason, **message):
    return {"body": {"choices": [{"message": {"role": "assistant", "content": None, **message},
                                  "finish_reason": finish_reason}]}}


def test_an_empty_reply_is_a_format_error_fed_back_not_the_end_of_the_run(serve, capsys):
    server = serve([empty_reply("stop"), act("finish", result="ok")])
    assert main(["--quiet", "hi"]) == 0
    told = server.sent_messages(1)[-1]["content"]
    assert "your reply was empty" in told and '{"tool": "<name>"' in told


def test_a_reply_spent_on_thinking_and_cut_off_says_so_to_the_model(serve, capsys):
    server = serve([empty_reply("length", reasoning_content="I think " * 500), act("finish", result="ok")])
    assert main(["--quiet", "hi"]) == 0
    told = server.sent_messages(1)[-1]["content"]
    assert "cut off" in told and "length" in told


def test_three_empty_replies_in_a_row_are_stuck(serve, capsys):
    serve([empty_reply("length")])
    assert main(["--json", "--quiet", "hi"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["rounds"]) == ("stuck", 3)


def test_an_action_after_a_very_long_preamble_is_found_or_the_model_is_told(serve, capsys):
    server = serve(["x " * 60_000 + act("finish", result="found"), act("finish", result="second")])
    assert main(["--quiet", "hi"]) == 0
    assert capsys.readouterr().out == "found\n"
    server = serve(["{" + '"a": 1, ' * 30_000 + "} " * 3 + "y " * 60_000, act("finish", result="ok")])
    assert main(["--quiet", "hi"]) == 0
    assert "only its first and last" in server.sent_messages(1)[-1]["content"]


# --- crashes and tracebacks -------------------------------------------------------------------

def test_a_lone_surrogate_in_an_action_does_not_crash_the_run(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    server = serve(['{"tool": "calculator", "args": {"expression": "1 + 1\\ud83d"}}',
                    '{"tool": "finish", "args": {"result": "done \\ud83d\\ude00 \\udc00"}}'])
    assert main(["--trace", str(trace), "hi"]) == 0
    out, err = capsys.readouterr()
    assert said_lines(err) == [] and out.rstrip().endswith("done 😀 ?")
    assert events(trace) == ["start", "round", "round", "end"]
    json.dumps(server.requests[1]["body"]).encode("utf-8")


@pytest.mark.processes
def test_closing_stdout_early_is_no_traceback_and_the_trace_still_ends(tmp_path):
    trace = tmp_path / "t.jsonl"
    with ScriptedServer([act("calculator", expression="1 + 1")] * 3 + [act("finish", result="x\n" * 50_000)]) as server:
        process = start_cli("--trace", trace, "hi", shell_tail="| head -c 1", env={"LLM_API_URL": server.url})
        out, err = process.communicate(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    assert events(trace)[-1] == "end"


@pytest.mark.parametrize("argv", [
    ["--timeout", "nan", "x"], ["--timeout", "inf", "x"], ["--timeout", "-1", "x"], ["--timeout", "1e400", "x"],
    ["--max-rounds", "-3", "x"], ["--max-tokens", "0", "x"], ["--max-context", "0", "x"], ["--retries", "-1", "x"],
    ["--max-calls", "0", "x"],
])
def test_a_number_flag_that_is_not_a_sensible_number_is_a_usage_error(argv, serve, capsys):
    server = serve([act("finish", result="ok")])
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    [said] = said_lines(capsys.readouterr().err)
    assert server.requests == [] and said.startswith("agent-demo: error: argument --")


@pytest.mark.parametrize("name, value", [
    ("AGENT_MAX_ROUNDS", "inf"), ("AGENT_MAX_ROUNDS", "-1"), ("AGENT_MAX_CONTEXT", "nan"),
    ("AGENT_RETRIES", "1e3"), ("AGENT_MAX_TOKENS", "0"), ("AGENT_MAX_RESULT_CHARS", "x"),
])
def test_a_number_variable_that_is_not_a_sensible_number_is_a_configuration_error(name, value, serve, monkeypatch,
                                                                                   capsys):
    server = serve([act("finish", result="ok")])
    monkeypatch.setenv(name, value)
    assert main(["x"]) == 2
    err = capsys.readouterr().err
    [said] = said_lines(err)
    assert said.startswith(f"agent-demo: error: {name} must") and server.requests == []


def wait_for_requests(server, count):
    deadline = time.monotonic() + 20
    while len(server.requests) < count and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.processes
@pytest.mark.parametrize("sent, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_end_the_run_with_its_end_record(tmp_path, sent, code):
    trace = tmp_path / "t.jsonl"
    with ScriptedServer([act("calculator", expression="1 + 1"), {"delay": 30, "content": "{}"}]) as server:
        process = cli("--trace", str(trace), "hi", env_extra={"LLM_API_URL": server.url})
        wait_for_requests(server, 2)
        process.send_signal(sent)
        out, err = process.communicate(timeout=20)
    assert process.returncode == code
    assert "Traceback" not in err and "interrupted after 1 completed round(s)" in err
    assert json.loads(trace.read_text().splitlines()[-1])["status"] == "interrupted"


@pytest.mark.processes
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_trace_file_whose_write_fails_is_closed(serve, tmp_path):
    with ScriptedServer([act("finish", result="ok")]) as server:
        code, _, err = run_to_end("--trace", "/dev/full", "hi", python_flags=("-X", "dev", "-W", "error::ResourceWarning"),
                               env={"LLM_API_URL": server.url})
    assert code == 2
    assert "ResourceWarning" not in err and "Exception ignored" not in err
    assert said_lines(err) == ["agent-demo: error: cannot write the trace file: No space left on device"]


# --- endpoint URLs -------------------------------------------------------------------------------

@pytest.mark.parametrize("given, expected", [
    ("https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-06-01",
     "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-06-01"),
    ("https://host/v1?api-version=1", "https://host/v1/chat/completions?api-version=1"),
    ("https://host/v1/", "https://host/v1/chat/completions"),
    ("https://host/v1/chat/completions/", "https://host/v1/chat/completions"),
    ("http://host:8080", "http://host:8080/chat/completions"),
])
def test_only_the_path_decides_whether_chat_completions_is_added(given, expected):
    assert chat_completions_url(given) == expected


def test_a_query_string_is_kept_and_sent(serve, monkeypatch, capsys):
    server = serve([act("finish", result="ok")])
    monkeypatch.setenv("LLM_API_URL", server.url + "/chat/completions?api-version=2024-06-01")
    assert main(["--quiet", "hi"]) == 0
    assert server.requests[0]["path"] == "/v1/chat/completions?api-version=2024-06-01"


def test_a_password_in_the_url_is_neither_shown_nor_recorded(serve, monkeypatch, capsys, tmp_path):
    server = serve([act("finish", result="ok")])
    monkeypatch.setenv("LLM_API_URL", server.url.replace("http://", "http://alice:hunter2-secret@"))
    trace = tmp_path / "t.jsonl"
    assert main(["--trace", str(trace), "hi"]) == 0
    out, err = capsys.readouterr()
    assert "hunter2-secret" not in out + err + trace.read_text()
    assert "alice:***@127.0.0.1" in err
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}", "the password does not replace the key"
    monkeypatch.delenv("LLM_API_KEY")
    assert main(["--quiet", "hi"]) == 0
    assert server.requests[1]["headers"]["Authorization"].startswith("Basic "), "without a key it is used"


# --- the key -----------------------------------------------------------------------------------

@pytest.mark.parametrize("echo", [f"Bearer%20{KEY}", f"https://x/?key={KEY}&y=1", f'"{KEY}"', f"{KEY}{KEY}",
                                  f"token:{KEY}xyz"])
def test_the_key_glued_to_other_characters_is_redacted(serve, capsys, tmp_path, echo):
    serve([{"status": 401, "body": {"error": {"message": f"bad credentials: {echo}"}}}])
    trace = tmp_path / "t.jsonl"
    assert main(["--trace", str(trace), "hi"]) == 3
    out, err = capsys.readouterr()
    assert KEY not in out + err + trace.read_text()
    assert "[redacted]" in err


def test_a_short_placeholder_key_still_leaves_other_text_alone(serve, capsys):
    serve([act("finish", result="key 12345 and 512 x")], key="512")
    assert main(["--quiet", "hi"]) == 0
    assert capsys.readouterr().out == "key 12345 and [redacted] x\n"


@pytest.mark.parametrize("line, number", [('LLM_API_KEY="sk-unbalanced\n', 1),
                                          ('LLM_MODEL=m\nLLM_API_KEY=\'sk-x\nOTHER=1\n', 2)])
def test_a_dotenv_that_cannot_be_parsed_is_a_configuration_error_naming_the_line(serve, tmp_path, capsys,
                                                                                 line, number):
    server = serve([act("finish", result="ok")], key=None)
    (tmp_path / ".env").write_text(line)
    assert main(["hi"]) == 2
    err = capsys.readouterr().err
    assert f".env line {number}" in err and "sk-" not in err
    assert server.requests == []


# --- found by a black-box review ---------------------------------------------------------------

def test_a_run_log_folder_that_cannot_be_made_is_one_line_and_exit_2(serve, monkeypatch, capsys):
    server = serve([act("finish", result="ok")])
    monkeypatch.setenv("XDG_STATE_HOME", "/dev/null")
    assert main(["hi"]) == 2
    assert said_lines(capsys.readouterr().err)[0].startswith("agent-demo: error: cannot create the run log folder")
    assert server.requests == []


def test_a_run_still_going_is_neither_resumed_nor_picked_by_resume_alone(serve, tmp_path, capsys):
    from agent_demo_kit.trace_file import TraceFile
    serve([act("calculator", expression="1 + 1")])
    assert main(["--max-rounds", "1", "--quiet", "older task"]) == 1
    [older] = list((tmp_path / "state" / "agent-demo" / "runs").glob("*.jsonl"))
    live = tmp_path / "state" / "agent-demo" / "runs" / "20991231-235959-abcdef.jsonl"
    log = TraceFile(str(live))  # another process's run, still writing
    log.start("live task", "m", "u", {})
    try:
        assert main(["--resume", str(live)]) == 2
        assert "still going" in capsys.readouterr().err
        server = serve([act("finish", result="ok")])
        assert main(["--resume", "--max-rounds", "3", "--quiet"]) == 0
        assert server.sent_messages(0)[1]["content"] == "Task: older task"
    finally:
        log.close()
    assert older.exists()


def test_the_continue_command_keeps_a_model_given_as_a_flag(serve, tmp_path, capsys):
    (tmp_path / ".env").write_text("LLM_MODEL=model-from-dotenv\n")
    server = serve([act("calculator", expression="1 + 1"), act("finish", result="2")])
    assert main(["-m", "model-from-flag", "--max-rounds", "1", "hi"]) == 1
    command = capsys.readouterr().err.split("agent-demo: to continue: ", 1)[1].strip()
    assert command.startswith("agent-demo --resume ") and f" -m model-from-flag --url {server.url}" in command
    assert main(shlex.split(command)[1:] + ["--quiet"]) == 0, "the hint works as printed"
    assert server.requests[1]["body"]["model"] == "model-from-flag"


@pytest.mark.parametrize("lines", [
    ['{"event": "start", "task": "t", "ts": 1e20}'], ['{"event": "start", "task": "t", "ts": NaN}'],
    ['{"event": "start", "task": "t"}', '{"event": "end", "status": "x", "rounds": [1]}'], ["garbage"]])
def test_runs_lists_what_it_can_of_damaged_files(serve, tmp_path, monkeypatch, capsys, lines):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "20200101-000000-abcdef.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(folder))
    assert main(["--runs"]) == 0
    out, err = capsys.readouterr()
    assert said_lines(err) == [] and out.startswith(("run ", "no runs yet"))


def test_a_reply_cut_off_after_its_headers_is_asked_for_again(serve, capsys):
    server = serve([{"short": True, "content": act("finish", result="x")}, act("finish", result="again")])
    assert main(["--quiet", "--retries", "1", "hi"]) == 0
    assert capsys.readouterr().out == "again\n" and len(server.requests) == 2


def test_a_400_that_mentions_upstream_is_not_taken_for_a_refusal_of_streaming(serve, capsys):
    server = serve([{"status": 400, "body": {"error": {"message": "upstream model rejected the request"}}}])
    assert main(["--stream", "hi"]) == 3
    assert len(server.requests) == 1 and "refused streaming" not in capsys.readouterr().err


def test_a_usage_error_quoting_the_key_does_not_show_it(serve, capsys):
    serve([act("finish", result="ok")])
    with pytest.raises(SystemExit):
        main(["--max-rounds", KEY, "hi"])
    with pytest.raises(SystemExit):
        main(["--json", "--mode", KEY, "hi"])
    out, err = capsys.readouterr()
    assert KEY not in out + err and "[redacted]" in err


def test_runs_does_not_show_the_key(serve, monkeypatch, capsys):
    serve([act("finish", result="ok")], key=None)
    assert main(["--quiet", f"remember {KEY}"]) == 0
    monkeypatch.setenv("LLM_API_KEY", KEY)
    assert main(["--runs"]) == 0
    out = capsys.readouterr().out
    assert KEY not in out and "remember [redacted]" in out


@pytest.mark.parametrize("key", ['sk-test-abcdef0123456789"', "'sk-test-abcdef0123456789'", "sk-test\\abcdef"])
def test_a_key_with_a_stray_quote_or_backslash_is_refused(serve, monkeypatch, capsys, key):
    server = serve([act("finish", result="ok")], key=None)
    monkeypatch.setenv("LLM_API_KEY", key)
    assert main(["hi"]) == 2
    assert "stray quote" in capsys.readouterr().err and server.requests == []


def test_a_key_holding_a_byte_that_is_not_utf8_is_refused_like_any_other_odd_key(serve, monkeypatch, capsys):
    server = serve([act("finish", result="ok")], key=None)
    monkeypatch.setenv("LLM_API_KEY", os.fsdecode(b"sk-test-abc\xffdef0123456789"))  # as Python reads such a byte
    assert main(["hi"]) == 2
    assert "non-ASCII character" in capsys.readouterr().err and server.requests == []


@pytest.mark.parametrize("password", ["pa€ss", "pa%E2%82%ACss", os.fsdecode(b"pa\xffss")])
def test_a_url_password_basic_auth_cannot_send_is_refused_before_any_run(serve, monkeypatch, capsys, password):
    server = serve([act("finish", result="ok")], key=None)
    monkeypatch.setenv("LLM_API_URL", server.url.replace("http://", f"http://user:{password}@"))
    assert main(["hi"]) == 2
    err = capsys.readouterr().err
    assert "Basic auth cannot send" in err and password not in err and server.requests == []


def test_a_url_password_in_latin1_is_sent(serve, monkeypatch):
    server = serve([act("finish", result="ok")], key=None)
    monkeypatch.setenv("LLM_API_URL", server.url.replace("http://", "http://user:paéss@"))
    assert main(["-q", "hi"]) == 0
    assert server.requests[0]["headers"]["Authorization"] == "Basic " + base64.b64encode(b"user:pa\xe9ss").decode()


@pytest.mark.parametrize("url, said", [
    ("http://user:hunter2SECRET/pw@{host}/v1", 'an "@" after where its host ends'),
    ("http://user:hunter2SECRET?pw@{host}/v1", 'an "@" after where its host ends'),
    ("http://{ip}:abc/v1", "port that is not a number"),
    ("http://{ip}:99999/v1", "port that is not a number"),
    ("http://a..b/v1", "empty part"),
    ("http://" + "a" * 64 + ".example/v1", "longer than 63"),
    ("http://{host}\\@127.0.0.2:9/v1", "backslash"),
    ("http://{ip}\x01:9/v1", "control character"),
])
def test_a_url_requests_cannot_send_or_would_send_elsewhere_is_refused_before_any_run(serve, monkeypatch, capsys,
                                                                                      url, said):
    server = serve([act("finish", result="ok")], key=None)
    host = server.url.split("//")[1].split("/")[0]
    monkeypatch.setenv("LLM_API_URL", url.format(host=host, ip=host.split(":")[0]))
    assert main(["hi"]) == 2
    err = capsys.readouterr().err
    assert said in err and "hunter2SECRET" not in err and "Traceback" not in err and server.requests == []


@pytest.mark.parametrize("url", ["{base}/@cf/", " {base} ", "http://user:密码@{host}/v1", "{base}?note=a b"])
def test_a_url_requests_can_send_is_taken(serve, monkeypatch, url):
    server = serve([act("finish", result="ok")])  # with a key, which goes instead of the URL's login
    monkeypatch.setenv("LLM_API_URL", url.format(base=server.url, host=server.url.split("//")[1].split("/")[0]))
    assert main(["-q", "hi"]) == 0
    assert server.requests[0]["headers"]["Authorization"].startswith("Bearer ")


def test_an_escalation_url_that_cannot_be_read_is_refused_as_its_variable(serve, monkeypatch, capsys):
    server = serve([act("finish", result="ok")], key=None)
    monkeypatch.setenv("LLM_ESCALATE_MODEL", "bigger")
    monkeypatch.setenv("LLM_ESCALATE_URL", "http://[::1/v1")
    assert main(["hi"]) == 2
    assert "LLM_ESCALATE_URL cannot be read as a URL" in capsys.readouterr().err and server.requests == []


def test_a_url_fragment_and_a_bare_query_token_are_shown_and_recorded_hidden(serve, monkeypatch, capsys, tmp_path):
    server = serve([act("finish", result="ok")], key=None)
    monkeypatch.setenv("LLM_API_URL", server.url + "?tokenVALUE12345678#fragVALUE12345678")
    trace = tmp_path / "run.jsonl"
    assert main(["--trace", str(trace), "hi"]) == 0
    shown = capsys.readouterr().err + trace.read_text()
    assert "VALUE12345678" not in shown and "?***#***" in shown
    assert main(["--config"]) == 0
    assert "VALUE12345678" not in capsys.readouterr().out


@pytest.mark.parametrize("flags, said", [(["--retries", "1030"], "at most 1,000"),
                                         (["--price", "1.7e308,1.7e308"], "at most 1,000,000")])
def test_a_number_too_large_to_work_with_is_refused_as_its_flag(serve, capsys, flags, said):
    server = serve([act("finish", result="ok")], key=None)
    with pytest.raises(SystemExit) as ended:  # as argparse ends on a flag it cannot take
        main([*flags, "hi"])
    assert ended.value.code == 2 and said in capsys.readouterr().err and server.requests == []


def test_a_cost_past_counting_is_unknown_not_infinity():
    from agent_demo_kit.outcome import cost
    used = {"m": {"rounds": 1, "prompt": 10 ** 15, "completion": 10 ** 15}}
    assert cost(used, {"m": (1.7e308, 1.7e308, None)}) is None
    assert cost(used, {"m": (1.0, 2.0, None)}) == 3e9


@pytest.mark.parametrize("where", ["LLM_MODEL", "--model", "--escalate"])
def test_a_model_name_with_a_byte_that_is_not_utf8_is_refused(serve, monkeypatch, capsys, tmp_path, where):
    server = serve([act("finish", result="ok")], key=None)
    name = os.fsdecode(b"model-\xff")
    if where == "LLM_MODEL":
        monkeypatch.setenv(where, name)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("add 2 and 3\n")
    flags = [where, name] if where.startswith("--") else []
    for run in (["hi"], ["--batch", str(tasks)]):
        assert main([*flags, *run]) == 2
        assert "not UTF-8 text" in capsys.readouterr().err and server.requests == []


@pytest.mark.parametrize("proxy, said", [("http://u:pwключ@127.0.0.1:9", "Basic auth cannot send"),
                                         ("http://127.0.0.1:abc", "port that is not a number"),
                                         ("http://a..b:9", "empty part"), ("ftp://127.0.0.1:9", "is a ftp: URL")])
def test_a_proxy_that_cannot_work_is_refused_before_any_run(serve, monkeypatch, capsys, proxy, said):
    server = serve([act("finish", result="ok")], key=None)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    assert main(["hi"]) == 2
    err = capsys.readouterr().err
    assert "the proxy the environment names" in err and said in err and server.requests == []
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # a proxy the endpoint does not go through is not its business
    assert main(["-q", "hi"]) == 0


def test_odd_paths_in_settings_are_one_line_errors_or_passed_by(serve, monkeypatch, capsys, tmp_path):
    serve([act("finish", result="ok")], key=None)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(tmp_path / "a-file" / "runs"))
    assert main(["--runs"]) == 2 and "cannot be looked at: Not a directory" in capsys.readouterr().err
    assert main(["--summary", str(tmp_path / ("x" * 300))]) == 2 and "not a folder" in capsys.readouterr().err
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(tmp_path / "runs"))
    os.mkfifo(tmp_path / "fifo")
    assert main(["--trace", str(tmp_path / "fifo"), "hi"]) == 2 and "is not a file" in capsys.readouterr().err
    (tmp_path / ".env").symlink_to(tmp_path / "nowhere")  # ./.env, a link to nothing: passed by, said why
    assert main(["-q", "hi"]) == 0 and "./.env not read: it is a link to nothing" in capsys.readouterr().err
    settings = Path(os.environ["XDG_CONFIG_HOME"]) / "agent-demo" / ".env"
    settings.parent.mkdir(parents=True)
    settings.symlink_to(tmp_path / "nowhere")
    assert main(["hi"]) == 2 and "the settings file" in capsys.readouterr().err


@pytest.mark.parametrize("secret", ["sk-test-abc\udcffdef0123456789", "sk-test-abc\ud800def0123456789"])
def test_a_secret_with_a_lone_surrogate_is_redacted_in_text_json_and_data(secret):
    redactor = Redactor(secret)
    shown = redactor(f"key {secret} as JSON {json.dumps(secret)}")
    assert secret not in shown and json.dumps(secret) not in shown and shown.count("[redacted]") == 2
    assert secret not in redactor.values({"key": secret})["key"]


def test_a_key_byte_that_is_not_utf8_is_redacted_percent_encoded_as_that_byte():
    secret = os.fsdecode(b"sk-test-abc\xffdef0123456789")
    assert Redactor(secret)("url ?key=sk-test-abc%FFdef0123456789 end") == "url ?key=[redacted] end"


@pytest.mark.processes
def test_a_tools_print_goes_to_stderr_and_its_exit_is_a_failed_call(serve, tmp_path, capfd):
    path = tmp_path / "noisy.py"
    path.write_text("import sys\n\ndef noisy(x: str) -> str:\n    '''Print, then answer.'''\n"
                    "    print('DEBUG', x)\n    return x\n\n"
                    "def quitter(x: str) -> str:\n    '''Exit.'''\n    sys.exit(3)\n")
    server = serve([act("noisy", x="hi"), act("quitter", x="q"), act("finish", result="done")])
    started = time.monotonic()
    assert main(["--tools-file", str(path), "hi"]) == 0
    out, err = capfd.readouterr()  # the tool runs in a worker process: its print is on file descriptor 2
    assert out == "done\n" and "DEBUG hi" in err
    assert "quitter failed: SystemExit: 3" in server.sent_messages(2)[-1]["content"]
    assert time.monotonic() - started < 10


def test_a_damaged_trace_is_refused_not_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"event": "start", "task": "t"}) + "\n" + json.dumps(
        {"event": "round", "round": 1, "model_output": "", "calls": [
            {"tool": "calculator", "args": {}, "result": "2", "watched": True}], "feedback": []}) + "\n")
    assert main(["--resume", str(trace)]) == 2
    assert "cannot resume" in capsys.readouterr().err


@pytest.mark.processes
@pytest.mark.parametrize("redirect", [">&-", ">/dev/full", "2>&-", "2>/dev/full"])
def test_a_closed_or_full_stdout_or_stderr_is_no_traceback(tmp_path, redirect):
    with ScriptedServer([act("calculator", expression="1 + 1"), act("finish", result="ok")]) as server:
        process = start_cli("hi", shell_tail=redirect, env={"LLM_API_URL": server.url})
        _, err = process.communicate(timeout=60)
        answered = len(server.requests)
    assert process.returncode == 0 and answered == 2, "the run goes on and finishes"
    assert "Traceback" not in err


# --- found by a second review, after the merges ---------------------------------------------------

@pytest.mark.processes
def test_sigterm_during_a_tool_call_ends_the_run_as_terminated(serve, capsys, tmp_path):
    tools = tmp_path / "sleepy.py"
    started = tmp_path / "started"
    tools.write_text(f"import pathlib, time\n\ndef nap(seconds: float) -> str:\n    '''Sleep.'''\n"
                     f"    pathlib.Path({str(started)!r}).touch()\n    time.sleep(seconds)\n    return 'rested'\n")
    trace = tmp_path / "t.jsonl"
    serve([act("nap", seconds=20), act("finish", result="all done")], key=None)
    with signal_once(signal.SIGTERM, when=started.exists):  # once the call is running
        code = main(["--tools-file", str(tools), "--trace", str(trace), "x"])
    out, err = capsys.readouterr()
    assert code == 143 and out == "" and "Traceback" not in err
    assert json.loads(trace.read_text().splitlines()[-1])["status"] == "interrupted"


LONG_KEY = "sk-test-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefgh"


def test_a_key_cut_short_by_a_message_limit_is_still_redacted(serve, tmp_path, capsys):
    message = "Invalid API key: " + "y" * (300 - 17 - len(LONG_KEY) + 5) + LONG_KEY + " (check it)"
    serve([{"status": 401, "body": {"error": {"message": message}}}], key=LONG_KEY)
    trace = tmp_path / "t.jsonl"
    assert main(["--trace", str(trace), "hi"]) == 3
    out, err = capsys.readouterr()
    assert LONG_KEY[:20] not in out + err + trace.read_text() and "[redacted]" in err


def test_a_run_started_with_url_says_so_and_resumes_against_it_once_it_is_given_again(serve, monkeypatch, capsys):
    server = serve([act("calculator", expression="1 + 1"), act("finish", result="2")], key=None)
    monkeypatch.delenv("LLM_API_URL")
    assert main(["--url", server.url, "--max-rounds", "1", "--quiet", "x"]) == 1
    hint = capsys.readouterr().err.split("agent-demo: to continue: ", 1)[1].strip()
    assert hint.endswith(f" --url {server.url}"), "the hint gives the URL again"
    assert main(["--resume", "--max-rounds", "2", "--quiet"]) == 2, "the trace alone does not choose where the key goes"
    assert said_lines(capsys.readouterr().err) == [
        f"agent-demo: error: the run was recorded with --url {server.url}/chat/completions, which is not given now:"
        " a trace decides"
        " no such thing on its own; give them again to use them, or others"]
    assert main(["--resume", "--url", server.url, "--max-rounds", "2", "--quiet"]) == 0
    assert capsys.readouterr().out == "2\n" and len(server.requests) == 2


def test_resume_keeps_the_context_budget_and_the_continue_command_says_yes_again(serve, tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    serve([act("calculator", expression=f"{n} + 1") for n in range(3)])
    assert main(["--max-context", "9000", "--yes", "--trace", str(trace), "--max-rounds", "1", "x"]) == 1
    command = capsys.readouterr().err.split("agent-demo: to continue: ", 1)[1]
    assert " --yes" in command and "--max-rounds" not in command and command.startswith(f"agent-demo --resume {trace}")
    assert json.loads(trace.read_text().splitlines()[0])["max_context"] == 9000
    assert main(["--resume", str(trace), "--max-rounds", "2", "--quiet"]) == 1
    assert [json.loads(line).get("max_context") for line in trace.read_text().splitlines()
            if '"event": "resume"' in line] == [9000]


def test_the_schema_variant_that_worked_is_kept_on_resume_even_with_agent_mode_set(serve, monkeypatch, tmp_path):
    from test_local_servers import like_llama_cpp_python, response_formats
    trace = tmp_path / "t.jsonl"
    server = serve([act("calculator", expression="1 + 1"), act("finish", result="2")], screen=like_llama_cpp_python)
    monkeypatch.setenv("AGENT_MODE", "schema")
    assert main(["--trace", str(trace), "--max-rounds", "1", "--quiet", "x"]) == 1
    assert main(["--resume", str(trace), "--max-rounds", "2", "--quiet"]) == 0
    assert [f["type"] for f in response_formats(server)][-1:] == ["json_object"]
    assert len(response_formats(server)) == 3, "no refused request again after the resume"


@pytest.mark.parametrize("url", ["http://[::1", "http://u:pw@[::1/v1"])
def test_a_malformed_url_is_one_line_and_exit_2(url, monkeypatch, capsys):
    monkeypatch.setenv("LLM_API_URL", url)
    assert main(["x"]) == 2
    err = capsys.readouterr().err
    [said] = said_lines(err)
    assert said.startswith("agent-demo: error: LLM_API_URL must be an http(s) URL") and "pw@" not in err


@pytest.mark.parametrize("damage", [{"calls": 5}, {"model_output": 7}, {"tool_calls": "x"}])
def test_a_damaged_round_is_refused_with_exit_2(tmp_path, monkeypatch, capsys, damage):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    trace = tmp_path / "t.jsonl"
    good = {"event": "round", "round": 1, "model_output": "", "calls": [], "feedback": [],
            "result": {"ok": False, "error": "format error: x"}}
    trace.write_text(json.dumps({"event": "start", "task": "t"}) + "\n" + json.dumps({**good, **damage}) + "\n")
    assert main(["--resume", str(trace)]) == 2
    [said] = said_lines(capsys.readouterr().err)
    assert said.startswith("agent-demo: error: ") and "cannot resume" in said
