"""The command line as a user meets it: the real main() against a scripted server on loopback."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent_demo_kit.cli import main
from conftest import KEY, child_environment, said_lines, start_cli
from scripted_server import ScriptedServer, action as act

ROOT = Path(__file__).resolve().parent.parent
TASK = "compute (12 + 500) * 3 and look up order A1002"
GOOD_RUN = [act("calculator", expression="12 + 500"), act("calculator", expression="512 * 3"),
            act("get_order_status", order_id="A1002"), act("finish", result="1536; A1002 is 待支付")]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_good_run_prints_the_trace_and_the_result_and_exits_0(serve, capsys):
    server = serve(GOOD_RUN)
    assert main([TASK]) == 0
    out, err = capsys.readouterr()
    assert "--- round 1/6 ---" in err and "action: calculator" in err
    assert 'result: {"ok": true, "data": 1536}' in err
    assert out == "1536; A1002 is 待支付\n", "stdout holds the answer alone"
    assert len(server.requests) == 4
    assert server.connections == 1, "one session: the connection is reused"
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert server.requests[0]["path"] == "/v1/chat/completions"


def test_json_prints_exactly_one_object_and_the_trace_on_stderr(serve, capsys):
    serve(GOOD_RUN)
    assert main(["--json", TASK]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert printed.pop("run_id") and printed.pop("trace").endswith(".jsonl")
    assert printed.pop("calls")[2] == {"round": 3, "tool": "get_order_status", "args": {"order_id": "A1002"},
                                       "result": {"ok": True, "data": {"order_id": "A1002", "status": "待支付"}}}
    assert printed == {"status": "finished", "result": "1536; A1002 is 待支付", "answered_in_words": False, "rounds": 4,
                       "usage": {"prompt_tokens": 40, "completion_tokens": 20, "total_tokens": 60}}
    assert "--- round 4/6 ---" in err


def test_quiet_prints_only_the_result(serve, capsys):
    serve(GOOD_RUN)
    assert main(["--quiet", TASK]) == 0
    assert capsys.readouterr() == ("1536; A1002 is 待支付\n", "")


def test_messy_replies_still_work(serve, capsys):
    serve(["<think>I should use {calculator} first</think>\n```json\n" + act("calculator", expression="12+500")
           + "\n```\nLet me know!", "Okay, I am done.", "Sure:\n" + act("finish", result={"value": 512})])
    assert main(["--json", "add"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["result"] == {"value": 512}
    assert "format error: it held words but no action" in err


def test_a_model_that_gives_up_exits_1_with_its_reason(serve, capsys):
    serve([act("fail", reason="order A9999 does not exist")])
    assert main(["--quiet", "look up A9999"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == ("agent-demo: not completed: the model gave up after 1 round(s): "
                           "order A9999 does not exist")


def test_a_model_that_never_finishes_stops_at_max_rounds_with_exit_1(serve, capsys):
    server = serve([act("calculator", expression="1 + 1")])
    assert main(["--json", "--max-rounds", "3", "loop"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "max_rounds"
    assert len(server.requests) == 3


def test_max_rounds_comes_from_the_environment(serve, monkeypatch):
    server = serve([act("calculator", expression="1 + 1")])
    monkeypatch.setenv("AGENT_MAX_ROUNDS", "2")
    assert main(["--quiet", "loop"]) == 1
    assert len(server.requests) == 2


def test_a_bad_key_exits_3_with_one_line_and_never_shows_the_key(serve, capsys, tmp_path):
    serve([{"status": 401, "body": {"error": {"message": f"Incorrect API key provided: {KEY}"}}}])
    trace = tmp_path / "t.jsonl"
    assert main(["--trace", str(trace), "hi"]) == 3
    out, err = capsys.readouterr()
    assert said_lines(err) == [
        "agent-demo: error: authentication failed (HTTP 401): Incorrect API key provided: [redacted]"
        " - check LLM_API_KEY"]
    for text in (out, err, trace.read_text()):
        assert KEY not in text


def test_debug_shows_the_traceback(serve, capsys):
    serve([{"status": 401, "body": {"error": {"message": "nope"}}}])
    assert main(["--debug", "hi"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_a_429_with_retry_after_is_waited_for_then_the_run_goes_on(serve, capsys, monkeypatch):
    monkeypatch.setenv("AGENT_MAX_RETRY_WAIT", "0.2")  # Retry-After: 1, waited for as long as the cap allows
    server = serve([{"status": 429, "headers": {"Retry-After": "1"}, "body": {"error": {"message": "slow"}}},
                    act("finish", result="ok")])
    assert main(["hi"]) == 0
    assert server.requests[1]["time"] - server.requests[0]["time"] >= 0.19
    assert "note: HTTP 429, retry 1/3 in 0.2 s" in capsys.readouterr().err


def test_a_429_that_never_ends_exits_3_after_the_retries(serve, capsys):
    server = serve([{"status": 429, "headers": {"Retry-After": "0"}, "body": {"error": {"message": "quota"}}}])
    assert main(["--retries", "2", "hi"]) == 3
    assert said_lines(capsys.readouterr().err) == ["agent-demo: error: HTTP 429 after 2 retries: quota"]
    assert len(server.requests) == 3


def test_a_dropped_connection_is_retried(serve, capsys):
    server = serve([{"drop": True}, act("finish", result="ok")])
    assert main(["--quiet", "hi"]) == 0
    assert len(server.requests) == 2


def test_a_dead_endpoint_exits_3(monkeypatch, capsys):
    monkeypatch.setenv("LLM_API_URL", f"http://127.0.0.1:{free_port()}/v1")
    assert main(["--retries", "1", "hi"]) == 3
    err = capsys.readouterr().err
    [said] = said_lines(err)
    assert said.startswith("agent-demo: error: cannot reach http://127.0.0.1:")
    assert said.endswith("connection refused (after 1 retries)")


def test_a_garbage_body_exits_3(serve, capsys):
    serve([{"body": "<html>oops</html>"}, {"body": "{broken"}])
    assert main(["hi"]) == 3
    assert said_lines(capsys.readouterr().err) == [
        "agent-demo: error: the endpoint's reply is an HTML page, not JSON: oops"]
    assert main(["hi"]) == 3
    assert said_lines(capsys.readouterr().err) == ["agent-demo: error: the endpoint's reply is not JSON: {broken"]


def test_json_reports_errors_as_one_object_too(serve, capsys):
    serve([{"status": 404, "body": {"error": {"message": "model 'nope' not found"}}}])
    assert main(["--json", "hi"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "error" and "model 'nope' not found" in out["error"]


def test_missing_key_for_openai_is_a_configuration_error_before_any_request(monkeypatch, capsys):
    assert main(["hi"]) == 2
    assert capsys.readouterr().err.strip() == (
        "agent-demo: error: LLM_API_KEY (or OPENAI_API_KEY) is not set, and api.openai.com needs one (see .env.example)")


def test_no_key_for_a_local_server_sends_no_authorization(serve, capsys):
    server = serve([act("finish", result="ok")], key=None)
    assert main(["--quiet", "hi"]) == 0
    assert "Authorization" not in server.requests[0]["headers"]


def test_settings_come_from_dotenv_but_the_environment_wins(serve, monkeypatch, tmp_path):
    server = serve([act("finish", result="ok")], key=None)
    (tmp_path / ".env").write_text("LLM_API_URL=http://127.0.0.1:1/v1\nLLM_MODEL=from-dotenv\n"
                                   "LLM_API_KEY=sk-from-dotenv\n")
    assert main(["--quiet", "hi"]) == 0
    sent = server.requests[0]
    assert sent["body"]["model"] == "from-dotenv"
    assert sent["headers"]["Authorization"] == "Bearer sk-from-dotenv"


@pytest.mark.parametrize("argv", [[], [""], ["   "], ["--max-rounds", "0", "x"], ["--timeout", "0", "x"]])
def test_usage_errors_exit_2(argv, monkeypatch, capsys):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:1/v1")
    with pytest.raises(SystemExit) as raised:
        sys.exit(main(argv))
    assert raised.value.code == 2
    [said] = said_lines(capsys.readouterr().err)
    assert said.startswith("agent-demo: error: ") and "internal error" not in said


def test_an_unwritable_trace_file_is_a_configuration_error(serve, capsys, tmp_path):
    serve([act("finish", result="ok")])
    assert main(["--trace", str(tmp_path / "missing-dir" / "t.jsonl"), "hi"]) == 2
    assert "cannot open the trace file" in capsys.readouterr().err


def run_cli(*args, env_extra=None, **popen):
    return start_cli(*args, env=env_extra, **popen)


def test_the_help_lists_flags_environment_and_exit_codes(cli):
    code, out, _ = cli("--help")
    assert code == 0
    for word in ["--max-rounds", "--timeout", "--trace", "--json", "--quiet", "LLM_API_KEY", "LLM_API_URL",
                 "LLM_MODEL", "AGENT_MAX_ROUNDS", "130 interrupted"]:
        assert word in out


def test_a_key_with_a_trailing_carriage_return_from_a_crlf_env_file_works(serve, tmp_path):
    server = serve([act("finish", result="ok")], key=None)
    (tmp_path / ".env").write_bytes(b"LLM_API_KEY=sk-crlf-key-123\r\n")
    assert main(["--quiet", "hi"]) == 0
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-crlf-key-123"


@pytest.mark.parametrize("bad_key", ["sk-zero\u200bwidth-key", "sk-has space-key", "sk-ünïcode-key"])
def test_a_key_that_cannot_be_a_header_is_a_configuration_error_that_does_not_show_it(
        serve, capsys, monkeypatch, bad_key):
    server = serve([act("finish", result="ok")], key=None)
    monkeypatch.setenv("LLM_API_KEY", bad_key)
    assert main(["--json", "hi"]) == 2
    out, err = capsys.readouterr()
    assert "LLM_API_KEY holds spaces or characters" in err
    assert bad_key not in out + err and server.requests == []


def test_a_short_placeholder_key_does_not_garble_the_output(serve, capsys):
    serve([act("finish", result=1536)], key="5")
    assert main(["--quiet", "hi"]) == 0
    assert capsys.readouterr().out == "1536\n"


def test_with_json_an_error_is_one_line_on_stderr(serve, capsys):
    serve([{"status": 401, "body": {"error": {"message": "bad key"}}}])
    assert main(["--json", "hi"]) == 3
    err_lines = [line for line in capsys.readouterr().err.splitlines() if "bad key" in line]
    assert err_lines == ["agent-demo: error: authentication failed (HTTP 401): bad key - check LLM_API_KEY"]


def test_a_reply_with_malformed_tool_calls_is_an_endpoint_error_not_a_crash(serve, capsys):
    serve([{"body": {"choices": [{"message": {"content": "", "tool_calls": 5}}]}}])
    assert main(["--json", "hi"]) == 3
    assert json.loads(capsys.readouterr().out)["status"] == "error"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_trace_file_that_cannot_be_written_is_one_line_and_exit_2(serve, capsys):
    serve([act("finish", result="ok")])
    assert main(["--trace", "/dev/full", "hi"]) == 2
    err = capsys.readouterr().err
    assert said_lines(err) == ["agent-demo: error: cannot write the trace file: No space left on device"]


@pytest.mark.parametrize("argv", [["--json", ""], ["--json", "--max-rounds", "x", "hi"], ["--json"]])
def test_usage_errors_under_json_still_print_one_json_object(argv, monkeypatch, capsys):
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "error" and out["error"].startswith("usage: ")


def test_a_gzip_compressed_reply_is_read(serve, capsys):
    serve([{"gzip": True, "content": act("finish", result="zipped")}])
    assert main(["--quiet", "hi"]) == 0
    assert capsys.readouterr().out == "zipped\n"


def test_a_body_cut_short_is_an_endpoint_error_not_a_traceback(serve, capsys):
    serve([{"short": True, "content": act("finish", result="x")}])
    assert main(["--retries", "0", "hi"]) == 3
    err = capsys.readouterr().err
    [said] = said_lines(err)
    assert said.startswith("agent-demo: error: the reply stopped arriving")


def test_a_dotenv_that_is_not_utf8_is_a_configuration_error(tmp_path, capsys):
    (tmp_path / ".env").write_bytes(b"LLM_MODEL=\xff\xfe\n")
    assert main(["hi"]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.processes
@pytest.mark.parametrize("as_module", [False, True], ids=["python agent_demo.py", "python -m agent_demo"])
def test_it_runs_from_a_folder_with_its_own_settings_records_client_and_cli(tmp_path, as_module):
    for name in {path.stem for path in (ROOT / "agent_demo_kit").glob("*.py")} | {"runs", "output", "setup"}:
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the folder\\'s own {name}.py was imported')\n")
    with ScriptedServer([act("calculator", expression="2 + 3"), act("finish", result=5)]) as server:
        process = start_cli("--no-log", "add", as_module=as_module, cwd=tmp_path, env={"LLM_API_URL": server.url})
        out, err = process.communicate(timeout=60)
    assert (process.returncode, out) == (0, "5\n"), err


@pytest.mark.processes
def test_python_agent_demo_py_runs_its_file_once_not_again_as_an_import():
    shown = subprocess.run([sys.executable, "-X", "importtime", os.path.join(ROOT, "agent_demo.py"), "--version"],
                           capture_output=True, text=True, env=child_environment(), timeout=30)
    assert shown.returncode == 0 and shown.stdout.startswith("agent-demo ")
    imported = [line.rsplit("|", 1)[1].strip() for line in shown.stderr.splitlines() if line.startswith("import time")]
    assert "agent_demo_kit.cli" in imported and "agent_demo" not in imported


def test_the_repository_keeps_three_top_level_files_and_one_package():
    project = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'packages = \["agent_demo_kit"\]', project)
    assert sorted(path.name for path in ROOT.glob("*.py")) == ["agent_demo.py", "prompts.py", "tools.py"]
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "agent_demo_kit" / "__init__.py").read_text())[1]
    ours = [*ROOT.glob("*.py"), *ROOT.glob("agent_demo_kit/*.py"), *ROOT.glob("tests/*.py"), ROOT / "pyproject.toml"]
    assert sum(version in path.read_text() for path in ours) == 1, "the version lives in one place"


def test_short_flags_q_and_capital_v(serve, capsys):
    serve([act("finish", result="ok")])
    assert main(["-q", "hi"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("ok\n", "")
    with pytest.raises(SystemExit) as raised:
        main(["-V"])
    assert raised.value.code == 0 and capsys.readouterr().out.startswith("agent-demo ")


def test_a_usage_error_is_one_line_that_points_to_help(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--max-rounds", "many", "hi"])
    assert raised.value.code == 2
    assert capsys.readouterr().err == ("agent-demo: error: argument --max-rounds: must be a whole number, got 'many'"
                                       " (see agent-demo --help)\n")


def test_help_starts_with_examples_that_fit_one_screen(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    head = capsys.readouterr().out.split("positional arguments:")[0].splitlines()
    examples = head[head.index("examples:") + 1:]
    assert len(head) <= 24 and sum(line.startswith("  ") and "agent-demo " in line for line in examples) == 3


@pytest.mark.parametrize("variable", ["LLM_API_KEY", "OPENAI_API_KEY"])
def test_an_authentication_error_names_the_variable_the_key_came_from(serve, monkeypatch, capsys, variable):
    serve([{"status": 401, "body": {"error": {"message": "bad key"}}}], key=None)
    monkeypatch.setenv(variable, "sk-wrong-key-123456")
    assert main(["hi"]) == 3
    assert said_lines(capsys.readouterr().err) == [
        f"agent-demo: error: authentication failed (HTTP 401): bad key - check {variable}"]


def test_a_bad_url_flag_is_reported_as_the_flag(capsys):
    assert main(["--url", "localhost:1234/v1", "hi"]) == 2
    assert said_lines(capsys.readouterr().err) == [
        "agent-demo: error: --url must be an http(s) URL, got 'localhost:1234/v1'"]


@pytest.mark.parametrize("mistyped, meant", [("--jsn", "--json"), ("--no-logg", "--no-log"), ("--max-rounsd=3", "--max-rounds")])
def test_a_mistyped_flag_says_which_one_was_meant(cli, mistyped, meant):
    code, out, err = cli(mistyped, "hi")
    assert code == 2 and f"unrecognized arguments: {mistyped} (did you mean {meant}?)" in err


def test_a_mistyped_keyword_says_which_one_was_meant():
    import agent_demo
    with pytest.raises(agent_demo.ConfigError, match=r"unknown setting 'max_round' \(did you mean max_rounds\?\)"):
        agent_demo.run("hi", url="http://127.0.0.1:9/v1", max_round=3)
