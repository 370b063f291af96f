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
    ("tasks.txt", "Question,Expected Answer\nWhat is 2+2?,4\n", "CSV with a header (Question,Expected Answer)"),
    ("tasks.txt", '"What is 2+2?",4\n', "CSV (a row of quoted fields)"),
    ("tasks.txt", "What is 2+2?\t4\n", "TSV (fields apart by a tab)"),
    ("tasks.txt", "| task | expected answer |\n|---|---|\n| What is 2+2? | 4 |\n", "a Markdown table"),
    ("tasks.txt", "---\n- What is 2+2?\n", "YAML (a document marker)"),
    ("tasks.txt", '- {task: "What is 2+2?", expected: "4"}\n', "YAML or a mapping (its key 'task')"),
    ("tasks.txt", "What is 2+2?\nWhat is 3+3? Expected: 6\n", "YAML or a mapping (its key 'Expected')"),
    ("tasks.txt", "What is 2+2? Answer: 4\n", "YAML or a mapping (its key 'Answer')"),
    ("tasks.txt", "What is 2+2? expected=4\n", "YAML or a mapping (its key 'expected')"),
    ("tasks.txt", 'task = "What is 2+2?"\n', "YAML or a mapping (its key 'task')"),
    ("tasks.txt", "What is 2+2? <answer>4</answer>\n", "XML (its tag <answer>)"),
    ("tasks.txt", '[[tests]]\ntask = "What is 2+2?"\n', "a TOML or INI table header"),
    ("tasks.txt", "42\n", "a JSON value"),
    ("tasks.json", '{"tasks": [{"task": "What is 2+2?", "expected": "4"}]}\n', "a JSON object holding the tasks"),
    ("tasks.json", '{\n  "task": "What is 2+2?",\n  "expected": "4"\n}\n', "not a JSON object on one line"),
    ("tasks.csv", "What is 2+2?\n", "is CSV by its name"),
    ("promptfoo.yaml", "tests:\n", "is YAML by its name"),
])
def test_a_file_of_another_format_is_refused_naming_it_and_nothing_is_sent(tmp_path, cli, server, name, text, seen):
    path = tmp_path / name
    path.write_text(text)
    code, out, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0), err
    assert seen in err and ("a task file is JSON Lines" in err or "one {\"task\": ...} object a line" in err)
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("line, keys, meant", [
    ({"task": "What is 2+2?", "expectd": "4"}, '"expectd" is no key', '(did you mean "expected"?)'),
    ({"task": "What is 2+2?", "Expected": "4"}, '"Expected" is no key', '(did you mean "expected"?)'),
    ({"input": "What is 2+2?", "target": "4"}, '"input", "target" are no keys',  # inspect's
     '(did you mean "task" for "input", "expected" for "target"?)'),
    ({"input": [{"role": "user", "content": "What is 2+2?"}], "ideal": "4"}, '"ideal", "input" are no keys',  # evals'
     '(did you mean "expected" for "ideal", "task" for "input"?)'),
    ({"input": "What is 2+2?", "task": "x", "target": "4"}, '"input", "target" are no keys',
     '(did you mean "expected" for "target"?)'),  # "task" it has
    ({"task": "What is 2+2?", "metadata": {"level": 1}}, '"metadata" is no key', None),
])
def test_a_key_no_task_line_knows_is_refused_naming_the_keys_and_the_nearest_ones(tmp_path, cli, server, line,
                                                                                   keys, meant):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(line) + "\n")
    code, out, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0), err
    [said] = err.splitlines()
    assert f"line 1: {keys} of a task line" in said and "a task line knows id, task, check, expected, match" in said
    assert (meant in said) if meant else "did you mean" not in said


@pytest.mark.parametrize("text", ["What is 2+2?\ncompute 2, 3\nsay hello, world\nGive the answer: 42\n",
                                  "What is expected of a guest?\nname the target of a sale\ncompute (12 + 500) * 3\n",
                                  '{"task": "What is 2+2?", "expected": "4"}\n'])
def test_plain_tasks_and_json_lines_still_run_and_expected_never_reaches_a_request(tmp_path, cli, server, text):
    path = tmp_path / "tasks.jsonl"
    path.write_text(text)
    code, out, err = cli("--batch", path)
    assert code == 0, err
    assert server.requests and all('"expected"' not in json.dumps(request["body"]) for request in server.requests)


ANSWER_KEYS = ["expected", "answer", "target", "ideal", "label", "solution", "reference", "ground_truth", "gold",
               "expected_output", "Expected", "ANSWER"]
SYNTAXES = ["{k}: 4", "- {k}: 4", "  {k}: '4'", "{k} = 4", "{k}=4", '"task": "What is 2+2?", "{k}": "4"',
            '- {{task: "What is 2+2?", {k}: 4}}', "What is 2+2? {K}: 4", "What is 2+2? <{k}>4</{k}>",
            "What is 2+2?\t4", '{{"input": "What is 2+2?", "{k}": "4"}}']


@pytest.mark.parametrize("key", ANSWER_KEYS)
@pytest.mark.parametrize("syntax", SYNTAXES)
def test_an_answer_in_any_syntax_never_becomes_a_task_text(key, syntax):
    from agent_demo_kit.endings import ConfigError
    from agent_demo_kit.task_file import read_tasks
    line = syntax.format(k=key, K=key.capitalize())
    with pytest.raises(ConfigError, match="line 2"):
        read_tasks(f"What is 3+3?\n{line}\n", "tasks.txt")
