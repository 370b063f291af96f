"""promptfoo's test cases run as they are (issue 45): its CSV (__expected assertions, __description,
__metadata:NAME) and its YAML (a list of test cases, or a promptfooconfig with prompts and tests).
A test is right when all its asserts pass, as promptfoo counts it; an assert that cannot be scored
here is refused, naming it; no assert ever reaches a request."""
import json

import pytest

from scripted_server import ScriptedServer, action

# What a model answers, by a word of its task.
ANSWERS = {"France": "Paris", "Germany": "Berlin, not Munich", "Japan": "Tokyo", "2+2": "4",
           "prime": "101", "hello": "Hello there", "Italy": "I don't know"}


def answering(body):
    task = body["messages"][1]["content"]
    return action("finish", result=next((said for word, said in ANSWERS.items() if word in task), "no idea"))


@pytest.fixture
def server(monkeypatch):
    with ScriptedServer([], screen=answering) as scripted:
        monkeypatch.setenv("LLM_API_URL", scripted.url)
        yield scripted


def results(folder):
    return {line["id"]: line for line in map(json.loads, (folder / "results.jsonl").read_text().splitlines())}


def sent(server):
    return json.dumps([request["body"] for request in server.requests])


# --- what an assert says of an answer -----------------------------------------------------------

@pytest.mark.parametrize("kind, value, answer, passes", [
    ("equals", "Paris", "Paris", True),
    ("equals", "Paris", "Paris.", False),
    ("equals", "Paris", " Paris", False),  # promptfoo compares the output as it is
    ("equals", "Paris", "paris", False),
    ("equals", 4, "4", True),
    ("equals", 4, 4, True),  # a typed output: compared as promptfoo's JSON text of it
    ("equals", 1.0, "1", True),  # a number as JavaScript writes it
    ("equals", {"city": "Paris"}, '{"city":  "Paris"}', True),
    ("equals", {"city": "Paris"}, {"city": "Paris"}, True),
    ("equals", {"n": 1}, '{"n": true}', False),
    ("equals", {"n": 1}, "not JSON", False),
    ("not-equals", {"n": 1}, "not JSON", False),  # promptfoo: an output that is not JSON fails either way
    ("contains", "Paris", "It is Paris.", True),
    ("contains", "paris", "It is Paris.", False),
    ("contains", 42, "the answer is 42", True),
    ("contains", '"city":"Paris"', {"city": "Paris"}, True),
    ("icontains", "paris", "It is PARIS.", True),
    ("not-contains", "London", "Paris", True),
    ("not-contains", "London", "Paris or London", False),
    ("not-icontains", "london", "LONDON", False),
    ("starts-with", "Hello", "Hello there", True),
    ("starts-with", "Hello", " Hello", False),
    ("not-starts-with", "Hello", "Hi", True),
    pytest.param("regex", r"^\d+$", "101", True, marks=pytest.mark.processes),
    pytest.param("regex", r"^\d+$", "101 apples", False, marks=pytest.mark.processes),
    pytest.param("not-regex", "(?i)sorry", "Sorry, I cannot", False, marks=pytest.mark.processes),
    pytest.param("not-regex", "(a+)+b|secret", "a" * 40 + " the secret is 42", False, marks=pytest.mark.processes),
    pytest.param("regex", "(a+)+b|secret", "a" * 40 + " the secret is 42", False, marks=pytest.mark.processes),
    ("contains-any", ["Tokyo", "東京"], "東京です", True),
    ("contains-all", ["a", "b"], "a only", False),
    ("icontains-all", ["A", "B"], "a and b", True),
    ("not-icontains-any", ["sorry", "cannot"], "Sure", True),
    ("contains", "Paris", None, False),
    ("not-contains", "Paris", None, True),
    ("equals", "", "", True),
])
def test_an_assert_judges_the_answer_as_promptfoo_does(kind, value, answer, passes):
    from agent_demo_kit import scoring
    scoring.check_assert(kind, value)
    assert scoring.assert_passes(answer, kind, value) is passes


@pytest.mark.parametrize("kind, value, said", [
    ("llm-rubric", "is polite", "llm-rubric cannot be scored here"),
    ("not-javascript", "output.length < 9", "not-javascript cannot be scored here"),
    pytest.param("regex", "(unclosed", "not a regular expression", marks=pytest.mark.processes),
    ("starts-with", 4, "must be a text"),
    ("contains", None, "has no value"),
    ("contains", True, "must be a text or a number"),
    ("contains-any", [], "a list of texts or numbers"),
    pytest.param("regex", "x" * 4_001, "a regular expression of 4,001 characters; at most 4,000",
                 marks=pytest.mark.processes),
])
def test_an_assert_that_cannot_be_scored_is_refused_naming_why(kind, value, said):
    from agent_demo_kit import scoring
    with pytest.raises(scoring.BadExpectation, match=said):
        scoring.check_assert(kind, value)


# --- promptfoo's CSV ----------------------------------------------------------------------------

PROMPTFOO_CSV = (
    "question,__expected,__expected2,__description,__metadata:topic\n"
    "What is the capital of France?,icontains: paris,not-contains:London,capital,geo\n"
    "What is the capital of Germany?,contains: Berlin,not-contains: Munich,capital 2,geo\n"
    "What is 2+2?,4,,sum,math\n"
    'Name a prime above 100.,"regex:^(101|103|107)$",,prime,math\n'
    "Say hello,starts-with:Hello,,greeting,words\n"
    "What is the capital of Italy?,equals: Rome,,capital 3,geo\n"
    "Write a haiku,,,free,words\n")


@pytest.mark.processes  # the regex judge
@pytest.mark.parametrize("name", ["tests.csv", "tests.txt"])  # its header says what it is
def test_a_promptfoo_csv_runs_its_asserts_all_must_pass_and_none_reaches_a_request(tmp_path, cli, server, name):
    path = tmp_path / name
    path.write_text(PROMPTFOO_CSV)
    code, out, err = cli("--batch", path, "--json", "-q")
    summary = json.loads(out)
    assert (code, summary["tasks"], summary["scored"], summary["correct"]) == (1, 7, 6, 4), err
    lines = results(tmp_path / "tests-results" / "gpt-4o-mini")
    assert lines["2"]["asserts"] == [{"type": "icontains", "value": "paris", "pass": True},
                                     {"type": "not-contains", "value": "London", "pass": True}]
    assert lines["3"]["correct"] is False and [each["pass"] for each in lines["3"]["asserts"]] == [True, False]
    assert lines["4"]["correct"] is True and lines["4"]["asserts"] == [{"type": "equals", "value": "4", "pass": True}]
    assert lines["7"]["correct"] is False and lines["8"]["correct"] is None and "asserts" not in lines["8"]
    assert lines["2"]["metadata"] == {"description": "capital", "topic": "geo"}
    assert lines["2"]["expected"] is None and lines["2"]["match"] is None
    requests = sent(server)
    assert "What is the capital of France?" in requests
    assert all(word not in requests for word in ("paris", "London", "Munich", "Rome", "101|103", "__", "geo"))
    code, out, _ = cli("--summary", tmp_path / "tests-results" / "gpt-4o-mini")
    assert "accuracy         66.7% (4 of 6" in out and "capital 3: wrong: answered" not in out
    assert "3: wrong: answered 'Berlin, not Munich', failed not-contains 'Munich'" in out, out


@pytest.mark.parametrize("text, said", [
    ("question,__expected\nIs it safe?,llm-rubric: is polite\n", "line 2: __expected holds a llm-rubric assert,"
                                                                 " which cannot be scored here"),
    ("question,__expected\nIs it safe?,javascript: output.length < 9\n", "a javascript assert"),
    ("question,__expected\nIs it safe?,similar(0.8):yes\n", "a similar assert"),
    ("question,__expected\nIs it safe?,file://check.py\n", "a python assert"),
    ("question,context,__expected\nWhat is it?,a text,yes\n",
     "line 2: which var is the task? (vars: question, context): name it with --fields task=VAR"),
    ("question,__prefix,__expected\nWhat is it?,Answer:,yes\n", "line 1: '__prefix' of promptfoo's CSV is not read"),
    ("question,__metadata:tags[],__expected\nWhat is it?,\"a,b\",yes\n", "'__metadata:tags[]' of promptfoo's CSV"),
    pytest.param("question,__expected\nWhat is it?,regex:(unclosed\n", "line 2: __expected: \"regex\" is not a regular",
                 marks=pytest.mark.processes),  # the pattern is compiled in the regex judge's child
    ("question,__expected\nWhat is it?,contains:\n", "line 2: __expected: a contains assert has no value"),
    ("question,__expected\nWhat is it?,contains: {{answer}}\n", "line 2: __expected uses {{answer}}, which is no"
                                                                  " var of the test"),
])
def test_a_promptfoo_csv_that_cannot_be_scored_as_written_is_refused_naming_the_line(tmp_path, cli, server, text,
                                                                                    said):
    path = tmp_path / "tests.csv"
    path.write_text(text)
    code, _, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0) and said in err, err
    assert len(err.splitlines()) == 1


def test_fields_name_the_task_var_of_a_promptfoo_csv_and_asserts_may_use_vars(tmp_path, cli, server):
    path = tmp_path / "tests.csv"
    path.write_text("country,answer,__expected\nFrance,Paris,equals: {{answer}}\nGermany,Bonn,contains:{{ answer }}\n")
    code, out, err = cli("--batch", path, "--fields", "task=country", "--json")
    assert (code, json.loads(out)["correct"]) == (1, 1), err
    lines = results(tmp_path / "tests-results" / "gpt-4o-mini")
    assert lines["3"]["asserts"] == [{"type": "contains", "value": "Bonn", "pass": False}]
    assert "Bonn" not in sent(server) and "answer" not in json.dumps(lines["2"].get("metadata"))
    assert "vars other than the task's are not sent: answer" in err
    code, _, err = cli("--batch", path, "--fields", "task=country,expected=answer")
    assert code == 2 and "is promptfoo's: its asserts say what is expected" in err, err


def test_a_test_that_did_not_finish_is_not_right_whatever_its_not_asserts_say(tmp_path, cli, monkeypatch):
    path = tmp_path / "tests.csv"
    path.write_text("question,__expected\nSay anything,not-contains: sorry\n")
    with ScriptedServer([action("fail", reason="cannot")]) as scripted:
        monkeypatch.setenv("LLM_API_URL", scripted.url)
        code, out, err = cli("--batch", path, "--json", "-q")
    [line] = results(tmp_path / "tests-results" / "gpt-4o-mini").values()
    assert line["status"] != "finished" and line["correct"] is False, line
    assert line["asserts"] == [{"type": "not-contains", "value": "sorry", "pass": None}]


# --- promptfoo's YAML ---------------------------------------------------------------------------

PROMPTFOOCONFIG = """\
# promptfooconfig.yaml, as promptfoo's getting-started writes one
description: Capitals, answered in one word
prompts:
  - "Answer in one word: what is the capital of {{ country }}?"
providers:
  - openai:gpt-4o-mini
defaultTest:
  assert:
    - type: not-icontains
      value: "I don't know"
tests:
  - description: France
    vars:
      country: France
    assert:
      - type: equals
        value: Paris
  - vars:
      country: Germany
    assert:
      - type: icontains
        value: berlin
      - type: not-contains
        value: Munich
    metadata:
      region: europe
  - vars:
      country: Japan
    assert:
      - type: contains-any
        value: [Tokyo, 東京]
  - vars: {country: Italy}
    assert:
      - {type: equals, value: Rome}
"""


def test_a_promptfooconfig_runs_its_first_prompt_with_the_vars_and_scores_all_its_asserts(tmp_path, cli, server):
    pytest.importorskip("yaml")
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text(PROMPTFOOCONFIG, encoding="utf-8")
    code, out, err = cli("--batch", path, "--json")
    summary = json.loads(out)
    assert (code, summary["tasks"], summary["scored"], summary["correct"]) == (1, 4, 4, 2), err
    tasks = sorted(request["body"]["messages"][1]["content"] for request in server.requests)
    assert tasks[0] == "Task: Answer in one word: what is the capital of France?", tasks
    lines = results(tmp_path / "promptfooconfig-results" / "gpt-4o-mini")
    assert lines["1"]["asserts"] == [{"type": "not-icontains", "value": "I don't know", "pass": True},
                                     {"type": "equals", "value": "Paris", "pass": True}]
    assert lines["1"]["metadata"] == {"description": "France"} and lines["2"]["metadata"] == {"region": "europe"}
    assert [each["pass"] for each in lines["2"]["asserts"]] == [True, True, False]
    assert lines["3"]["correct"] is True and lines["4"]["correct"] is False
    assert all(word not in sent(server) for word in ("Rome", "Munich", "berlin", "Tokyo", "know", "europe"))
    assert f"providers of {path} not read (the model is --model's)" in err


def test_a_yaml_list_of_test_cases_runs_each_with_its_one_var_as_the_task(tmp_path, cli, server):
    pytest.importorskip("yaml")
    path = tmp_path / "cases.yml"
    path.write_text("- vars: {question: 'What is 2+2?'}\n  assert: [{type: equals, value: 4}]\n"
                    "- vars:\n    question: Say hello\n  assert:\n    - type: starts-with\n      value: Hello\n"
                    "- vars: {question: 'What is 2+2?', lang: fr}\n  assert: [{type: contains, value: '4'}]\n")
    code, out, err = cli("--batch", path, "--json", "-q")
    assert code == 2 and "cases.yml test 3: which var is the task? (vars: question, lang)" in err, err
    code, out, err = cli("--batch", path, "--json", "--fields", "task=question")
    assert (code, json.loads(out)["correct"]) == (0, 3), err
    assert "vars other than the task's are not sent: lang" in err


@pytest.mark.parametrize("text, said", [
    ("tests:\n  - vars: {q: 'Is it safe?'}\n    assert:\n      - type: llm-rubric\n        value: is polite\n",
     "test 1: assert 1 holds a llm-rubric assert, which cannot be scored here"),
    ("tests:\n  - description: safety\n    vars: {q: x}\n    assert: [{type: javascript, value: 'output.length'}]\n",
     "test 1 ('safety'): assert 1 holds a javascript assert"),
    ("defaultTest:\n  assert: [{type: similar, value: yes, threshold: 0.8}]\ntests:\n  - vars: {q: x}\n",
     "defaultTest: assert 1 holds a similar assert"),
    ("tests:\n  - vars: {q: x}\n    threshold: 0.5\n", "test 1: threshold of a promptfoo test is not read here"),
    ("tests:\n  - vars: {q: file://secret.txt}\n", "test 1: the var 'q' names a file ('file://secret.txt')"),
    ("tests: file://tests/*.yaml\n", "tests: names files ('file://tests/*.yaml'): give each file to --batch"),
    ("tests:\n  - file://more.yaml\n", "test 1 is a file name ('file://more.yaml'): give it to --batch"),
    ("prompts: ['Say {{ name | upper }}']\ntests:\n  - vars: {name: x}\n", "test 1: the prompt uses nunjucks beyond"),
    ("prompts: ['Tell me of {{topic}} in {{lang}}']\ntests:\n  - vars: {topic: x}\n",
     "test 1: the prompt uses {{lang}}, which is no var of the test (its vars: topic)"),
    ("prompts: [file://prompt.txt]\ntests:\n  - vars: {topic: x}\n", "prompt 1 names a file"),
    ("tests:\n  - vars: {q: [a, b]}\n", "the var 'q' is a list (promptfoo runs a test for each of its values)"),
    ("tests:\n  - vars: {q: x}\n    metadata: {tags: [a, b]}\n", "test 1: metadata 'tags' must be a plain value"),
    ("scenarios:\n  - config: []\ntests:\n  - vars: {q: x}\n", "scenarios of a promptfooconfig is not read here"),
    ("tests:\n", "holds no test cases"),
    ('tests:\n  - vars: {"a\\nb": x, c: y}\n', "which var is the task? (vars: a b, c)"),
    ("tests:\n  - vars: {q: x\n", "is not YAML (line 3:"),
    ("just words\n", "is neither a list of promptfoo's test cases nor a config with tests:"),
])
def test_a_promptfoo_yaml_that_cannot_be_run_as_written_is_refused_naming_the_test(tmp_path, cli, server, text, said):
    pytest.importorskip("yaml")
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text(text)
    code, _, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0) and said in err, err
    assert len(err.splitlines()) == 1


def test_a_yaml_file_without_pyyaml_says_what_to_install(tmp_path, cli, server, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "yaml", None)  # import yaml fails, as where it is missing
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text(PROMPTFOOCONFIG)
    code, _, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0), err
    assert "promptfooconfig.yaml is YAML: reading it needs PyYAML: pip install 'agent-demo[yaml]'" in err


LAUGHS = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join([f'*{before}'] * 9)}]\n" for before, name in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text, said", [
    (LAUGHS + "tests:\n  - vars: {q: *i}\n", "holds more than 1,000,000 values, its aliases (*name) expanded"),
    ("tests: &t\n  - vars: {q: x}\n    metadata: *t\n", "refers to itself (an alias inside its own anchor)"),
    ("tests:\n  - vars: {q: " + "[" * 5000 + "]" * 5000 + "}\n", "is nested too deeply"),
    ("tests:\n  - vars: {q: x}\n  - &x [*x]\n", "refers to itself"),
])
def test_a_yaml_bomb_is_refused_before_it_is_expanded(tmp_path, cli, server, text, said):
    pytest.importorskip("yaml")
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text(text)
    code, _, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0) and said in err, err


def test_a_yaml_file_past_the_size_cap_is_refused_unread(tmp_path, cli, server):
    from agent_demo_kit import promptfoo
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text("tests:\n" + "  - vars: {q: What is 2+2?}\n" * (promptfoo.MAX_YAML_BYTES // 26))
    code, _, err = cli("--batch", path)
    assert (code, len(server.requests)) == (2, 0) and "is larger than 2 MB: not a file of tests" in err, err


def test_a_rerun_judges_again_only_the_tests_whose_asserts_changed_and_sends_nothing(tmp_path, cli, server):
    pytest.importorskip("yaml")
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text(PROMPTFOOCONFIG, encoding="utf-8")
    cli("--batch", path, "-q")
    asked = len(server.requests)
    folder = tmp_path / "promptfooconfig-results" / "gpt-4o-mini"
    assert "all of: not-icontains" in (folder / "report.html").read_text(encoding="utf-8")
    path.write_text(PROMPTFOOCONFIG.replace("value: Munich", "value: Hamburg"), encoding="utf-8")
    code, out, err = cli("--batch", path, "--json", "-q", "--match", "exact")  # for expected; asserts judge themselves
    assert (code, json.loads(out)["correct"], len(server.requests)) == (1, 3, asked), err
    assert [each["pass"] for each in results(folder)["2"]["asserts"]] == [True, True, True]
    assert results(folder)["2"]["match"] is None


@pytest.mark.processes
def test_the_command_line_runs_promptfoos_files_as_a_person_would(tmp_path, server):
    """python agent_demo.py --batch promptfooconfig.yaml, then its CSV: exit 1 (some wrong), a line a test."""
    pytest.importorskip("yaml")
    from conftest import KEY, run_cli
    env = {"LLM_API_URL": server.url, "LLM_API_KEY": KEY}
    (tmp_path / "promptfooconfig.yaml").write_text(PROMPTFOOCONFIG, encoding="utf-8")
    (tmp_path / "tests.csv").write_text(PROMPTFOO_CSV)
    for name, tests, wrong in (("promptfooconfig", 4, "4: wrong: answered \"I don't know\", failed not-icontains"),
                               ("tests", 7, "3: wrong: answered 'Berlin, not Munich', failed not-contains 'Munich'")):
        code, out, err = run_cli("--batch", tmp_path / f"{name}.{'csv' if name == 'tests' else 'yaml'}", env=env,
                                 new_interpreter=True)
        assert code == 1 and wrong in err, err
        assert len(results(tmp_path / f"{name}-results" / "gpt-4o-mini")) == tests


@pytest.mark.parametrize("written", ["Paris,,London", "Paris, London,", ",Paris"])
def test_an_empty_piece_of_a_list_is_no_piece_every_answer_holds(written):
    from agent_demo_kit import promptfoo, scoring
    kind, value = promptfoo.cell_assert(f"contains-any:{written}")
    assert kind == "contains-any" and "" not in value
    assert scoring.assert_passes("Berlin", kind, value) is False
    kind, value = promptfoo.checked_assert("contains-any", written, {}, "test 1", "assert 1")
    assert scoring.assert_passes("Berlin", kind, value) is False


def test_yaml_values_are_read_as_promptfoo_reads_them_yaml_1_2(tmp_path, cli, server):
    pytest.importorskip("yaml")
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text('prompts: ["Capital of {{ country }}? Time {{ t }} code {{ code }} n {{ n }} m {{ m }}"]\n'
                    "tests:\n"
                    "  - vars: {country: NO, t: 12:30, code: 0755, n: 1_000, m: 1e3}\n"
                    "    assert: [{type: icontains, value: no}]\n")
    code, _, err = cli("--batch", path, "-q")
    [task] = [request["body"]["messages"][1]["content"] for request in server.requests]
    assert task == "Task: Capital of NO? Time 12:30 code 755 n 1_000 m 1000", (task, err)
