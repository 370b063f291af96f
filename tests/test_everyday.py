"""Everyday use from a shell: pipes, the usual flags, the run log, your own tools."""
import json
import re
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_demo_kit import __version__
from agent_demo_kit.cli import main
from conftest import KEY, child_environment, run_cli, said_lines, signal_once, start_cli
from scripted_server import ScriptedServer, action as act

ROOT = Path(__file__).resolve().parent.parent
FINISH = act("finish", result="done")


# --- the task from stdin ------------------------------------------------------------------

@pytest.mark.parametrize("args", [["-"], []])
def test_the_task_can_be_piped_in(serve, cli, args):
    server = serve([FINISH], key=None)
    code, out, err = cli(*args, stdin="compute 2 + 2\n")
    assert (code, out) == (0, "done\n")
    assert server.sent_messages(0)[1]["content"] == "Task: compute 2 + 2"


def test_piped_text_beside_a_task_is_the_material_it_is_about(serve, cli):
    server = serve([FINISH], key=None)
    code, out, err = cli("summarize this", stdin="line one\nline two\n")
    assert code == 0
    task = server.sent_messages(0)[1]["content"]
    assert task.startswith("Task: summarize this\n")
    assert task.index("summarize this") < task.index("line one\nline two")


def test_an_empty_pipe_and_no_task_is_a_usage_error(cli):
    code, out, err = cli("-", stdin="  \n")
    assert code == 2 and "the task is empty" in err


def piped(monkeypatch, tmp_path, text):
    """stdin is a file holding text, as with agent-demo "task" < file."""
    path = tmp_path / "piped.txt"
    path.write_text(text)
    monkeypatch.setattr(sys, "stdin", open(path, encoding="utf-8"))


@pytest.mark.parametrize("lines", [1_100, 30_000], ids=["22 KB", "1 MB"])
def test_piped_material_of_any_size_is_read_a_page_at_a_time_within_the_budget(serve, monkeypatch, tmp_path,
                                                                                capsys, lines):
    material = "".join(f"log line number {n}\n" for n in range(1, lines + 1))
    piped(monkeypatch, tmp_path, material)
    server = serve([act("read_material", offset=3000), act("read_material", offset=len(material) - 100),
                    act("finish", result="summarized")])
    assert main(["--quiet", "--max-context", "24000", "summarize this"]) == 0
    assert capsys.readouterr().out == "summarized\n"
    task = server.sent_messages(0)[1]["content"]
    assert f"It is {len(material):,} characters ({lines + 1:,} lines)" in task and "read_material" in task
    assert all(len(json.dumps(request["body"])) <= 24_000 for request in server.requests)
    first_page = json.loads(server.sent_messages(1)[-1]["content"].splitlines()[1])["result"]["data"]
    assert first_page["offset"] == 3000 and first_page["text"].startswith(material[3000:3020])
    assert material[first_page["next_offset"] - 20:first_page["next_offset"]] == first_page["text"][-20:]
    last_page = json.loads(server.sent_messages(2)[-1]["content"].splitlines()[1])["result"]["data"]
    assert last_page["next_offset"] is None and last_page["text"].endswith(f"number {lines}\n")


def test_a_short_key_in_paged_material_is_redacted_whole_whatever_the_pages(serve, monkeypatch, tmp_path, capsys):
    key = "loc4l-k3y-2024-xyzw"  # short enough that a page's edge could split it into parts too short to catch
    monkeypatch.setenv("LLM_API_KEY", key)
    material = "a" * 30_000 + key + "b" * 30_000
    piped(monkeypatch, tmp_path, material)
    at = material.index(key)
    server = serve([act("read_material", offset=at + 11), act("finish", result="done")], key=None)
    assert main(["--quiet", "--max-context", "24000", "read it"]) == 0
    sent = json.dumps([request["body"] for request in server.requests])
    assert key[:8] not in sent and key[-8:] not in sent


def test_a_resumed_run_reads_its_material_as_before(serve, monkeypatch, tmp_path, capsys):
    material = "x" * 50_000
    piped(monkeypatch, tmp_path, material)
    trace = tmp_path / "t.jsonl"
    serve([act("calculator", expression="1 + 1")])
    assert main(["--quiet", "--max-context", "24000", "--max-rounds", "1", "--trace", str(trace), "count the x"]) == 1
    server = serve([act("read_material", offset=49_990), act("finish", result="done")])
    assert main(["--quiet", "--resume", str(trace), "--max-rounds", "3"]) == 0
    page = json.loads(server.sent_messages(1)[-1]["content"].splitlines()[1])["result"]["data"]
    assert page["text"] == "x" * 10 and page["total_chars"] == 50_000


# --- stdout is for the answer -----------------------------------------------------------------

def test_redirected_stdout_holds_only_the_answer(serve, cli):
    serve([act("calculator", expression="2 + 2"), act("finish", result="4")], key=None)
    code, out, err = cli("add")
    assert (code, out) == (0, "4\n")
    assert "--- round 1/6 ---" in err and "action: calculator" in err


def test_quiet_silences_the_trace(serve, capsys):
    serve([FINISH])
    assert main(["--quiet", "hi"]) == 0
    assert capsys.readouterr() == ("done\n", "")


# --- the usual flags --------------------------------------------------------------------------

def test_model_and_url_flags_win_over_the_environment(serve, monkeypatch, capsys):
    server = serve([FINISH])
    monkeypatch.setenv("LLM_MODEL", "from-env")
    good_url = server.url
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    assert main(["-m", "from-flag", "--url", good_url, "--quiet", "hi"]) == 0
    assert server.requests[0]["body"]["model"] == "from-flag"
    assert main(["--model", "long-flag", "--url", good_url, "--quiet", "hi"]) == 0
    assert server.requests[1]["body"]["model"] == "long-flag"


def test_openai_variables_are_read_when_the_llm_ones_are_unset(serve, monkeypatch, capsys):
    server = serve([FINISH], key=None)
    monkeypatch.delenv("LLM_API_URL")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-variable-123")
    assert main(["--quiet", "hi"]) == 0
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-openai-variable-123"
    monkeypatch.setenv("LLM_API_KEY", "sk-llm-variable-456")
    assert main(["--quiet", "hi"]) == 0
    assert server.requests[1]["headers"]["Authorization"] == "Bearer sk-llm-variable-456"


def test_version_prints_the_name_and_version(cli):
    code, out, err = cli("--version")
    assert (code, out) == (0, f"agent-demo {__version__}\n")


# --- the run log --------------------------------------------------------------------------------

def log_files(folder):
    return sorted(Path(folder).glob("*.jsonl"))


def test_every_run_is_logged_to_the_state_folder_readable_only_by_the_user(serve, tmp_path, capsys):
    serve([FINISH])
    assert main(["--quiet", "hi"]) == 0
    [logged] = log_files(tmp_path / "state" / "agent-demo" / "runs")
    assert stat.S_IMODE(logged.stat().st_mode) == 0o600
    assert [json.loads(line)["event"] for line in logged.read_text().splitlines()] == ["start", "round", "end"]


def test_the_log_folder_variable_wins_and_no_log_keeps_nothing(serve, tmp_path, monkeypatch, capsys):
    serve([FINISH])
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(tmp_path / "mine"))
    assert main(["--quiet", "hi"]) == 0
    assert len(log_files(tmp_path / "mine")) == 1
    assert main(["--quiet", "--no-log", "hi"]) == 0
    assert len(log_files(tmp_path / "mine")) == 1
    assert main(["--quiet", "--trace", str(tmp_path / "t.jsonl"), "hi"]) == 0
    assert len(log_files(tmp_path / "mine")) == 1 and (tmp_path / "t.jsonl").exists()


def test_the_oldest_runs_beyond_500_are_pruned(serve, tmp_path, monkeypatch, capsys):
    serve([FINISH])
    folder = tmp_path / "runs"
    folder.mkdir()
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(folder))
    for n in range(501):
        old = folder / f"20200101-00{n:04d}-abcdef.jsonl"
        old.write_text("")
        os.utime(old, (1_000_000 + n, 1_000_000 + n))
    foreign = folder / "another-tools-log.jsonl"
    foreign.write_text("")
    os.utime(foreign, (1, 1))
    assert main(["--quiet", "hi"]) == 0
    assert len(log_files(folder)) == 501
    assert not (folder / "20200101-000000-abcdef.jsonl").exists()
    assert not (folder / "20200101-000001-abcdef.jsonl").exists()
    assert foreign.exists(), "a file agent-demo did not name is not agent-demo's to delete"


def test_a_run_cut_short_says_how_to_continue_and_resume_alone_picks_it_up(serve, capsys):
    server = serve([act("calculator", expression="1 + 1"), act("calculator", expression="2 + 2"), FINISH])
    assert main(["--max-rounds", "1", "hi"]) == 1
    err = capsys.readouterr().err
    [command] = [line for line in err.splitlines() if line.startswith("agent-demo: to continue: ")]
    assert re.fullmatch(r"agent-demo: to continue: agent-demo --resume [0-9a-f]{6} --url http://127\.0\.0\.1:\d+/v1",
                        command), "the URL came from the environment: the hint gives it again"
    assert main(["--resume", "--quiet"]) == 1, "a bare --resume gives another --max-rounds (1) of rounds"
    assert main(["--resume", "--quiet"]) == 0
    assert capsys.readouterr().out == "done\n"
    assert server.sent_messages(2)[1]["content"] == "Task: hi" and len(server.requests) == 3
    [trace] = (Path(os.environ["XDG_STATE_HOME"]) / "agent-demo" / "runs").glob("*.jsonl")
    limits = [json.loads(line)["max_rounds"] for line in trace.read_text().splitlines() if '"event": "resume"' in line]
    assert limits == [2, 3], "each bare --resume adds the run's own --max-rounds, not the total so far"


def test_resume_alone_with_nothing_unfinished_is_a_usage_error(serve, capsys):
    serve([FINISH])
    assert main(["--quiet", "hi"]) == 0
    assert main(["--resume"]) == 2
    assert "no unfinished run" in capsys.readouterr().err


@pytest.mark.processes
def test_the_continue_command_works_as_printed(tmp_path):
    with ScriptedServer([act("calculator", expression="1 + 1"), FINISH]) as server:
        env = {"LLM_API_URL": server.url}
        code, out, err = run_cli("--max-rounds", "1", "hi", env=env)
        assert code == 1
        command = err.split("agent-demo: to continue: ", 1)[1].strip()
        assert command.startswith("agent-demo --resume ") and command.endswith(f" --url {server.url}")
        assert "/" not in command.partition(" --url ")[0], "no interpreter, no trace path"
        on_path = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
        finished = subprocess.run(command, shell=True, capture_output=True, text=True,  # as a user pastes it
                                  timeout=60, stdin=subprocess.DEVNULL, env=child_environment({**env, **on_path}))
    assert (finished.returncode, finished.stdout) == (0, "done\n")


def test_runs_lists_recent_runs_newest_first(serve, capsys):
    serve([act("finish", result="a")])
    assert main(["--quiet", "first task here"]) == 0
    time.sleep(0.02)
    serve([act("fail", reason="no")])
    assert main(["--quiet", "second task words"]) == 1
    capsys.readouterr()
    assert main(["--runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:8] == ["run", "when", "status", "rounds", "tokens", "task", "→", "answer"]
    assert "failed" in lines[1] and lines[1].endswith("second task words → no")
    assert "finished" in lines[2] and lines[2].endswith("first task here → a") and " 15 " in lines[2]


def test_runs_takes_a_count_a_status_and_json_and_leaves_out_runs_that_never_started(serve, cli):
    serve([act("finish", result=f"answer {n}") for n in range(4)], key=None)
    for task in ("one", "two\nlines", "three"):
        assert cli("--quiet", task)[0] == 0
        time.sleep(0.01)
    serve([act("fail", reason="cannot")], key=None)
    assert cli("--quiet", "four")[0] == 1
    assert cli("--max-context", "100", "five")[0] == 2, "a set-up error: the run never started"
    code, out, _ = cli("--runs", "-n", "3", "--json")
    listed = json.loads(out)
    assert code == 0 and [(run["task"], run["status"], run["answer"]) for run in listed] == [
        ("four", "failed", "cannot"), ("three", "finished", "answer 2"), ("two\nlines", "finished", "answer 1")]
    assert all(re.fullmatch(r"[0-9a-f]{6}", run["id"]) and run["trace"].endswith(run["run_id"] + ".jsonl")
               for run in listed)
    code, out, _ = cli("--runs", "--status", "finished")
    rows = out.splitlines()[1:-2]
    assert len(rows) == 3 and all("finished" in row for row in rows) and rows[1].endswith("two lines → answer 1")


# --- your own tools -------------------------------------------------------------------------------

TOOLS_FILE = '''
import time


def shout(text: str) -> str:
    """Return the text in capitals.

    Args:
        text: what to shout
    """
    return text.upper()


def nap(seconds: float) -> str:
    """Sleep, then say so."""
    open("nap-started", "w").close()  # in the run's folder: the test knows the call is running
    time.sleep(seconds)
    return "rested"


def _helper():
    pass
'''


def write_tools(tmp_path, text=TOOLS_FILE, name="my_tools.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.processes
def test_a_tools_file_adds_its_public_functions_as_tools(serve, tmp_path, capsys):
    server = serve([act("shout", text="hi"), FINISH])
    assert main(["--tools-file", write_tools(tmp_path), "--quiet", "shout"]) == 0
    system = server.sent_messages(0)[0]["content"]
    assert "- shout: Return the text in capitals." in system and "text (string): what to shout" in system
    assert "_helper" not in system
    assert '"data": "HI"' in server.sent_messages(1)[-1]["content"]


@pytest.mark.processes
@pytest.mark.parametrize("text, reason", [
    ("def calculator(expression: str):\n    '''Mine.'''\n", "the tool calculator clashes"),
    ("def untyped(x):\n    '''No hint.'''\n", "argument x has no type hint"),
    ("def bare(x: str):\n    pass\n", "bare has no docstring"),
    ("import nonexistent_module_xyz\n", "does not import: ModuleNotFoundError"),
    ("def broken(:\n", "does not import: SyntaxError"),
    ("raise SystemExit(3)\n", "does not import: SystemExit"),
])
def test_a_tools_file_that_cannot_give_tools_is_a_usage_error_naming_it(serve, tmp_path, capsys, text, reason):
    server = serve([FINISH])
    path = write_tools(tmp_path, text)
    assert main(["--tools-file", path, "hi"]) == 2
    [said] = said_lines(capsys.readouterr().err)
    assert said.startswith(f"agent-demo: error: --tools-file {path}: ") and reason in said
    assert server.requests == []


@pytest.mark.processes
def test_two_tools_files_with_the_same_tool_clash(serve, tmp_path, capsys):
    serve([FINISH])
    first = write_tools(tmp_path, name="a.py")
    second = write_tools(tmp_path, name="b.py")
    assert main(["--tools-file", first, "--tools-file", second, "hi"]) == 2
    assert "clashes" in capsys.readouterr().err


@pytest.mark.processes
def test_tools_and_approve_apply_to_a_files_tools(serve, tmp_path, capsys):
    server = serve([act("shout", text="hi"), FINISH])
    assert main(["--tools-file", write_tools(tmp_path), "--tools", "shout", "--approve", "--quiet", "x"]) == 0
    system = server.sent_messages(0)[0]["content"]
    assert "- shout:" in system and "- calculator:" not in system and "- nap:" not in system
    assert "no terminal to ask" in server.sent_messages(1)[-1]["content"]


@pytest.mark.processes
def test_a_tool_that_hangs_is_answered_as_an_error_and_the_run_goes_on(serve, tmp_path, capsys):
    server = serve([act("nap", seconds=30), FINISH])
    started = time.monotonic()
    assert main(["--tools-file", write_tools(tmp_path), "--tool-timeout", "0.2", "--quiet", "x"]) == 0
    assert time.monotonic() - started < 10
    assert "nap did not finish within 0.2 s" in server.sent_messages(1)[-1]["content"]


@pytest.mark.processes
def test_resume_reloads_the_same_tools_files(serve, tmp_path, capsys):
    path = write_tools(tmp_path)
    trace = tmp_path / "t.jsonl"
    server = serve([act("shout", text="a"), act("shout", text="b"), FINISH])
    assert main(["--tools-file", path, "--trace", str(trace), "--max-rounds", "1", "--quiet", "x"]) == 1
    assert main(["--resume", str(trace), "--tools-file", path, "--max-rounds", "3", "--quiet"]) == 0
    assert '"data": "B"' in server.sent_messages(2)[-1]["content"]


@pytest.mark.processes
def test_ctrl_c_during_a_long_tool_call_still_ends_the_run_properly(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    serve([act("nap", seconds=30), FINISH], key=None)
    with signal_once(signal.SIGINT, when=(tmp_path / "nap-started").exists):  # the call is running
        code = main(["--tools-file", write_tools(tmp_path), "--trace", str(trace), "x"])
    assert code == 130 and "Traceback" not in capsys.readouterr().err
    assert json.loads(trace.read_text().splitlines()[-1])["status"] == "interrupted"


@pytest.mark.processes
def test_the_task_from_a_terminal_says_how_to_end_it(tmp_path):
    import pty
    controller, terminal = pty.openpty()
    with ScriptedServer([FINISH]) as server:
        process = start_cli("--quiet", "-", stdin=terminal, env={"LLM_API_URL": server.url})
        os.write(controller, b"look up order A1002\n\x04")
        out, err = process.communicate(timeout=30)
    os.close(controller)
    os.close(terminal)
    assert (process.returncode, out) == (0, "done\n")
    assert err == "agent-demo: reading the task from the terminal; end it with Ctrl-D\n"
    assert server.sent_messages(0)[1]["content"] == "Task: look up order A1002"


@pytest.mark.processes
def test_the_trace_shows_each_action_before_it_runs_and_the_result_as_the_model_got_it(serve, tmp_path, capfd):
    tools = write_tools(tmp_path, "def dump(n: int) -> str:\n    '''Print a greeting, return n lines.'''\n"
                                  "    print('hello from the tool')\n"
                                  "    return ''.join(f'row {i}\\n' for i in range(n))\n", name="dump_tools.py")
    serve([act("dump", n=2000), act("finish", result="done")])
    assert main(["--tools-file", tools, "list rows"]) == 0
    err = capfd.readouterr().err.splitlines()  # the tool prints from its worker process
    at = err.index("action: dump(n=2000)")
    assert err[at + 1] == "hello from the tool", "the tool's own print comes after its action line"
    assert err[at + 2] == "result: 481 lines {\"truncated\": true, \"original_chars\": 16890}"
    shown = err[at + 3:err.index("", at)]
    assert shown[0] == "  | row 0" and all(line.startswith("  | ") for line in shown)
    assert any("[truncated " in line for line in shown), "cut as it was for the model, and marked"
    assert sum(len(line) - 4 for line in shown) < 4000, "no more than the model got"


@pytest.mark.processes
def test_a_tools_file_returning_what_json_cannot_hold_is_converted_and_says_so(serve, tmp_path, capsys):
    tools = write_tools(tmp_path, "import datetime, decimal\n\ndef when(order_id: str) -> dict:\n"
                                  "    '''When an order was placed, and its price.'''\n"
                                  "    return {'placed': datetime.date(2026, 11, 30), 'price': decimal.Decimal('9.90'),"
                                  " 'tags': {'paid'}}\n", name="when_tools.py")
    server = serve([act("when", order_id="A1002"), act("finish", result="done")])
    assert main(["--tools-file", tools, "--quiet", "when?"]) == 0
    told = json.loads(server.sent_messages(1)[-1]["content"].splitlines()[1])["result"]
    assert told == {"ok": True, "data": {"placed": "2026-11-30", "price": "9.90", "tags": ["paid"]},
                    "converted": ["Decimal to text", "date to ISO 8601 text", "set to a list"]}


def test_the_budget_advice_for_piped_material_is_a_value_that_works(serve, monkeypatch, tmp_path, capsys):
    material = "".join(f"{n}\n" for n in range(1, 3001))
    piped(monkeypatch, tmp_path, material)
    serve([act("finish", result="done")])
    assert main(["-q", "--max-context", "4000", "summarize"]) == 2
    [said] = said_lines(capsys.readouterr().err)
    advised = int(said.rsplit("use --max-context ", 1)[1].split()[0])
    piped(monkeypatch, tmp_path, material)
    assert main(["-q", "--max-context", str(advised), "summarize"]) == 0


@pytest.mark.parametrize("flags, status", [(["--max-rounds", "2"], "max_rounds"), (["--max-tokens", "20"], "budget")])
def test_a_run_that_ends_without_an_answer_shows_the_models_last_words(serve, cli, flags, status):
    serve(["<think>hidden</think>Adding one at a time, I will get there.\n" + act("calculator", expression="1 + 1"),
           "I need one more step:\n" + act("calculator", expression="2 + 1")], key=None)
    code, out, err = cli(*flags, "--quiet", "--json", "count")
    printed = json.loads(out)
    assert (code, printed["status"]) == (1, status)
    assert printed["last_words"] == "I need one more step:"
    said = [line for line in err.splitlines() if not line.startswith("agent-demo: to continue")]
    assert said[-2:] == ["  the model last said:", "    I need one more step:"]


def test_stuck_shows_the_last_words_the_model_said_even_rounds_before(serve, cli):
    serve(["I give up on JSON for now.\n" + act("calculator", expression="1 + 1")] + [act("calculator",
                                                                                     expression="1 + 1")], key=None)
    code, out, err = cli("--quiet", "count")
    assert code == 1 and "not completed: the model is stuck" in err
    said = [line for line in err.splitlines() if not line.startswith("agent-demo: to continue")]
    assert said[-1] == "    I give up on JSON for now."


def user_settings(tmp_path, text, mode=0o600):
    """The user's own settings file, $XDG_CONFIG_HOME/agent-demo/.env (conftest points it into tmp_path)."""
    path = tmp_path / "config" / "agent-demo" / ".env"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_users_own_settings_file_is_read_after_dotenv_and_the_shell_wins_over_both(serve, cli, tmp_path,
                                                                                        monkeypatch):
    server = serve([FINISH] * 3, key=None)
    monkeypatch.delenv("LLM_API_URL")
    user_settings(tmp_path, f"LLM_API_URL={server.url}\nLLM_MODEL=from-user-file\nLLM_API_KEY={KEY}\n"
                            "AGENT_MAX_ROUNDS=4\n")
    (tmp_path / ".env").write_text("LLM_MODEL=from-dotenv\n")
    monkeypatch.setenv("AGENT_MAX_ROUNDS", "5")
    assert cli("--quiet", "hi")[:2] == (0, "done\n")
    assert server.requests[0]["body"]["model"] == "from-dotenv"
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    code, out, err = cli("--config", "--json")
    shown = json.loads(out)["settings"]
    assert shown["model"] == {"value": "from-dotenv", "source": "LLM_MODEL in ./.env"}
    assert shown["url"]["source"] == f"LLM_API_URL in {tmp_path / 'config' / 'agent-demo' / '.env'}"
    assert shown["max_rounds"] == {"value": "5", "source": "AGENT_MAX_ROUNDS in the shell"}
    assert shown["api_key"]["value"] == "[redacted]" and KEY not in out + err
    code, out, err = cli("--config", "-m", "from-flag")
    assert code == 0 and re.search(r"^model +from-flag +flag --model$", out, re.M) and KEY not in out


def test_a_settings_file_others_can_write_is_refused(cli, tmp_path):
    path = user_settings(tmp_path, "LLM_MODEL=x\n", mode=0o666)
    code, out, err = cli("hi")
    assert code == 2 and err == (f"agent-demo: error: the settings file {path} is writable by others (mode 666):"
                                 f" chmod 600 {path}\n")
    code, out, err = cli("--config", "--json")
    assert code == 0 and json.loads(out)["problem"] == (f"the settings file {path} is writable by others (mode 666):"
                                                        f" chmod 600 {path}")


@pytest.mark.parametrize("mode", ["json", "schema", "tools"])
def test_a_question_that_needs_no_tool_pays_for_a_short_prompt(serve, cli, mode):
    server = serve([act("finish", result="Paris")])
    code, out, err = cli("--tools", "none", "--mode", mode, "--no-log", "What is the capital of France?")
    light = server.requests[0]["body"]["messages"][0]["content"]
    assert (code, out.strip()) == (0, "Paris"), err
    code, out, err = cli("--mode", mode, "--no-log", "What is the capital of France?")
    full = server.requests[1]["body"]["messages"][0]["content"]
    assert len(light.split()) <= 100 < 250 <= len(full.split()), (len(light.split()), len(full.split()))
    assert "finish" in light and "fail" in light and "recall" not in light and "calculator" not in light
    assert "array" not in light and "At most" not in light, "one action: nothing of several calls at once"


def test_a_short_prompt_still_shows_the_answer_s_schema(serve, cli, tmp_path):
    server = serve([act("finish", result={"city": "Paris"})])
    schema = tmp_path / "answer.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
    code, out, err = cli("--tools", "none", "--output-schema", schema, "--no-log", "Capital of France?")
    assert code == 0 and '"city"' in server.requests[0]["body"]["messages"][1]["content"], err
    assert json.loads(out) == {"city": "Paris"}


@pytest.mark.parametrize("again", [("--resume",), ("--continue", "and in Italy?")])
def test_a_run_with_no_tool_stays_one_when_it_goes_on(serve, cli, tmp_path, again):
    server = serve(["I think it is Paris", act("finish", result="Paris")])
    trace = tmp_path / "run.jsonl"
    code, _, err = cli("--tools", "none", "--max-rounds", "1", "--trace", trace, "Capital of France?")
    assert code == 1, err
    if again[0] == "--continue":
        server.replies.insert(1, act("finish", result="Paris"))
        assert cli("--resume", trace, "--max-rounds", "3")[0] == 0
    code, _, err = cli(again[0], trace, *again[1:], "--max-rounds", "3")
    assert code == 0, err
    systems = [request["body"]["messages"][0]["content"] for request in server.requests]
    assert all(system == systems[0] for system in systems) and "recall" not in systems[-1], systems[-1]


def test_a_run_with_no_tool_still_reads_what_was_piped_in_page_by_page(serve, cli):
    server = serve([act("finish", result="read")])
    material = "".join(f"line {n}: {'x' * 60}\n" for n in range(5_000))
    code, _, err = cli("--tools", "none", "--mode", "tools", "--no-log", "sum it up", stdin=material)
    assert code == 0, err
    offered = [tool["function"]["name"] for tool in server.requests[0]["body"]["tools"]]
    assert "read_material" in offered and "read_material" in server.requests[0]["body"]["messages"][0]["content"]


def test_with_no_tool_the_schema_mode_schema_is_one_a_validator_takes(serve, cli):
    jsonschema = pytest.importorskip("jsonschema")
    server = serve([act("finish", result="Paris")])
    cli("--tools", "none", "--mode", "schema", "--no-log", "Capital of France?")
    schema = server.requests[0]["body"]["response_format"]["json_schema"]["schema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate({"actions": [{"tool": "finish", "args": {"result": "Paris"}}]}, schema)


@pytest.mark.parametrize("flags, said", [
    (("--tools", "none,calculator"), "--tools: none goes alone"),
    (("--tools", "none", "--tools-file", "tools.py"), "--tools none offers no tool: --tools-file would add none"),
])
def test_no_tool_and_a_tool_are_refused_together(serve, cli, flags, said):
    server = serve([act("finish", result="x")])
    code, _, err = cli(*flags, "--no-log", "q")
    assert code == 2 and said in err and server.requests == [], err
