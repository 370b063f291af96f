"""Tool flow: batches, the three modes, the fallback, the allowlist, approval."""
import json
import os
from pathlib import Path

import pytest

from agent_demo_kit import prompts
from agent_demo_kit.cli import main
from agent_demo_kit.records import Reply
from agent_demo_kit.settings import Settings
from scripted_model import run
from conftest import answer_on_a_terminal, said_lines
from scripted_model import ScriptedModel
from scripted_server import ScriptedServer, action as act
from agent_demo_kit.tools import CONTROL_ACTIONS, EXPRESSION_PATTERN, REGISTRY, registry_of, tool

ROOT = Path(__file__).resolve().parent.parent
MISSION = "compute (12 + 500) * 3 and look up order A1002"


def batch(*actions):
    return json.dumps([json.loads(a) for a in actions], ensure_ascii=False)


def play(model, registry=REGISTRY, approver=None, log=None, **settings):
    return run(MISSION, Settings(**settings), model, registry=registry, approve=approver, log=log)


def fed_back_lines(model, request_index):
    """The JSON result lines fed back in the last user message of a request."""
    return [json.loads(line) for line in model.requests[request_index]["messages"][-1]["content"].splitlines()[1:]]


# --- batches -------------------------------------------------------------------------------

def test_a_batching_model_finishes_the_mission_in_3_requests():
    model = ScriptedModel(batch(act("calculator", expression="12 + 500"), act("get_order_status", order_id="A1002")),
                          act("calculator", expression="512 * 3"),
                          act("finish", result="1536; A1002 待支付"))
    outcome = play(model)
    assert (outcome.status, outcome.rounds, len(model.requests)) == ("finished", 3, 3)
    first = fed_back_lines(model, 1)
    assert [(line["call"], line["tool"], line["result"]["ok"]) for line in first] == [
        (1, "calculator", True), (2, "get_order_status", True)]
    assert first[1]["result"]["data"]["status"] == "待支付"
    assert [(c["round"], c["tool"]) for c in outcome.calls] == [
        (1, "calculator"), (1, "get_order_status"), (2, "calculator"), (3, "finish")]


def test_a_batch_runs_in_order_and_a_failure_does_not_stop_the_rest():
    model = ScriptedModel(batch(act("calculator", expression="1 + 1"), act("calculator", expression="1 / 0"),
                                act("get_order_status", order_id="A1003")), act("finish", result="x"))
    play(model)
    lines = fed_back_lines(model, 1)
    assert [line["result"]["ok"] for line in lines] == [True, False, True]
    assert "division by zero" in lines[1]["result"]["error"]


def test_finish_that_is_not_last_is_not_accepted_and_the_run_goes_on():
    model = ScriptedModel(batch(act("finish", result="too early"), act("calculator", expression="2 + 2")),
                          act("finish", result=4))
    outcome = play(model)
    lines = fed_back_lines(model, 1)
    assert lines[0]["result"] == {"ok": False, "error": "not accepted: finish may only come last in a reply;"
                                  " send it alone or after the other calls"}
    assert lines[1]["result"] == {"ok": True, "data": 4}
    assert (outcome.status, outcome.result, outcome.rounds) == ("finished", 4, 2)


def test_finish_after_a_failed_call_is_not_accepted():
    model = ScriptedModel(batch(act("calculator", expression="1 / 0"), act("finish", result="guess")),
                          act("fail", reason="cannot divide by zero"))
    outcome = play(model)
    assert fed_back_lines(model, 1)[1]["result"]["error"] == (
        "not accepted: call 1 (calculator) did not succeed; read its result before ending the run")
    assert (outcome.status, outcome.result) == ("failed", "cannot divide by zero")


def test_finish_last_after_calls_that_succeeded_ends_the_run_in_that_round():
    model = ScriptedModel(batch(act("calculator", expression="2 + 2"), act("finish", result="4")))
    outcome = play(model)
    assert (outcome.status, outcome.result, outcome.rounds) == ("finished", "4", 1)


def test_calls_over_the_cap_are_not_run():
    calls = []
    def count(n: float) -> None:
        """Count."""
        calls.append(n)
    registry = {**REGISTRY, **registry_of(count)}
    model = ScriptedModel(batch(*[json.dumps({"tool": "count", "args": {"n": n}}) for n in range(10)]),
                          act("finish", result="x"))
    play(model, registry=registry, max_calls=8)
    assert calls == list(range(8))
    lines = fed_back_lines(model, 1)
    assert len(lines) == 10
    assert lines[9]["result"]["error"] == "not run: at most 8 calls per reply; send the rest in the next reply"


# --- schema and tools modes ------------------------------------------------------------------

def test_schema_mode_sends_the_action_schema_rendered_from_the_registry():
    model = ScriptedModel('{"actions": [' + act("finish", result="ok") + "]}")
    outcome = play(model, mode="schema")
    assert outcome.status == "finished"
    response_format = model.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    schema = response_format["json_schema"]["schema"]
    calls, ending = schema["properties"]["actions"]["anyOf"]
    assert schema["required"] == ["actions"] and calls["maxItems"] == 8 and ending["maxItems"] == 1
    branches = calls["items"]["anyOf"] + ending["items"]["anyOf"]
    names = [*REGISTRY, "recall", "note", "finish", "fail"]
    assert [b["properties"]["tool"]["enum"] for b in branches] == [[name] for name in names]
    assert branches[0]["properties"]["args"] == {
        "type": "object", "properties": {"expression": {
            "type": "string", "description": "number operator number, e.g. '12 + 500' or '-3 * 4'",
            "pattern": EXPRESSION_PATTERN}},
        "required": ["expression"], "additionalProperties": False}
    assert branches[4]["properties"]["args"]["properties"]["result"]["anyOf"][0] == {"type": "string"}
    assert '{"actions": [' in model.requests[0]["messages"][0]["content"]


def tool_call(call_id, name, **args):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def test_tools_mode_sends_schemas_reads_tool_calls_and_answers_each_id():
    model = ScriptedModel(
        Reply(content="<think>two independent calls</think>", tool_calls=[
            tool_call("c1", "calculator", expression="12 + 500"), tool_call("c2", "get_order_status", order_id="A1002")]),
        Reply(content="", tool_calls=[tool_call("c3", "finish", result="done")]))
    outcome = play(model, mode="tools")
    assert (outcome.status, outcome.result) == ("finished", "done")
    tools = model.requests[0]["tools"]
    assert [t["function"]["name"] for t in tools] == [*REGISTRY, *CONTROL_ACTIONS]
    assert tools[1]["function"]["parameters"]["required"] == ["order_id"]
    assert "response_format" not in model.requests[0]
    second = model.requests[1]["messages"]
    assert second[2]["role"] == "assistant" and second[2]["content"] == ""
    assert [c["id"] for c in second[2]["tool_calls"]] == ["c1", "c2"]
    assert [(m["role"], m["tool_call_id"]) for m in second[3:]] == [("tool", "c1"), ("tool", "c2")]
    assert json.loads(second[3]["content"])["result"] == {"ok": True, "data": 512}


def test_tools_mode_words_after_a_call_are_the_answer(serve, capsys):
    serve([{"tool_calls": [tool_call("c1", "calculator", expression="12 + 500")]},
           "<think>done adding</think>12 + 500 = 512."], key=None)
    assert main(["--mode", "tools", "--quiet", "add"]) == 0
    assert capsys.readouterr().out == "12 + 500 = 512.\n"


@pytest.mark.processes
def test_tools_mode_words_rejected_by_the_check_get_the_check_output_back(serve, capsys):
    server = serve(["It is 500.", "It is 512."], key=None)
    assert main(["--mode", "tools", "--check", "grep -q 512", "--json", "add"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["result"], out["rounds"]) == ("finished", "It is 512.", 2)
    told = server.sent_messages(1)[-1]
    assert told["role"] == "user" and "not accepted: the answer check exited with 1" in told["content"]
    assert prompts.ANSWERED_IN_WORDS in told["content"]
    assert server.sent_messages(1)[-2] == {"role": "assistant", "content": "It is 500."}


@pytest.mark.parametrize("mode", ["json", "schema"])
def test_words_twice_in_a_row_are_the_answer_once_the_model_was_told_how_to_send_one(mode):
    model = ScriptedModel("The answer is 42.", "<think>as I said</think>\nThe answer is 42, truly.")
    outcome = play(model, mode=mode)
    assert (outcome.status, outcome.result, outcome.rounds) == ("finished", "The answer is 42, truly.", 2)
    told = model.requests[1]["messages"][-1]["content"]
    assert told.startswith("Your reply held words but no action. If they are your answer, send them with finish")
    assert ("actions" in told) == (mode == "schema")


def test_words_after_an_action_are_not_taken_for_an_answer_in_json_mode():
    model = ScriptedModel("Let me think.", act("calculator", expression="1 + 1"), "Two.", act("finish", result=2))
    outcome = play(model)
    assert (outcome.status, outcome.result, outcome.rounds) == ("finished", 2, 4)


@pytest.mark.parametrize("mode", ["json", "schema", "tools"])
def test_the_mission_runs_in_3_requests_in_each_mode_against_the_server(serve, capsys, mode):
    if mode == "tools":
        replies = [{"tool_calls": [tool_call("a", "calculator", expression="12 + 500"),
                                   tool_call("b", "get_order_status", order_id="A1002")]},
                   {"tool_calls": [tool_call("c", "calculator", expression="512 * 3")]},
                   {"tool_calls": [tool_call("d", "finish", result="1536; A1002 待支付")]}]
    else:
        wrap = (lambda text: '{"actions": [' + text.strip("[]") + "]}") if mode == "schema" else (lambda text: text)
        replies = [wrap(batch(act("calculator", expression="12 + 500"), act("get_order_status", order_id="A1002"))),
                   wrap(act("calculator", expression="512 * 3")), wrap(act("finish", result="1536; A1002 待支付"))]
    server = serve(replies)
    assert main(["--json", "--mode", mode, MISSION]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["rounds"], len(server.requests)) == ("finished", 3, 3)
    assert [(c["round"], c["tool"]) for c in out["calls"]][:2] == [(1, "calculator"), (1, "get_order_status")]
    assert ("tools" in server.requests[0]["body"]) == (mode == "tools")
    assert ("response_format" in server.requests[0]["body"]) == (mode == "schema")


# --- falling back to json --------------------------------------------------------------------

@pytest.mark.parametrize("mode, field", [("schema", "response_format"), ("tools", "tools")])
def test_a_400_for_schema_or_tools_falls_back_to_json_once_and_says_so(serve, capsys, tmp_path, mode, field):
    refusal = {"status": 400, "body": {"error": {"message": f"unsupported parameter: {field}"}}}
    server = serve([act("finish", result="ok")], screen=lambda body: refusal if field in body else None)
    trace = tmp_path / "t.jsonl"
    assert main(["--mode", mode, "--trace", str(trace), "hi"]) == 0
    assert field in server.requests[0]["body"]
    assert field not in server.requests[-1]["body"]
    assert len(server.requests) == (4 if mode == "schema" else 2), "schema mode tries its three variants first"
    assert "Reply with one JSON object and nothing else: {\"tool\"" in server.sent_messages(-1)[0]["content"]
    assert f"note: the endpoint rejected {mode} mode" in capsys.readouterr().err
    fallback = [json.loads(line) for line in trace.read_text().splitlines() if '"fallback"' in line]
    assert fallback[-1]["from_mode"] == mode and fallback[-1]["to_mode"] == "json"


def test_a_server_error_naming_response_format_also_falls_back(serve, capsys):
    server = serve([{"status": 500, "body": {"error": {"message": "('body', 'response_format', 'type')"}}},
                    act("finish", result="ok")])
    assert main(["--mode", "schema", "--retries", "0", "--quiet", "hi"]) == 0
    assert len(server.requests) == 2


def test_each_fallback_happens_once(serve, capsys):
    server = serve([{"status": 400, "body": {"error": {"message": "bad request"}}}])
    assert main(["--mode", "schema", "hi"]) == 3
    assert len(server.requests) == 4, "json_schema, json_object+schema, json_object, then json"
    assert "request rejected (HTTP 400): bad request" in capsys.readouterr().err


def test_a_later_400_about_something_else_is_an_error_not_a_fallback(serve, capsys):
    server = serve([{"tool_calls": [tool_call("a", "calculator", expression="1 + 1")]},
                    {"status": 400, "body": {"error": {"message": "messages: unsupported content"}}}])
    assert main(["--mode", "tools", "hi"]) == 3
    assert len(server.requests) == 2
    assert "messages: unsupported content" in capsys.readouterr().err


def test_json_mode_does_not_fall_back(serve, capsys):
    server = serve([{"status": 400, "body": {"error": {"message": "bad request"}}}])
    assert main(["hi"]) == 3
    assert len(server.requests) == 1


def test_an_unknown_mode_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("AGENT_MODE", "xml")
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    assert main(["hi"]) == 2
    assert "AGENT_MODE must be one of json, schema, tools" in capsys.readouterr().err


# --- the allowlist ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["json", "schema", "tools"])
def test_the_allowlist_exposes_only_the_named_tools(serve, capsys, mode):
    server = serve([act("get_order_status", order_id="A1002"), act("finish", result="x")])
    assert main(["--tools", "calculator", "--mode", mode, "--quiet", "hi"]) == 0
    body = json.dumps(server.requests[0]["body"], ensure_ascii=False)
    assert "calculator" in body and "get_order_status" not in body
    fed_back = server.sent_messages(1)[-1]["content"]
    assert "unknown tool 'get_order_status'" in fed_back
    assert f'"available_tools": {json.dumps(["calculator", *CONTROL_ACTIONS])}' in fed_back


def test_an_unknown_name_in_the_allowlist_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    assert main(["--tools", "calculator,rm_rf", "hi"]) == 2
    assert "--tools: unknown tool rm_rf" in capsys.readouterr().err


# --- approval --------------------------------------------------------------------------------

def test_approval_yes_runs_the_call_after_asking():
    asked = []
    model = ScriptedModel(act("calculator", expression="2 + 2"), act("finish", result=4))
    play(model, approver=lambda call: asked.append(call) or True, approve=True)
    assert asked == [{"tool": "calculator", "args": {"expression": "2 + 2"}}]
    assert fed_back_lines(model, 1)[0]["result"] == {"ok": True, "data": 4}


def test_approval_no_feeds_back_a_cancelled_call():
    model = ScriptedModel(act("calculator", expression="2 + 2"), act("fail", reason="not allowed"))
    play(model, approver=lambda call: False, approve=True)
    assert fed_back_lines(model, 1)[0]["result"] == {
        "ok": False, "error": "cancelled: the user did not approve this call", "cancelled": True}


def test_a_tool_with_side_effects_always_asks_unless_yes():
    sent = []
    @tool(side_effects=True)
    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return "sent"
    registry = {**REGISTRY, **registry_of(send_email)}
    model = ScriptedModel(act("send_email", to="x@y"), act("finish", result="done"))
    play(model, registry=registry, approver=lambda call: False)
    assert sent == [] and fed_back_lines(model, 1)[0]["result"]["cancelled"] is True
    model = ScriptedModel(act("send_email", to="x@y"), act("finish", result="done"))
    play(model, registry=registry, approver=lambda call: False, yes=True)
    assert sent == ["x@y"]


def test_approve_without_a_terminal_refuses_every_call_and_says_so(serve, capsys, tmp_path):
    server = serve([act("calculator", expression="2 + 2"), act("fail", reason="refused")])
    trace = tmp_path / "t.jsonl"
    assert main(["--approve", "--trace", str(trace), "hi"]) == 1
    err = capsys.readouterr().err
    assert "note: --approve: there is no terminal to ask, so every tool call will be refused" in err
    assert "there is no terminal to ask" in server.sent_messages(1)[-1]["content"]
    assert [json.loads(line)["event"] for line in trace.read_text().splitlines()][:2] == ["start", "note"]


@pytest.mark.processes
def test_approve_asks_on_a_real_terminal_even_with_json_and_stderr_redirected(tmp_path):
    with ScriptedServer([act("calculator", expression="2 + 2"), act("finish", result="four")]) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "AGENT_"))}
        env["LLM_API_URL"] = server.url
        shown, out, _, code = answer_on_a_terminal(["--approve", "--json", "hi"], env, tmp_path)
    assert b'approve calculator {"expression": "2 + 2"}? [y/N/a]' in shown
    assert code == 0 and json.loads(out)["result"] == "four"
    assert '"data": 4' in server.sent_messages(1)[-1]["content"]


def test_the_same_call_several_times_in_one_reply_is_not_a_loop():
    calls = [tool_call(f"c{n}", "calculator", expression="2 + 2") for n in range(5)]
    model = ScriptedModel(Reply(content="", tool_calls=calls),
                          Reply(content="", tool_calls=[tool_call("f", "finish", result=4)]))
    outcome = play(model, mode="tools")
    assert (outcome.status, outcome.rounds) == ("finished", 2)
    answers = [json.loads(m["content"]) for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert len(answers) == 5 and all(a["result"] == {"ok": True, "data": 4} for a in answers)
    assert answers[1]["note"] == "the same call came earlier in this reply; this is its result"


def test_a_call_the_user_refused_is_asked_again_when_repeated():
    answers = iter([False, True])
    model = ScriptedModel(act("calculator", expression="2 + 2"), act("calculator", expression="2 + 2"),
                          act("finish", result=4))
    outcome = play(model, approver=lambda call: next(answers), approve=True)
    assert outcome.status == "finished"
    assert fed_back_lines(model, 1)[0]["result"]["cancelled"] is True
    assert fed_back_lines(model, 2)[0]["result"] == {"ok": True, "data": 4}


def test_tools_mode_re_sends_broken_arguments_as_the_model_wrote_them():
    broken = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+'}}
    model = ScriptedModel(Reply(content="", tool_calls=[broken]),
                          Reply(content="", tool_calls=[tool_call("f", "fail", reason="x")]))
    play(model, mode="tools")
    assistant, answer = model.requests[1]["messages"][2:4]
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"expression": "1+'
    assert json.loads(answer["content"])["result"]["error"] == "the arguments of calculator are not valid JSON"


def test_broken_native_arguments_again_and_again_end_the_run_as_stuck():
    broken = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{oops"}}
    outcome = play(ScriptedModel(Reply(content="", tool_calls=[broken])), mode="tools", max_rounds=9)
    assert (outcome.status, outcome.rounds) == ("stuck", 3)


def test_a_refused_call_repeated_in_the_same_reply_is_refused_too():
    tools_model = ScriptedModel(
        *[Reply(content="", tool_calls=[tool_call(f"a{n}", "calculator", expression="2 + 2")]) for n in range(2)],
        Reply(content="", tool_calls=[tool_call("b1", "calculator", expression="2 + 2"),
                                      tool_call("b2", "calculator", expression="2 + 2")]),
        Reply(content="", tool_calls=[tool_call("f", "finish", result=4)]))
    play(tools_model, mode="tools")
    third = [json.loads(m["content"]) for m in tools_model.requests[3]["messages"][-2:]]
    assert all(answer["result"]["ok"] is False for answer in third)
    assert "refused" in third[1]["result"]["error"]


@pytest.mark.parametrize("odd_call", [
    {"id": 5, "type": "function", "function": {"name": "calculator", "arguments": {"expression": "1 + 1"}}},
    {"id": "x", "function": "calculator"},
    {"id": "x", "function": {"name": None, "arguments": "{}"}},
    {"id": "x", "function": {"name": "calculator", "arguments": 5}},
    {"id": "x", "function": {"name": "calculator", "arguments": "[1, 2]"}},
])
def test_odd_tool_call_shapes_are_answered_not_crashed_on(odd_call):
    model = ScriptedModel(Reply(content="", tool_calls=[odd_call]),
                          Reply(content="", tool_calls=[tool_call("f", "finish", result=1)]))
    outcome = play(model, mode="tools")
    assert outcome.status == "finished"
    answer = model.requests[1]["messages"][-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == str(odd_call["id"])


def test_calls_refused_for_want_of_a_terminal_are_said_even_under_quiet(serve, capsys):
    serve([act("calculator", expression="2 + 2"), act("finish", result="4?")])
    assert main(["--approve", "--quiet", "hi"]) == 0
    assert said_lines(capsys.readouterr().err) == [
        "agent-demo: 1 tool call(s) refused: they need approval and there was no terminal to ask; --yes runs them"]
