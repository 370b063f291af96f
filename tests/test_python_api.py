"""agent_demo.run: the loop from Python, on the same agent the command line runs."""
import json
import os
import subprocess
import sys
import textwrap
import threading
import zipfile
from pathlib import Path

import pytest

import agent_demo
from agent_demo_kit.cli import main
from conftest import KEY, ROOT, child_environment, said_lines
from scripted_server import ScriptedServer, action as act


def shout(text: str) -> str:
    """Say it louder.

    Args:
        text: what to say
    """
    return text.upper() + "!"


def test_a_plain_function_is_a_tool_and_the_result_says_how_the_run_went(serve):
    server = serve([act("shout", text="hi"), act("finish", result="HI!")], key=None)
    seen = []
    result = agent_demo.run("shout hi", url=server.url, tools=[shout], on_round=seen.append)
    assert (result.status, result.result, result.rounds, result.exit_code) == ("finished", "HI!", 2, 0)
    assert result.calls[0] == {"round": 1, "tool": "shout", "args": {"text": "hi"}, "result": {"ok": True,
                                                                                              "data": "HI!"}}
    assert result.usage["total_tokens"] == 30 and result.trace is None
    assert [record.number for record in seen] == [1, 2] and seen[0].calls[0].result["data"] == "HI!"
    system = server.sent_messages(0)[0]["content"]
    assert "- shout: Say it louder." in system and "- calculator:" in system, "added to the built-in tools"


def test_keywords_are_the_settings_by_their_long_names_and_win_over_the_environment(serve, monkeypatch):
    server = serve([act("calculator", expression="1 + 1")], key=None)
    monkeypatch.setenv("AGENT_MAX_ROUNDS", "5")
    monkeypatch.setenv("LLM_MODEL", "from-the-environment")
    result = agent_demo.run("add", max_rounds=2, mode="tools", max_reply_tokens=0, stream=False)
    assert (result.status, result.rounds, result.exit_code) == ("max_rounds", 2, 1)
    body = server.requests[0]["body"]
    assert body["model"] == "from-the-environment" and "tools" in body and "max_tokens" not in body
    assert "stream" not in body


@pytest.mark.processes
@pytest.mark.parametrize("settings, flags, message", [
    ({"max_rounds": 0}, ["--max-rounds", "0"], "must be at least 1, got 0"),
    ({"timeout": "soon"}, ["--timeout", "soon"], "must be a number of seconds"),
    ({"url": "ftp://x"}, ["--url", "ftp://x"], "must be an http(s) URL, got 'ftp://x'"),
    ({"max_context": 100}, ["--max-context", "100"], "max_context 100 is too small"),
    ({"check": "no-such-program-xyz"}, ["--check", "no-such-program-xyz"], "check cannot start 'no-such-program-xyz'"),
    ({"tool_names": ["nope"]}, ["--tools", "nope"], "tool_names: unknown tool nope"),
    ({"tools_files": ["/no/such.py"]}, ["--tools-file", "/no/such.py"], "tools_files /no/such.py: no such file"),
])
def test_a_bad_setting_raises_config_error_with_the_words_the_command_line_prints(serve, capsys, settings, flags,
                                                                                 message):
    server = serve([act("finish", result="x")], key=None)
    with pytest.raises(agent_demo.ConfigError) as raised:
        agent_demo.run("x", **settings)
    said = str(raised.value)
    assert message in said and raised.value.exit_code == 2
    try:
        assert main([*flags, "--no-log", "x"]) == 2
    except SystemExit as usage_error:  # a flag argparse refused
        assert usage_error.code == 2
    [line] = said_lines(capsys.readouterr().err)
    name = next(iter(settings))
    assert said.startswith(name), "the setting is named as the caller gave it"
    assert said.replace(name, flags[0]) == line[len("agent-demo: error: "):] or said[len(name):].lstrip() in line
    assert server.requests == [], "nothing was sent"


def test_an_unknown_keyword_and_a_missing_key_raise_too(monkeypatch):
    with pytest.raises(agent_demo.ConfigError, match="unknown setting 'max_round'"):
        agent_demo.run("x", max_round=3)
    with pytest.raises(agent_demo.ConfigError, match="LLM_API_KEY .* is not set, and api.openai.com needs one"):
        agent_demo.run("x")


def test_a_function_that_cannot_be_a_tool_raises_config_error():
    def no_docstring(x: int):
        return x
    with pytest.raises(agent_demo.ConfigError, match="no_docstring has no docstring"):
        agent_demo.run("x", url="http://127.0.0.1:9/v1", tools=[no_docstring])

    def calculator(expression: str) -> str:
        """A second calculator."""
    with pytest.raises(agent_demo.ConfigError, match="the tool calculator clashes"):
        agent_demo.run("x", url="http://127.0.0.1:9/v1", tools=[calculator])


def test_an_endpoint_that_fails_gives_an_error_result_not_an_exception(serve):
    server = serve([{"status": 401, "body": {"error": {"message": "bad key"}}}])
    result = agent_demo.run("x", url=server.url, api_key="sk-wrong-key-12345")
    assert (result.status, result.exit_code) == ("error", 3)
    assert result.error == "authentication failed (HTTP 401): bad key - check api_key"


def test_approve_decides_each_call(serve):
    server = serve([act("calculator", expression="1 + 1"), act("get_order_status", order_id="A1001"),
                    act("finish", result="done")], key=None)
    asked = []
    result = agent_demo.run("x", url=server.url, approve=lambda call: asked.append(call) or call["tool"] == "calculator")
    assert [call["tool"] for call in asked] == ["calculator", "get_order_status"]
    assert asked[0]["args"] == {"expression": "1 + 1"}
    assert [call["result"]["ok"] for call in result.calls[:2]] == [True, False]
    assert "did not approve" in result.calls[1]["result"]["error"]


def test_trace_is_a_file_or_the_run_log_and_the_command_line_can_take_it_up(serve, tmp_path, capsys):
    server = serve([act("calculator", expression="1 + 1")], key=None)
    path = tmp_path / "run.jsonl"
    cut_short = agent_demo.run("add", url=server.url, trace=path, max_rounds=1)
    assert cut_short.status == "max_rounds" and cut_short.trace == str(path)
    events = [json.loads(line)["event"] for line in path.read_text().splitlines()]
    assert events == ["start", "round", "end"]
    serve([act("finish", result="2")], key=None)
    assert main(["--resume", str(path), "--max-rounds", "2", "--quiet"]) == 0
    assert capsys.readouterr().out == "2\n"
    logged = agent_demo.run("add", trace=True, max_rounds=1)
    assert os.path.dirname(logged.trace) == str(tmp_path / "state" / "agent-demo" / "runs")


def test_material_is_what_the_task_is_about(serve):
    server = serve([act("finish", result="3 lines")], key=None)
    agent_demo.run("count the lines", material="a\nb\nc\n")
    assert "a\nb\nc" in server.sent_messages(0)[1]["content"]


@pytest.mark.processes
def test_importing_it_loads_neither_mcp_nor_the_terminal_nor_the_trace_files():
    code = ("import sys, agent_demo; print(sorted(m for m in sys.modules if m.startswith(('mcp', 'requests'))"
            " or m in ('agent_demo_kit.terminal', 'agent_demo_kit.trace_file', 'agent_demo_kit.run_log',"
            " 'agent_demo_kit.cli')));"
            " import agent_demo_kit.mcp_client; print('mcp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out == "[]\nFalse\n", "nor the MCP SDK when its module is imported, until a server is named"


@pytest.mark.processes
def test_a_script_outside_the_checkout_runs_a_task_with_its_own_tool(tmp_path):
    """As a user would: the installed package, from a folder of their own, against an endpoint."""
    script = tmp_path / "my_agent.py"
    script.write_text(textwrap.dedent('''
        import sys
        import agent_demo

        def word_count(text: str) -> int:
            """Count the words in a text.

            Args:
                text: the text
            """
            return len(text.split())

        result = agent_demo.run("how many words?", url=sys.argv[1], tools=[word_count], max_rounds=3)
        print(result.status, result.result, result.rounds, result.exit_code)
        print(agent_demo.__file__)
    '''))
    with ScriptedServer([act("word_count", text="one two three"), act("finish", result=3)]) as server:
        env = {name: value for name, value in child_environment().items() if name != "PYTHONPATH"}
        out = subprocess.run([sys.executable, str(script), server.url], capture_output=True, text=True,
                             cwd=tmp_path, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    summary, where = out.stdout.splitlines()
    assert summary == "finished 3 2 0"
    assert not where.startswith(str(tmp_path)), "the installed agent_demo, not a copy in the folder"
    assert json.loads(server.requests[1]["body"]["messages"][-1]["content"].split("\n")[1])["result"] == {
        "ok": True, "data": 3}


def test_the_key_never_reaches_the_result_or_the_endpoint_from_a_tool(serve):
    def leak() -> str:
        """Return a secret."""
        return f"the key is {KEY}"
    server = serve([act("leak"), act("finish", result="ok")])
    result = agent_demo.run("x", tools=[leak])
    assert KEY not in json.dumps(result.calls) and KEY not in json.dumps(server.requests[1]["body"])


def test_a_key_given_as_a_keyword_is_redacted_like_one_from_the_environment(serve, tmp_path):
    secret = "sk-given-as-keyword-0123456789"

    def echo_key() -> str:
        """Return the key."""
        return f"key={secret}"
    server = serve([act("echo_key"), {"status": 401, "body": {"error": {"message": f"Incorrect API key: {secret}"}}}],
                   key=None)
    result = agent_demo.run("x", api_key=secret, tools=[echo_key], trace=tmp_path / "t.jsonl")
    assert result.status == "error" and "Incorrect API key: [redacted]" in result.error
    assert secret not in (tmp_path / "t.jsonl").read_text() and secret not in json.dumps(result.calls)
    assert secret not in json.dumps(server.requests[1]["body"])
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {secret}"


@pytest.mark.parametrize("where", ["approve", "on_round"])
def test_an_exception_in_the_callers_own_function_reaches_the_caller_and_ends_the_run(serve, tmp_path, where):
    serve([act("calculator", expression="1 + 1"), act("finish", result="2")], key=None)

    def broken(*args):
        raise ValueError("my bug")
    with pytest.raises(ValueError, match="my bug"):
        agent_demo.run("x", trace=tmp_path / "t.jsonl", **{where: broken})
    end = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[-1])
    assert end["event"] == "end" and end["error"] == f"the {where} function raised: ValueError: my bug"


def test_approve_must_be_a_function():
    with pytest.raises(agent_demo.ConfigError, match="approve must be a function that decides each call, got True"):
        agent_demo.run("x", url="http://127.0.0.1:9/v1", approve=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel as pip would install it: its files unpacked into a folder of their own."""
    from hatchling.builders.wheel import WheelBuilder
    built = tmp_path_factory.mktemp("wheel")
    [wheel] = WheelBuilder(ROOT).build(directory=str(built), versions=["standard"])
    site = built / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
        names = archive.namelist()
    return site, names


def test_the_wheel_installs_no_module_with_a_generic_name(installed):
    _, names = installed
    top_level = sorted({name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")})
    assert top_level == ["agent_demo.py", "agent_demo_kit"]
    in_the_package = {f"agent_demo_kit/{path.name}" for path in [*Path(ROOT).glob("*.py"), *Path(ROOT).glob("agent_demo_kit/*.py")]
                      if path.name != "agent_demo.py"}
    assert in_the_package <= set(names), "every module is installed"


@pytest.mark.processes
def test_a_folder_with_its_own_tools_py_and_prompts_py_runs_the_installed_agent(installed, serve, tmp_path):
    site, _ = installed
    server = serve([act("word_count", text="one two three"), act("finish", result=3)], key=None)
    (tmp_path / "tools.py").write_text("def helper():\n    return 'my own tools'\n")
    (tmp_path / "prompts.py").write_text("PROMPT = 'my own prompts'\n")
    (tmp_path / "script.py").write_text(textwrap.dedent(f'''\
        import tools, prompts
        import agent_demo, agent_demo_kit.tools

        def word_count(text: str) -> int:
            """Count the words.

            Args:
                text: the text
            """
            return len(text.split())

        result = agent_demo.run("count", url={server.url!r}, tools=[word_count])
        print(result.status, result.result, tools.helper(), prompts.PROMPT)
        print(agent_demo.__file__, agent_demo_kit.tools.__file__)
        '''))
    shown = subprocess.run([sys.executable, "script.py"], capture_output=True, text=True, cwd=tmp_path,
                           env=child_environment({"PYTHONPATH": str(site)}))
    assert shown.returncode == 0, shown.stderr
    said, where = shown.stdout.splitlines()
    assert said == "finished 3 my own tools my own prompts"
    assert where == f"{site / 'agent_demo.py'} {site / 'agent_demo_kit' / 'tools.py'}", "the installed files ran"


def test_runs_in_threads_share_connections_to_the_endpoint(serve):
    server = serve([], key=None)
    server.screen = lambda body: {"content": act("finish", result="done")}
    threads = 8
    results = []

    def work():
        for _ in range(5):
            results.append(agent_demo.run("x", url=server.url))
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [result.status for result in results] == ["finished"] * 40
    assert 1 <= server.connections <= threads, "no more connections than runs at once"


@pytest.mark.processes
def test_an_installed_agent_without_a_key_says_where_one_goes_not_a_file_it_lacks(installed, tmp_path):
    site, _ = installed
    shown = subprocess.run([sys.executable, "-c", "import sys; from agent_demo_kit.cli import main; sys.exit(main(['hi']))"],
                           capture_output=True, text=True, cwd=tmp_path, env=child_environment({"PYTHONPATH": str(site)}))
    assert shown.returncode == 2, shown.stderr
    assert ".env.example" not in shown.stderr and "~/.config/agent-demo/.env" in shown.stderr
