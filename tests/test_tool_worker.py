"""Nothing a tool does escapes it: whatever it raises, and a --tools-file function that hangs, forks,
exits or crashes in its worker process, costs one error result, and nothing it started outlives the run."""
import asyncio
import json
import time
from pathlib import Path

import pytest

from agent_demo_kit.cli import main
from agent_demo_kit.private_files import in_use
from agent_demo_kit.settings import Settings
from conftest import KEY, said_lines
from scripted_model import ScriptedModel, run
from scripted_server import action as act
from agent_demo_kit.tools import call_tool, registry_of

FINISH = act("finish", result="done")


class Custom(BaseException):
    """Not an Exception, like asyncio.CancelledError."""


def cancelled(x: str) -> str:
    """Raise CancelledError."""
    raise asyncio.CancelledError("cancelled inside")


def custom(x: str) -> str:
    """Raise a BaseException of its own."""
    raise Custom(f"the key is {KEY}")


@pytest.mark.parametrize("function, error", [(cancelled, "cancelled failed: CancelledError: cancelled inside"),
                                             (custom, "custom failed: Custom: the key is")])
def test_a_tool_raising_a_base_exception_is_an_error_result_and_the_run_goes_on(function, error):
    registry = registry_of(function)
    assert call_tool(function.__name__, {"x": "a"}, registry)["error"].startswith(error)
    model = ScriptedModel(act(function.__name__, x="a"), FINISH)
    outcome = run("go", Settings(), model, registry=registry)
    assert (outcome.status, outcome.rounds) == ("finished", 2)
    assert error in model.requests[1]["messages"][-1]["content"]


def alive(pid):
    """Is the process still running (a zombie waiting to be reaped is not)?"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def gone(pid, within=3.0):
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


UNRULY = '''
import ctypes, os, subprocess, sys, time


class Custom(BaseException):
    pass


def leave(name: str) -> str:
    """Start a process that would run on and on, and say so."""
    child = subprocess.Popen(["sleep", "30"])
    open(name, "w").write(str(child.pid))
    return "started"


def exits(code: int) -> str:
    """End the process."""
    os._exit(code)


def crashes(x: str) -> str:
    """Crash the interpreter."""
    ctypes.string_at(0)


def raises(x: str) -> str:
    """Raise something that is not an Exception."""
    raise Custom("key " + os.environ.get("LLM_API_KEY", ""))


def forks(name: str) -> str:
    """Fork twice: one copy returns at once too, the other hangs."""
    if os.fork() == 0:
        return "from the copy"
    hanging = os.fork()
    if hanging == 0:
        time.sleep(30)
        os._exit(0)
    open(name, "w").write(str(hanging))
    return "forked"


def hangs(name: str) -> str:
    """Write its process id, then never finish."""
    open(name, "w").write(str(os.getpid()))
    time.sleep(30)


def shout(text: str) -> str:
    """Print, then shout."""
    print("printed", text)
    os.write(1, b"written to file descriptor 1\\n")
    return text.upper()
'''


@pytest.fixture
def unruly(tmp_path):
    path = tmp_path / "unruly.py"
    path.write_text(UNRULY)
    return str(path)


@pytest.mark.processes
def test_a_tool_that_exits_crashes_raises_or_forks_costs_one_error_result(serve, capfd, tmp_path, unruly):
    trace = tmp_path / "t.jsonl"
    server = serve([act("exits", code=7), act("crashes", x="a"), act("raises", x="b"), act("forks", name="copy"),
                    act("shout", text="still here"), FINISH])
    code = main(["--tools-file", unruly, "--trace", str(trace), "--json", "go"])
    out, err = capfd.readouterr()  # the worker writes to file descriptor 2 itself
    results = [server.sent_messages(n)[-1]["content"] for n in range(1, 6)]
    assert code == 0 and json.loads(out)["status"] == "finished"
    assert "exits ended the worker process (exit code 7)" in results[0]
    assert "crashes ended the worker process (signal SIGSEGV)" in results[1]
    assert "raises failed: Custom: key" in results[2]
    assert '"data": "forked"' in results[3] and "from the copy" not in results[3]
    assert '"data": "STILL HERE"' in results[4], "the copy's answer did not take the next call's place"
    assert "printed still here" in err and "written to file descriptor 1" in err
    assert KEY not in out + err
    assert json.loads(trace.read_text().splitlines()[-1])["status"] == "finished"
    assert gone(int((tmp_path / "copy").read_text())), "the forked copy ended with the run"
    assert not in_use(trace)


@pytest.mark.processes
def test_a_tool_that_hangs_is_ended_with_its_children_and_nothing_outlives_the_run(serve, capsys, tmp_path, unruly):
    server = serve([act("hangs", name="hung"), act("leave", name="left"), FINISH], key=None)
    started = time.monotonic()
    assert main(["--tools-file", unruly, "--tool-timeout", "0.3", "--quiet", "go"]) == 0
    assert capsys.readouterr().out == "done\n"
    assert "hangs did not finish within 0.3 s (--tool-timeout); it was stopped" in server.sent_messages(1)[-1][
        "content"]
    assert not alive(int((tmp_path / "hung").read_text())), "the hung call was ended at its timeout"
    assert time.monotonic() - started < 15, "a hung call costs its timeout, not a wait for the worker to exit"
    assert gone(int((tmp_path / "left").read_text())), "what a tool started ends with the run"


@pytest.mark.processes
@pytest.mark.parametrize("text, reason", [("import os\nos._exit(4)\n", "importing it ended the worker process"
                                                                        " (exit code 4)"),
                                          ("import os\nif os.fork() == 0:\n    import time; time.sleep(30)\n",
                                           "it defines no public function")])
def test_a_tools_file_that_exits_or_forks_while_loading_is_a_usage_error(serve, tmp_path, capsys, text, reason):
    server = serve([FINISH])
    path = tmp_path / "loads.py"
    path.write_text(text)
    assert main(["--tools-file", str(path), "hi"]) == 2
    assert said_lines(capsys.readouterr().err) == [f"agent-demo: error: --tools-file {path}: {reason}"]
    assert server.requests == []
