"""Issue 42, finding 1: every child agent-demo starts (the regex judge, a check, the tools worker, an
MCP server) runs isolated from the folder it was started in: a json.py or re.py that someone left
beside a task file, or in a team folder a batch runs from, is never imported, and no child learns
the key."""
import importlib.util
import json
import os
import shlex
import sys

import pytest

from conftest import KEY, ROOT
from scripted_server import ScriptedServer, action

pytestmark = pytest.mark.processes  # each test starts a child: that is the point

# Modules every Python child imports one of, planted in the folder agent-demo runs from: each one,
# imported, writes down the key it was given (or that it was given none).
PLANTED = ("json", "re", "socket", "struct", "select", "runpy")


def plant(folder, marker):
    for name in PLANTED:
        (folder / f"{name}.py").write_text(
            f"import os\nopen({str(marker)!r}, 'a').write({name!r} + ' ' + os.environ.get('LLM_API_KEY', 'no key') + '\\n')\n")


def python(code, *args):
    """A command line running this Python on `code` with -c, as a user would write it."""
    return " ".join(shlex.quote(word) for word in (sys.executable, "-c", code, *args))


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """The folder agent-demo runs from holds modules someone planted; the marker file they write."""
    folder = tmp_path / "team"
    folder.mkdir()
    marker = tmp_path / "planted-ran"
    plant(folder, marker)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("LLM_API_KEY", KEY)
    return marker


def test_the_regex_judge_imports_nothing_from_the_current_folder_and_gets_no_key(planted, cli, monkeypatch):
    from agent_demo_kit import scoring
    scoring.REGEX.close()  # a judge started by an earlier test would hide how a new one starts
    (planted.parent / "team" / "tasks.jsonl").write_text(
        json.dumps({"id": "r", "task": "compute 512", "expected": r"^5\d\d$", "match": "regex"}) + "\n")
    with ScriptedServer([], screen=lambda body: action("finish", result="512")) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--batch", "tasks.jsonl", "--json")
    assert not planted.exists(), planted.read_text()
    assert code == 0 and json.loads(out)["correct"] == 1


def test_a_check_runs_no_python_module_from_the_current_folder_and_gets_no_key(planted, cli, monkeypatch):
    check = python("import json, os, sys; sys.exit(0 if 'LLM_API_KEY' not in os.environ else 3)")
    with ScriptedServer([action("finish", result="4")]) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--check", check, "compute 2 + 2")
    assert not planted.exists(), planted.read_text()
    assert code == 0 and out.strip() == "4"


def test_the_tools_worker_imports_nothing_from_the_current_folder_and_gets_no_key(planted, cli, monkeypatch,
                                                                                    tmp_path):
    tools_file = tmp_path / "mine" / "my_tools.py"
    tools_file.parent.mkdir()
    tools_file.write_text('import os\n\ndef has_key() -> bool:\n    """Whether this process sees a key."""\n'
                          '    return "LLM_API_KEY" in os.environ\n')
    with ScriptedServer([action("has_key"), action("finish", result="done")]) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--tools-file", tools_file, "does the tool see a key?")
        fed_back = json.dumps(server.requests[1]["body"]["messages"])
    assert not planted.exists(), planted.read_text()
    assert code == 0 and '\\"data\\": false' in fed_back


@pytest.mark.skipif(importlib.util.find_spec("mcp") is None, reason="needs the mcp package (Python 3.10+)")
def test_an_mcp_server_s_python_imports_nothing_from_the_current_folder(planted, cli, monkeypatch):
    bare = os.path.join(ROOT, "tests", "mcp_servers", "bare.py")
    server_command = python("import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')", bare)
    with ScriptedServer([action("echo", text="hi"), action("finish", result="said")]) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        code, out, err = cli("--mcp", server_command, "say hi")
    assert not planted.exists(), planted.read_text()
    assert code == 0 and out.strip() == "said"


# --- finding 10: a regex is scored once, and judges run side by side --------------------------------

def test_a_rerun_with_nothing_to_run_scores_no_regex_again(tmp_path, cli, monkeypatch):
    from agent_demo_kit import scoring
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{n}", "task": f"compute {n}", "expected": r"^\d+$",
                                         "match": "regex"}) + "\n" for n in range(3)))
    searched = []
    search = scoring.REGEX.search
    monkeypatch.setattr(scoring.REGEX, "search", lambda pattern, text: (text is not None and searched.append(text))
                        or search(pattern, text))  # a search of an answer (not the pattern's check as it is read)
    with ScriptedServer([], screen=lambda body: action("finish", result="42")) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        monkeypatch.setenv("LLM_API_KEY", KEY)
        first = cli("--batch", tasks, "--json")
        assert len(searched) == 3 and json.loads(first[1])["correct"] == 3
        again = cli("--batch", tasks, "--json")
    assert len(searched) == 3, "the second run scored the ended tasks again"
    assert json.loads(again[1])["correct"] == 3 and len(server.requests) == 3


def test_a_slow_regex_holds_up_no_other_search(monkeypatch):
    import subprocess
    import threading
    from agent_demo_kit import scoring
    monkeypatch.setattr(scoring, "REGEX_SECONDS", 30.0)
    started, popen = threading.Event(), subprocess.Popen

    def starting(*args, **kwargs):
        process = popen(*args, **kwargs)
        started.set()
        return process
    monkeypatch.setattr(subprocess, "Popen", starting)
    judge = scoring.RegexJudge()
    slow = threading.Thread(target=judge.search, args=(r"^(a|a)+$", "a" * 40 + "!"), daemon=True)
    try:
        slow.start()
        assert started.wait(30), "the slow search started its judge"
        assert judge.search(r"^\d+$", "1536") is True
        assert slow.is_alive(), "the quick search waited for the slow one"
    finally:
        judge.close()
        slow.join(35)
