"""A newcomer's first hour (issue 43): the sample traces show what the calculator gives, the examples
start the scripted server on a free port and say so in one line when it cannot start, the scripted
server answers by task, a mistyped word names the one meant."""
import json
import os
import re
import socket
from pathlib import Path

import pytest

import agent_demo
from agent_demo_kit.tools import REGISTRY, call_tool
from conftest import ROOT
from scripted_server import ByTaskText, ScriptedServer, action
from test_docs_examples import DOCS, blocks, run_as_written

WRITTEN = [path for path in DOCS if path.name != "changes.md"]  # what changed is history, not a promise


def test_the_sample_traces_show_what_the_calculator_gives():
    shown = []
    for path in WRITTEN:
        text = path.read_text(encoding="utf-8")
        shown += re.findall(r'calculator\(expression="([^"]+)"\)\nresult: (\{.*\})', text)
    assert len(shown) >= 4
    assert [(expression, call_tool("calculator", {"expression": expression}, REGISTRY))
            for expression, _ in shown] == [(expression, json.loads(result)) for expression, result in shown]


def quick_start_task():
    """The README's first command, as written: what it asks the agent."""
    [(kind, commands), *_] = blocks(DOCS[0], "## Quick start", "## Trying it without a key")
    first = commands.splitlines()[0]
    install, _, command = first.partition(" && ")
    assert (kind, install) == ("sh", "pip install -e .") and command.startswith("agent-demo ")
    return command


@pytest.mark.processes
def test_the_readmes_first_command_without_a_key_says_where_the_key_goes_and_exits_2(tmp_path):
    done = run_as_written(tmp_path, quick_start_task())
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "LLM_API_KEY" in line


# --- the scripted server: a free port, one line when it cannot start, answers by task ------------

def server_command_lines():
    """Every command line in the README's and the docs' blocks that starts the scripted server."""
    found = []
    for path in DOCS:
        for _, text in re.findall(r"```(\w*)\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            found += [(path.name, line) for line in text.splitlines() if "scripted_server.py" in line]
    return found


def test_no_example_starts_the_scripted_server_on_a_fixed_port():
    lines = server_command_lines()
    assert len(lines) >= 4
    fixed = [(where, line) for where, line in lines
             if re.search(r"scripted_server\.py(\s+[-\w.$\"]+)*\s+[0-9]+\b", line.split("#")[0])]
    assert fixed == [], "a fixed port collides with whatever else listens there"


@pytest.mark.processes
def test_the_scripted_server_in_the_background_on_a_busy_port_says_why_in_one_line_and_leaves_nothing_stale(
        tmp_path):
    (tmp_path / "replies.json").write_text('["hi"]')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_as_written(tmp_path, f"""export LLM_API_URL=http://127.0.0.1:{port}/v1 SCRIPTED_SERVER_PID=1
eval "$(python tests/scripted_server.py --background replies.json {port})"
echo "eval=$? url=${{LLM_API_URL-unset}} pid=${{SCRIPTED_SERVER_PID-unset}}"
""")
    assert done.stdout == "eval=1 url=unset pid=unset\n"
    [line] = done.stderr.splitlines()
    assert f"port {port} is in use by another server" in line and "leave the port out" in line


@pytest.mark.processes
def test_the_python_docs_runnable_example_runs_as_written(tmp_path):
    doc = Path(ROOT) / "docs" / "python.md"
    [(sh_kind, start), (python_kind, script), *_] = blocks(doc, "## A runnable example", "## `agent_demo.run(")
    assert (sh_kind, python_kind) == ("sh", "python") and script.startswith("# count_words.py\n")
    (tmp_path / "count_words.py").write_text(script)
    done = run_as_written(tmp_path, start + "python count_words.py\nkill $SCRIPTED_SERVER_PID\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "finished 3 2 0"


@pytest.mark.parametrize("mapping, problem", [
    (["a reply"], "a JSON object"),
    ({"what is 2 + 2?": []}, "a JSON object"),
])
def test_a_mapping_file_of_another_shape_is_refused_saying_what_one_looks_like(mapping, problem):
    with pytest.raises(ValueError, match=problem):
        ByTaskText(mapping)


def test_the_scripted_server_answers_each_task_by_its_text_a_reply_a_round():
    mapping = {"what is 2 + 2?": action("finish", result="4"),  # one reply, not a list: every round
               "6 times 7": [action("calculator", expression="6 * 7"), action("finish", result="42")],
               "*": [action("fail", reason="no idea")]}
    with ScriptedServer([], screen=ByTaskText(mapping)) as server:
        answers = [agent_demo.run(task, url=server.url, max_rounds=3)
                   for task in ("what is 2 + 2?", "what is 6 times 7?", "anything else")]
    assert [(result.status, result.result) for result in answers] == [
        ("finished", "4"), ("finished", "42"), ("failed", "no idea")]
    assert answers[1].calls[0]["result"] == {"ok": True, "data": 42}


# --- a mistyped word names the one meant -----------------------------------------------------------

@pytest.mark.parametrize("args, meant", [
    (["--jsn", "hi"], "--json"),
    (["--max-round=3", "hi"], None),  # a prefix argparse takes: no error at all
    (["--qiuet", "hi"], "--quiet"),
    (["--mode", "jsn", "hi"], "'json'"),
    (["--mode=shema", "hi"], "'schema'"),
])
def test_a_mistyped_flag_or_choice_says_which_one_was_meant(cli, serve, args, meant):
    serve([action("finish", result="ok")])
    code, out, err = cli(*args)
    if meant is None:
        assert code == 0, err
        return
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert f"did you mean {meant}?" in line


@pytest.mark.parametrize("keyword, meant", [
    ("max_round", "max_rounds"), ("tool", "tools"), ("on_events", "on_event"), ("outputtype", "output_type"),
    ("materials", "material"), ("apikey", "api_key"),
])
def test_a_mistyped_keyword_to_the_python_api_says_which_one_was_meant(keyword, meant):
    with pytest.raises(agent_demo.ConfigError, match=f"did you mean {meant}\\?"):
        agent_demo.run("hi", **{keyword: 1})


def test_the_keywords_a_mistyped_one_is_matched_against_are_run_s_own_and_the_settings():
    import inspect
    from agent_demo_kit.settings import CALLER_KEYWORDS
    own = [name for name, parameter in inspect.signature(agent_demo.run).parameters.items()
           if parameter.kind is parameter.KEYWORD_ONLY]
    assert set(CALLER_KEYWORDS) == set(own) | {"parallel"}  # arun's and astream's parallel=
    assert "parallel" in inspect.signature(agent_demo.arun).parameters

