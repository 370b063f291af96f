import pytest
from hypothesis import given, settings, strategies as st

from agent_demo_kit.actions import Action, parse_actions, parse_reply, strip_think
from agent_demo_kit.records import Reply
from agent_demo_kit.settings import Settings
from scripted_model import ScriptedModel, run
from scripted_server import action as act
from agent_demo_kit.tools import registry_of

CALC = Action("calculator", {"expression": "12 + 500"})
CALC_JSON = '{"tool": "calculator", "args": {"expression": "12 + 500"}}'


@pytest.mark.parametrize("reply", [
    CALC_JSON,
    f"```json\n{CALC_JSON}\n```",
    f"```\n{CALC_JSON}\n```",
    f"<think>The user wants {{12 + 500}}; maybe {{\"tool\": \"finish\"}}?</think>\n{CALC_JSON}",
    f"<think>\nlet me think {{ unbalanced\n</think>\n\n```json\n{CALC_JSON}\n```",
    f"Sure! I'll compute that.\n{CALC_JSON}\nThen I'll look up the order {{next}}.",
    f"I think {{braces}} and [1, 2] are fine. {CALC_JSON}",
    f'{{"note": "not an action"}} {CALC_JSON}',
    f"reasoning the server left without its opening tag {{x}}</think>{CALC_JSON}",
    f"<THINK>shouting {{}}</THINK>{CALC_JSON}",
    f"[{CALC_JSON}]",
    f"{CALC_JSON}}}}}",
])
def test_the_first_action_is_found_in_what_models_write(reply):
    assert parse_actions(reply).actions[0] == CALC


def test_two_actions_in_one_reply_are_both_found_in_order():
    second = '{"tool": "get_order_status", "args": {"order_id": "A1002"}}'
    parsed = parse_actions(f"{CALC_JSON}\n{second}")
    assert [a.tool for a in parsed.actions] == ["calculator", "get_order_status"]


def test_an_action_nested_inside_another_json_value_is_not_picked_out():
    parsed = parse_actions('{"response": {"tool": "calculator", "args": {}}}')
    assert parsed.actions == [] and "no action object" in parsed.problem


def test_missing_args_default_to_an_empty_object():
    assert parse_actions('{"tool": "finish"}').actions == [Action("finish", {})]


@pytest.mark.parametrize("reply, problem", [
    ("The answer is 512.", "no JSON object found"),
    ("", "no JSON object found"),
    ('{"answer": 512}', "no action object"),
    ('[1, 2, 3]', "no JSON object found"),
    ('{"tool": 5, "args": {}}', "no action object"),
    ('{"tool": "calculator", "args": "12 + 500"}', '"args" of calculator must be a JSON object'),
    ("{'tool': 'calculator', 'args': 'oops'}", '"args" of calculator must be a JSON object'),
    ('{"tool": "finish", "args": {"result": NaN}}', "not JSON that can be read"),
    ('{"tool": "finish", "args": {"result": Infinity}}', "not JSON that can be read"),
    ('{"tool": "finish", "args": {"result": 1e999}}', "not JSON that can be read"),
    ('{"tool": "finish", "args": {"result": ' + "1" * 5000 + "}}", "not JSON that can be read"),
    ("[" * 1500, "no JSON object found"),
    ('{"a":' * 1500, "not JSON that can be read"),
    (f"<think>{CALC_JSON}</think>No action here.", "no JSON object found"),
    (f"<think>still thinking {CALC_JSON}", "no JSON object found"),
])
def test_replies_without_a_usable_action_are_format_errors(reply, problem):
    parsed = parse_actions(reply)
    assert parsed.actions == []
    assert problem in parsed.problem


def test_native_tool_calls_are_read_when_the_content_is_empty():
    reply = Reply(content="", tool_calls=[
        {"id": "call_1", "type": "function",
         "function": {"name": "calculator", "arguments": '{"expression": "12 + 500"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "finish", "arguments": "{}"}}])
    parsed = parse_reply(reply, "json")
    assert parsed.native and parsed.actions == [
        Action("calculator", {"expression": "12 + 500"}, "call_1", '{"expression": "12 + 500"}'),
        Action("finish", {}, "call_2", "{}")]


def test_native_tool_call_with_broken_arguments_carries_its_problem():
    reply = Reply(content="", tool_calls=[{"function": {"name": "calculator", "arguments": "{oops"}}])
    assert parse_reply(reply, "json").actions[0].problem == "the arguments of calculator are not valid JSON"


@given(st.text(max_size=200))
def test_the_parser_never_raises(text):
    parsed = parse_actions(text)
    assert bool(parsed.actions) != bool(parsed.problem)


@given(st.text(alphabet=st.characters(blacklist_characters="{}[]<>"), max_size=80),
       st.text(alphabet=st.characters(blacklist_characters="{}[]<>"), max_size=80))
def test_an_action_surrounded_by_prose_is_always_found(before, after):
    assert parse_actions(before + CALC_JSON + after).actions[0] == CALC


def test_raw_newlines_inside_strings_are_accepted():
    parsed = parse_actions('{"tool": "finish", "args": {"result": "line one\nline two"}}')
    assert parsed.actions == [Action("finish", {"result": "line one\nline two"})]


def test_an_action_quoted_inside_the_finish_result_is_not_run_instead():
    reply = ('{"tool": "finish", "args": {"result": "Steps:\n1. add",'
             ' "calls": [{"tool": "calculator", "args": {"expression": "1 + 1"}}]}}')
    assert parse_actions(reply).actions[0].tool == "finish"


def test_a_later_action_with_bad_args_does_not_spoil_the_first():
    parsed = parse_actions(CALC_JSON + '{"tool": "finish", "args": "done"}')
    assert parsed.problem is None and parsed.actions[0] == CALC


@pytest.mark.parametrize("hostile", [
    "{" * 200_000, "<think>" * 30_000, "<thinking>a" * 20_000, '"{' * 100_000, "[{" * 50_000,
], ids=["braces", "think-tags", "thinking-tags", "quote-braces", "bracket-braces"])
def test_hostile_replies_are_format_errors_not_crashes(hostile):
    parsed = parse_actions(hostile)
    assert parsed.actions == [] and parsed.problem.startswith(("no JSON object found", "it looks like an action"))


def test_an_action_written_twice_in_one_reply_runs_once_and_both_copies_get_its_result():
    ran = []

    def count(n: int) -> int:
        """Count."""
        ran.append(n)
        return len(ran)
    twice = '{"tool": "count", "args": {"n": 1}}'
    model = ScriptedModel(f"I will call {twice} now:\n```json\n{twice}\n```", act("finish", result="done"))
    outcome = run("count", Settings(), model, registry=registry_of(count))
    assert outcome.status == "finished" and ran == [1]
    assert [call["result"] for call in outcome.calls[:2]] == [{"ok": True, "data": 1}] * 2


@pytest.mark.parametrize("text", [
    "keep <think>this part</think> and this",
    "close a thought with </think> and go on",
    "Wrap reasoning in <think> tags.",
    "<thinking>all of it</thinking>",
])
@pytest.mark.parametrize("before", ["", '<think>first {"tool": "fail"} then</think>\n'], ids=["alone", "after a thought"])
def test_a_think_tag_inside_a_json_string_is_text_and_reaches_the_tool_unchanged(text, before):
    reply = before + act("finish", result=text)
    assert parse_actions(reply).actions == [Action("finish", {"result": text})]
    assert strip_think(reply).strip() == act("finish", result=text), "the model's turn is re-sent as written"


KNOWN = ["calculator", "get_order_status", "finish", "fail", "recall", "note"]


@pytest.mark.parametrize("reply", [
    "An empty object is written {} in JSON.",
    'In Python write d = {"a": 1} and the answer is 1.',
    "Use {'name': 'x'} as the config.",
    'The JSON {"name": "Bob"} has a name field.',
    "I used calculator(2+1) to get it.",
    "Here is code:\n```python\nprint('hi')\n```\nThe answer is 42.",
    "<think>maybe {'tool': 'calculator'}</think>The answer is 3.",
])
def test_words_that_hold_braces_or_code_but_no_attempted_action_stay_words_as_written(reply):
    parsed = parse_actions(reply, KNOWN)
    assert parsed.actions == [] and parsed.words == reply.split("</think>")[-1]


@pytest.mark.parametrize("reply", [
    "{bad json", "```json\n{bad json\n```", "{'tool': 'calculator', 'args': {'expression': '2 +",
    "tool: finish\nargs:\n  result: 42", "Sure: {tool: calculator, args: {expression: 2 + 1}}",
    '{"name": "calculator"', "calculator(expression=2 + 1)", '{"answer": 512}',
])
def test_a_reply_that_tries_to_be_an_action_and_cannot_be_read_is_never_words(reply):
    parsed = parse_actions(reply, KNOWN)
    assert parsed.actions == [] and parsed.words == "" and parsed.problem


@pytest.mark.parametrize("reply, actions", [
    ("calculator(expression='2+1')", [("calculator", {"expression": "2+1"})]),
    ('[calculator(expression="2+1"), finish(result=3)]', [("calculator", {"expression": "2+1"}),
                                                          ("finish", {"result": 3})]),
    ("```python\nget_order_status(order_id='A1002')\n```", [("get_order_status", {"order_id": "A1002"})]),
    ('{"calculator": {"expression": "1 + 1"}}', [("calculator", {"expression": "1 + 1"})]),
    ("{'tool': 'finish', 'args': {'result': None, 'ok': True}}", [("finish", {"result": None, "ok": True})]),
])
def test_actions_written_as_python_calls_or_other_shapes_are_read(reply, actions):
    parsed = parse_actions(reply, KNOWN)
    assert [(action.tool, action.args) for action in parsed.actions] == actions and parsed.repaired


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.just("\ud83d"),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                         max_size=3), max_leaves=8)


@given(st.one_of(
    st.fixed_dictionaries({"tool": st.sampled_from(["calculator", "finish", ""]), "args": JSON_VALUES}),
    st.fixed_dictionaries({"name": st.sampled_from(["calculator", "x"]), "arguments": JSON_VALUES | st.text()}),
    st.fixed_dictionaries({"actions": st.lists(st.fixed_dictionaries({"tool": st.text(max_size=5)}), max_size=2)}),
    st.lists(st.fixed_dictionaries({"tool": st.text(max_size=5), "args": JSON_VALUES}), max_size=2),
    st.dictionaries(st.sampled_from(["calculator", "tool", "args"]), JSON_VALUES, max_size=2), JSON_VALUES),
    st.sampled_from(["", " ", "\n", "\u00a0", "\u2028"]),
    st.sampled_from(["", " \n", "\t", "x", "}", "```", "<think>", ' {"tool": "finish"}', '[{"tool": "x"}]']))
@settings(max_examples=400)
def test_a_reply_that_is_one_json_value_is_read_as_the_whole_reading_reads_it(value, before, after):
    import json
    from unittest import mock
    text = before + json.dumps(value, ensure_ascii=False) + after
    known = ("calculator", "get_order_status")
    with mock.patch("agent_demo_kit.actions._whole_value", return_value=None):
        whole_reading = parse_actions(text, known)
    assert parse_actions(text, known) == whole_reading
