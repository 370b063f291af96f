"""A task file is JSON Lines or plain-text lines, and nothing else is taken for one: a line of another
format (a CSV or TSV header, a JSON array, YAML) would reach the model as a task with what it
expects inside; a key no task line knows (a typo of "expected") would score nothing (issue 42,
finding 12; issue 43, item 6)."""
import json

import pytest

from scripted_server import ScriptedServer, action


@pytest.fixture
def server(monkeypatch):
    with ScriptedServer([], screen=lambda body: action("finish", result="4")) as scripted:
        monkeypatch.setenv("LLM_API_URL", scripted.url)
        yield scripted


@pytest.mark.parametrize("name, text, seen", [
    ("tasks.txt", "question,answer\nWhat is 2+2?,4\n", "CSV with a header (question,answer)"),
    ("tasks.txt", '"id","task","expected"\n1,What is 2+2?,4\n', "CSV with a header (id,task,expected)"),
    ("tasks.txt", "input\ttarget\nWhat is 2+2?\t4\n", "TSV with a header (input,target)"),
    ("tasks.json", '[{"task": "What is 2+2?", "expected": "4"}]\n', "a JSON array"),
    ("tasks.txt", '"What is 2+2?"\n', "a JSON text"),
    ("tasks.txt", "- task: What is 2+2?\n  expected: 4\n", "YAML or a mapping (its key 'task')"),
    ("tasks.txt", "What is 2+2?\nexpected: 4\n", "YAML or a mapping (its key 'expected')"),
    ("tasks.csv", "What is 2+2?\n", "is CSV by its name"),
    ("promptfoo.yaml", "tests:\n", "is YAML by its name"),
])
def test_a_file_of_another_format_is_refused_naming_it_and_nothing_is_sent(tmp_path, cli, server, name, text, seen):
    path = tmp_path / name
    path.write_text(text)
    code, out, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0), err
    assert seen in err and "a task file is JSON Lines" in err


@pytest.mark.parametrize("line, key, near", [
    ({"task": "What is 2+2?", "expectd": "4"}, "expectd", "expected"),
    ({"input": "What is 2+2?", "task": "x", "target": "4"}, "input", None),
    ({"task": "What is 2+2?", "Expected": "4"}, "Expected", "expected"),
])
def test_a_key_no_task_line_knows_is_refused_with_the_nearest_one(tmp_path, cli, server, line, key, near):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(line) + "\n")
    code, out, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0), err
    assert f'line 1: "{key}" is no key of a task line' in err
    assert (f'did you mean "{near}"?' in err) if near else "did you mean" not in err


@pytest.mark.parametrize("text", ["What is 2+2?\ncompute 2, 3\nsay hello, world\nGive the answer: 42\n",
                                  '{"task": "What is 2+2?", "expected": "4"}\n'])
def test_plain_tasks_and_json_lines_still_run_and_expected_never_reaches_a_request(tmp_path, cli, server, text):
    path = tmp_path / "tasks.jsonl"
    path.write_text(text)
    code, out, err = cli("--batch", path)
    assert code == 0, err
    assert server.requests and all('"expected"' not in json.dumps(request["body"]) for request in server.requests)
