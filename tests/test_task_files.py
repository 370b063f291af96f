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
    ("tasks.json", '[{"task": "What is 2+2?", "expected": "4"}]\n', "a JSON array"),
    ("tasks.txt", '"What is 2+2?"\n', "a JSON text"),
    ("tasks.txt", "- task: What is 2+2?\n  expected: 4\n", "YAML or a mapping (its key 'task')"),
    ("tasks.txt", "What is 2+2?\nexpected: 4\n", "YAML or a mapping (its key 'expected')"),
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
    ("tasks.parquet", "PAR1\n", "is Parquet by its name"),
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
    ({"input": "What is 2+2?", "task": "x", "target": "4"}, '"input", "target" are no keys',
     '(did you mean "expected" for "target"?)'),  # "task" it has: no inspect sample
    ({"task": "What is 2+2?", "level": 1}, '"level" is no key', None),
])
def test_a_key_no_task_line_knows_is_refused_naming_the_keys_and_the_nearest_ones(tmp_path, cli, server, line,
                                                                                   keys, meant):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(line) + "\n")
    code, out, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0), err
    [said] = err.splitlines()
    assert f"line 1: {keys} of a task line" in said and "a task line knows id, task, check, expected, match, metadata" in said
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


# inspect's sample dataset and OpenAI evals' samples, as their own docs write them.
INSPECT = [{"id": f"q{n}", "input": f"What is {n} + {n}?", "target": str(2 * n),
            "metadata": {"category": "add" if n < 6 else "double", "difficulty": n % 2}} for n in range(10)]
EVALS = [{"input": [{"role": "system", "content": "Answer with a number."},
                    {"role": "user", "content": f"What is {n} times 3?"}], "ideal": [str(3 * n), f"{3 * n}.0"]}
         for n in range(10)]


def answering(body):
    """A model that adds right and multiplies right but for 9 (and never sees an answer)."""
    task = body["messages"][1]["content"]
    numbers = [int(word.strip("?")) for word in task.split() if word.strip("?").isdigit()]
    answer = numbers[0] * 3 if "times" in task else numbers[0] * 2 if numbers[0] < 8 else 0
    return action("finish", result=str(28 if "9 times" in task else answer))


@pytest.mark.parametrize("samples, right", [(INSPECT, 8), (EVALS, 9)], ids=["inspect", "openai-evals"])
def test_a_peers_samples_run_as_they_are_and_their_answers_never_reach_a_request(tmp_path, cli, monkeypatch,
                                                                                   samples, right):
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    with ScriptedServer([], screen=answering) as scripted:
        monkeypatch.setenv("LLM_API_URL", scripted.url)
        code, out, err = cli("--batch", path, "--json", "-q")
    summary = json.loads(out)
    assert (summary["tasks"], summary["scored"], summary["correct"]) == (10, 10, right), err
    tasks = [body["body"]["messages"][1]["content"] for body in scripted.requests]
    if samples is EVALS:
        assert "Task: system: Answer with a number.\n\nuser: What is 0 times 3?" in tasks
    sent = json.dumps([request["body"] for request in scripted.requests])
    assert '"ideal"' not in sent and '"target"' not in sent and "difficulty" not in sent
    assert all(f"{3 * n}.0" not in sent for n in range(1, 10)), "an answer is never part of the task"


def inspect_results(tmp_path, cli, monkeypatch):
    """The folder of a batch of the inspect samples, answered by `answering`."""
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(sample) + "\n" for sample in INSPECT))
    with ScriptedServer([], screen=answering) as scripted:
        monkeypatch.setenv("LLM_API_URL", scripted.url)
        cli("--batch", path, "-q")
    return tmp_path / "samples-results" / "gpt-4o-mini"


def test_groups_of_the_tasks_metadata_are_figures_of_their_own(tmp_path, cli, monkeypatch):
    folder = inspect_results(tmp_path, cli, monkeypatch)
    code, out, _ = cli("--summary", folder, "--json")
    groups = json.loads(out)["groups"]
    assert groups["category"]["add"] == {"runs": 6, "success_rate": 1.0, "scored": 6, "correct": 6, "accuracy": 1.0}
    assert groups["category"]["double"]["correct"] == 2 and groups["category"]["double"]["accuracy"] == 0.5
    assert set(groups["difficulty"]) == {"0", "1"}
    code, out, _ = cli("--summary", folder)
    assert "by category      add 100.0% (6 of 6); double 50.0% (2 of 4)" in out, out


@pytest.mark.parametrize("lines, said", [
    ([{"input": "x", "target": "1", "choices": ["a", "b"]}], '"choices" of inspect\'s format is not read here'),
    ([{"task": "x"}, {"input": "y", "target": "1"}], "line 2 is a task of inspect's format, where the file's first"
                                                     " task is of agent-demo's"),
    ([{"input": "y", "target": "1"}, "plain words"], "line 2 is a line of plain text, where the file's first task"
                                                     " is of inspect's format"),
    ([{"input": [{"content": "no role"}], "ideal": "1"}], '"input" of OpenAI evals\'s format must be a text or a'
                                                           " list of chat messages"),
])
def test_a_peers_sample_that_cannot_be_read_as_it_is_is_refused_naming_why(tmp_path, cli, server, lines, said):
    path = tmp_path / "samples.jsonl"
    path.write_text("".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines))
    code, _, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0) and said in err, err


@pytest.mark.parametrize("name, text", [
    ("tasks.txt", "question,answer\nWhat is 2+2?,4\nWhat is 3+3?,6\n"),
    ("tasks.txt", '"id","task","expected"\n1,What is 2+2?,4\n2,"What is 3+3, said in words?",6\n'),
    ("tasks.txt", "input\ttarget\nWhat is 2+2?\t4\nWhat is 3+3?\t6\n"),
    ("tasks.csv", "Question,Expected Answer,category\nWhat is 2+2?,4,add\nWhat is 3+3?,6,add\n"),
    ("tasks.tsv", "prompt\tideal\nWhat is 2+2?\t4\nWhat is 3+3?\t6\n"),
])
def test_csv_or_tsv_with_a_header_runs_as_it_is_and_its_answers_never_reach_a_request(tmp_path, cli, server, name,
                                                                                        text):
    path = tmp_path / name
    path.write_text(text)
    code, out, err = cli("--batch", path, "--json", "-q")
    summary = json.loads(out)
    assert (summary["tasks"], summary["scored"], summary["correct"]) == (2, 2, 1), err  # the model says 4 each time
    sent = [request["body"]["messages"][1]["content"] for request in server.requests]
    assert sorted(sent)[0] == "Task: What is 2+2?" and all("6" not in task.replace("3+3", "") for task in sent)


def test_fields_say_which_key_or_column_is_the_task_and_what_is_expected(tmp_path, cli, server):
    path = tmp_path / "gsm.jsonl"
    path.write_text(json.dumps({"idx": 7, "question": "What is 2+2?", "answer": "4", "source": "x"}) + "\n")
    code, out, err = cli("--batch", path, "--json", "--fields", "task=question,expected=answer,id=idx")
    summary = json.loads(out)
    assert (code, summary["correct"]) == (0, 1), err
    assert (tmp_path / "gsm-results" / "gpt-4o-mini" / "traces" / "7.jsonl").exists()
    assert "--fields: source not read" in err
    code, _, err = cli("--batch", path)
    assert code == 2 and "(--fields names others)" in err
    csv = tmp_path / "q.csv"
    csv.write_text("Prompt Text,Gold Label\nWhat is 2+2?,4\n")
    code, _, err = cli("--batch", csv)
    assert code == 2 and "no column of its header (Prompt Text, Gold Label) is the task: name one with --fields" in err
    code, out, err = cli("--batch", csv, "--fields", "task=Prompt Text,expected=Gold Label", "--json", "-q")
    assert (code, json.loads(out)["correct"]) == (0, 1), err
    code, _, err = cli("--batch", csv, "--fields", "expected=Gold Label")
    assert code == 2 and "--fields: name the task's column" in err
    code, _, err = cli("--batch", csv, "--fields", "task=Prompt Text,expected=Prompt Text")
    assert code == 2 and "--fields: each key needs a column of its own" in err
    code, _, err = cli("--batch", csv, "--fields", "task=Gold Label,task=Prompt Text")
    assert code == 2 and "--fields: task is named twice (task=Gold Label, task=Prompt Text)" in err, err


def test_groups_are_rows_of_the_markdown_tables_too(tmp_path, cli, monkeypatch):
    code, out, _ = cli("--summary", inspect_results(tmp_path, cli, monkeypatch), "--markdown")
    assert "| by category: add | 100.0% of 6 |" in out and "| by category: double | 50.0% of 4 |" in out, out


@pytest.mark.parametrize("text, said", [
    ("question,question\nq1,q2\n", "its header names a column twice (question, question)"),
    ("question,prompt\nq1,q2\n", "its header names the task twice (question, prompt)"),
    ("question,answer\nq1\n", "line 2: 1 fields where its header has 2"),
    ("question,answer\n,4\n", 'line 2: "task" must be a text that is not empty'),
])
def test_csv_that_cannot_be_read_as_tasks_is_refused_naming_the_line(tmp_path, cli, server, text, said):
    path = tmp_path / "tasks.csv"
    path.write_text(text)
    code, _, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0) and said in err, err


@pytest.mark.parametrize("name, text", [
    ("q.csv", "Prompt Text,answer,category\nWhat is 2+2?,4,add\nWhat is 3+3?,6,add\n"),
    ("q.jsonl", json.dumps({"Prompt Text": "What is 2+2?", "expected": "4", "id": "a"}) + "\n"
     + json.dumps({"Prompt Text": "What is 3+3?", "expected": "6", "id": "b"}) + "\n"),
])
def test_fields_that_name_only_the_task_leave_the_other_columns_to_their_names(tmp_path, cli, server, name, text):
    path = tmp_path / name
    path.write_text(text)
    code, out, err = cli("--batch", path, "--json", "--fields", "task=Prompt Text")
    summary = json.loads(out)
    assert (code, summary["scored"], summary["correct"]) == (1, 2, 1), err  # the model says 4 each time
    assert "--fields: read by name: " in err and "as what is expected" in err, err
    sent = [request["body"]["messages"][1]["content"] for request in server.requests]
    assert all("6" not in task.replace("3+3", "") for task in sent)


def test_fields_refuse_two_keys_read_as_one_by_their_names(tmp_path, cli, server):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"q": "Q1", "expected": "E1", "answer": "A1", "id": "x", "name": "z"}) + "\n")
    code, _, err = cli("--batch", path, "--fields", "task=q")
    assert code == 2 and "'expected' and 'answer' are both what is expected by their names" in err, err
    assert server.requests == []


def test_a_folder_of_another_task_files_results_is_refused_not_emptied(tmp_path, cli, server):
    (tmp_path / "tests.csv").write_text("question,answer\nWhat is 2+2?,4\nWhat is 3+3?,6\n")
    (tmp_path / "tests.jsonl").write_text(json.dumps({"task": "What is 5+5?", "expected": "10"}) + "\n")
    assert cli("--batch", tmp_path / "tests.csv", "-q")[0] == 1
    folder = tmp_path / "tests-results" / "gpt-4o-mini"
    before = (folder / "results.jsonl").read_text()
    sent = len(server.requests)
    code, _, err = cli("--batch", tmp_path / "tests.jsonl", "-q")
    assert (code, len(server.requests)) == (2, sent), err
    assert f"holds the results of another task file ({tmp_path / 'tests.csv'})" in err, err
    assert (folder / "results.jsonl").read_text() == before


def test_dataset_folders_whose_names_differ_after_a_dot_get_folders_of_their_own(tmp_path):
    from agent_demo_kit.batch_folder import default_out
    for name in ("ds.v1", "ds.v2"):
        (tmp_path / name).mkdir()
    assert default_out(f"{tmp_path}/ds.v1/", "m") == tmp_path / "ds.v1-results" / "m"
    assert default_out(str(tmp_path / "ds.v2"), "m") == tmp_path / "ds.v2-results" / "m"
    assert default_out(str(tmp_path / "tests.jsonl"), "m") == tmp_path / "tests-results" / "m"


def test_a_refused_shard_leaves_no_empty_results_file(tmp_path, cli, server):
    path = tmp_path / "six.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{n}", "task": f"What is {n}+{n}?"}) + "\n" for n in range(6)))
    assert cli("--batch", path, "-m", "a", "--out", tmp_path / "sh", "--shard", "0/2", "-q")[0] == 0
    code, _, err = cli("--batch", path, "-m", "b", "--out", tmp_path / "sh", "--shard", "1/2")
    assert code == 2 and "another configuration" in err, err
    assert not (tmp_path / "sh" / "results-1of2.jsonl").exists()
