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
    ("not-equals", {"n": 1}, "not JSON", True),
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
    ("regex", "(unclosed", "not a regular expression"),
    ("starts-with", 4, "must be a text"),
    ("contains", None, "has no value"),
    ("contains", True, "must be a text or a number"),
    ("contains-any", [], "a list of texts or numbers"),
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
    ("question,__expected\nWhat is it?,regex:(unclosed\n", "line 2: __expected: \"regex\" is not a regular"),
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


def test_a_test_that_did_not_finish_is_not_right_whatever_its_not_asserts_say(tmp_path, cli, monkeypatch):
    path = tmp_path / "tests.csv"
    path.write_text("question,__expected\nSay anything,not-contains: sorry\n")
    with ScriptedServer([action("fail", reason="cannot")]) as scripted:
        monkeypatch.setenv("LLM_API_URL", scripted.url)
        code, out, err = cli("--batch", path, "--json", "-q")
    [line] = results(tmp_path / "tests-results" / "gpt-4o-mini").values()
    assert line["status"] != "finished" and line["correct"] is False, line
    assert line["asserts"] == [{"type": "not-contains", "value": "sorry", "pass": None}]
