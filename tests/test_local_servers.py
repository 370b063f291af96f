"""Local servers (llama.cpp, llama-cpp-python, Ollama, vLLM, LM Studio): the schema-mode variants
and their fallbacks, tools mode on a server that drops tools, and the cap on each reply."""
import json

import pytest

from agent_demo_kit import prompts
from agent_demo_kit.cli import main
from scripted_server import action as act, like_llama_cpp_python
from agent_demo_kit.records import to_json
from agent_demo_kit.tools import CONTROL_ACTIONS, REGISTRY, in_use

FINISH = '{"actions": [' + act("finish", result="ok") + "]}"


def events(trace, name):
    return [json.loads(line) for line in trace.read_text().splitlines() if json.loads(line)["event"] == name]


def response_formats(server):
    """What each request carried as response_format (None when it carried none)."""
    return [request["body"].get("response_format") for request in server.requests]


def refusing(*types, status=400, message="response_format type {} is not supported"):
    """A screen: refuse every request whose response_format is one of these forms."""
    def screen(body):
        response_format = body.get("response_format")
        if response_format is None:
            return None
        form = response_format["type"] + ("+schema" if "schema" in response_format else "")
        if form in types:
            return {"status": status, "body": {"error": {"message": message.format(form)}}}
        return None
    return screen


# --- schema mode: variants tried in order ----------------------------------------------------

def test_schema_mode_sends_openai_json_schema_first(serve, capsys):
    server = serve([FINISH])
    assert main(["--mode", "schema", "--quiet", "hi"]) == 0
    [sent] = response_formats(server)
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "agent_actions"
    assert sent["json_schema"]["schema"]["required"] == ["actions"]


def test_a_llama_cpp_python_500_moves_on_to_json_object_with_the_schema_at_once(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    server = serve([FINISH], screen=like_llama_cpp_python)
    assert main(["--mode", "schema", "--trace", str(trace), "hi"]) == 0
    first, second = response_formats(server)  # the 500 was not retried as an outage
    assert first["type"] == "json_schema"
    assert second == {"type": "json_object", "schema": first["json_schema"]["schema"]}
    out = capsys.readouterr().err
    assert ("note: the endpoint rejected schema mode as json_schema (HTTP 500: response_format.type:"
            " Input should be 'text' or 'json_object'); trying json_object+schema\n") in out
    [fallback] = events(trace, "fallback")
    assert (fallback["from_mode"], fallback["to_mode"], fallback["from_variant"], fallback["to_variant"]) == (
        "schema", "schema", "json_schema", "json_object+schema")
    assert fallback["error"] == "HTTP 500: response_format.type: Input should be 'text' or 'json_object'"


def test_the_variants_are_tried_in_order_then_json(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    server = serve([act("finish", result="ok")],
                   screen=refusing("json_schema", "json_object+schema", "json_object"))
    assert main(["--mode", "schema", "--trace", str(trace), "hi"]) == 0
    forms = [f and (f["type"], "schema" in f) for f in response_formats(server)]
    assert forms == [("json_schema", False), ("json_object", True), ("json_object", False), None]
    assert [(f["from_variant"], f["to_mode"], f.get("to_variant")) for f in events(trace, "fallback")] == [
        ("json_schema", "schema", "json_object+schema"), ("json_object+schema", "schema", "json_object"),
        ("json_object", "json", None)]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert [note.rsplit("; ", 1)[1] for note in notes] == [
        "trying json_object+schema", "trying json_object", "falling back to json mode"]
    assert all(len(note) < 200 for note in notes)
    assert "Reply with one JSON object and nothing else: {\"tool\"" in server.sent_messages(3)[0]["content"]


def test_json_object_alone_still_asks_for_the_actions_envelope(serve, capsys):
    server = serve([FINISH], screen=refusing("json_schema", "json_object+schema"))
    assert main(["--mode", "schema", "--quiet", "hi"]) == 0
    assert response_formats(server)[-1] == {"type": "json_object"}
    assert '{"actions": [' in server.sent_messages(2)[0]["content"]


def test_the_variant_that_worked_is_kept_for_the_rest_of_the_run(serve, capsys):
    calc = '{"actions": [' + act("calculator", expression="2 + 2") + "]}"
    server = serve([calc, '{"actions": [' + act("calculator", expression="4 * 3") + "]}", FINISH],
                   screen=like_llama_cpp_python)
    assert main(["--mode", "schema", "--quiet", "hi"]) == 0
    assert [f["type"] for f in response_formats(server)] == ["json_schema", "json_object", "json_object",
                                                            "json_object"]


def test_a_500_that_does_not_name_response_format_is_retried_as_an_outage(serve, capsys):
    busy = {"status": 500, "body": {"error": {"message": "the GPU is busy"}}}
    server = serve([busy, busy, FINISH])
    assert main(["--mode", "schema", "--quiet", "hi"]) == 0
    assert [f["type"] for f in response_formats(server)] == ["json_schema"] * 3


def test_a_500_that_does_not_name_response_format_keeps_the_retry_count(serve, capsys):
    server = serve([{"status": 500, "body": {"error": {"message": "the GPU is busy"}}}])
    assert main(["--mode", "schema", "--retries", "2", "hi"]) == 3
    assert len(server.requests) == 3, "one request and two retries, as in json mode"
    assert "HTTP 500 after 2 retries: the GPU is busy" in capsys.readouterr().err


def test_a_refusal_after_the_variant_worked_is_an_endpoint_error(serve, capsys):
    calc = '{"actions": [' + act("calculator", expression="2 + 2") + "]}"
    server = serve([calc, {"status": 400, "body": {"error": {"message": "messages: unsupported content"}}}])
    assert main(["--mode", "schema", "--quiet", "hi"]) == 3
    assert len(server.requests) == 2


# --- resume keeps the variant ----------------------------------------------------------------

def test_resume_keeps_the_variant_that_worked(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    serve(['{"actions": [' + act("calculator", expression="2 + 2") + "]}"], screen=like_llama_cpp_python, key=None)
    assert main(["--mode", "schema", "--max-rounds", "1", "--trace", str(trace), "--quiet", "hi"]) == 1
    server = serve([FINISH], screen=like_llama_cpp_python, key=None)
    assert main(["--resume", str(trace), "--max-rounds", "2", "--quiet"]) == 0
    assert response_formats(server)[0]["type"] == "json_object" and len(server.requests) == 1


def test_a_trace_without_variants_resumes_from_json_schema(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    serve(['{"actions": [' + act("calculator", expression="2 + 2") + "]}"], key=None)
    assert main(["--mode", "schema", "--max-rounds", "1", "--trace", str(trace), "--quiet", "hi"]) == 1
    assert not events(trace, "fallback")
    server = serve([FINISH], key=None)
    assert main(["--resume", str(trace), "--max-rounds", "2", "--quiet"]) == 0
    assert response_formats(server)[0]["type"] == "json_schema"


def test_resuming_with_another_mode_starts_its_own_chain(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    serve(['{"actions": [' + act("calculator", expression="2 + 2") + "]}"], screen=like_llama_cpp_python, key=None)
    assert main(["--mode", "schema", "--max-rounds", "1", "--trace", str(trace), "--quiet", "hi"]) == 1
    server = serve([act("finish", result="ok")], key=None)
    assert main(["--resume", str(trace), "--mode", "json", "--max-rounds", "2", "--quiet"]) == 0
    assert response_formats(server) == [None]



# --- tools mode on a server that drops the tools list ----------------------------------------

def test_tools_mode_names_every_tool_in_the_system_prompt_with_a_text_fallback():
    prompt = prompts.render_system_prompt(in_use(REGISTRY), "tools", max_calls=8)
    for described in [*REGISTRY.values(), *CONTROL_ACTIONS.values()]:
        assert f"- {described.name}(" in prompt and to_json(described.example()) in prompt
    assert 'reply with one JSON object and nothing else: {"tool": "<name>", "args": {...}}' in prompt
    json_prompt = prompts.render_system_prompt(in_use(REGISTRY), "json", max_calls=8)
    assert len(prompt) < len(json_prompt) + 200, "short: the schemas say the rest"


def test_tools_mode_works_on_a_server_that_drops_the_tools(serve, capsys):
    server = serve([act("calculator", expression="12 + 500"), act("finish", result="512")])  # text, no tool_calls
    assert main(["--mode", "tools", "--json", "hi"]) == 0
    assert json.loads(capsys.readouterr().out)["calls"][0]["result"] == {"ok": True, "data": 512}
    assert "tools" in server.requests[0]["body"]
    assert "- calculator(expression)" in server.sent_messages(0)[0]["content"]


# --- a cap on each reply -------------------------------------------------------------------

OPENAI_WANTS_MAX_COMPLETION_TOKENS = {"status": 400, "body": {"error": {
    "message": "Unsupported parameter: 'max_tokens' is not supported with this model."
               " Use 'max_completion_tokens' instead.",
    "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}}


def wants_max_completion_tokens(body):
    return OPENAI_WANTS_MAX_COMPLETION_TOKENS if "max_tokens" in body else None


def reply_caps(server):
    return [{k: v for k, v in request["body"].items() if k in ("max_tokens", "max_completion_tokens")}
            for request in server.requests]


@pytest.mark.parametrize("argv, environment, sent", [
    ([], {}, {"max_tokens": 4096}),
    (["--max-reply-tokens", "300"], {}, {"max_tokens": 300}),
    ([], {"AGENT_MAX_REPLY_TOKENS": "200"}, {"max_tokens": 200}),
    (["--max-reply-tokens", "300"], {"AGENT_MAX_REPLY_TOKENS": "200"}, {"max_tokens": 300}),
    (["--max-reply-tokens", "0"], {}, {}),
])
def test_each_request_carries_the_reply_cap(serve, capsys, monkeypatch, argv, environment, sent):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    server = serve([act("calculator", expression="1 + 1"), act("finish", result="2")])
    assert main([*argv, "--quiet", "hi"]) == 0
    assert reply_caps(server) == [sent, sent]


@pytest.mark.parametrize("argv, environment", [(["--max-reply-tokens", "-1"], {}),
                                               ([], {"AGENT_MAX_REPLY_TOKENS": "lots"})])
def test_a_bad_reply_cap_is_a_usage_error(monkeypatch, capsys, argv, environment):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    if argv:  # a flag is checked by argparse: usage and exit 2
        with pytest.raises(SystemExit) as raised:
            main([*argv, "hi"])
        assert raised.value.code == 2 and "--max-reply-tokens" in capsys.readouterr().err
    else:
        assert main([*argv, "hi"]) == 2
        assert "AGENT_MAX_REPLY_TOKENS" in capsys.readouterr().err


def test_an_endpoint_that_asks_for_max_completion_tokens_gets_it_for_the_rest_of_the_run(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    server = serve([act("calculator", expression="1 + 1"), act("finish", result="2")],
                   screen=wants_max_completion_tokens)
    assert main(["--max-reply-tokens", "500", "--trace", str(trace), "hi"]) == 0
    assert reply_caps(server) == [{"max_tokens": 500}, {"max_completion_tokens": 500}, {"max_completion_tokens": 500}]
    assert ("note: the endpoint takes no max_tokens; sending the reply cap as max_completion_tokens from now on\n"
            in capsys.readouterr().err)
    assert [(s["name"], s["value"], s["text"]) for s in events(trace, "setting")] == [
        ("reply_cap_field", "max_completion_tokens",
         "the endpoint takes no max_tokens; sending the reply cap as max_completion_tokens from now on")]


def test_resume_keeps_the_reply_cap_field_the_endpoint_asked_for(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    server = serve([act("calculator", expression="1 + 1"), act("finish", result="2")],
                   screen=wants_max_completion_tokens)
    assert main(["--trace", str(trace), "--max-rounds", "1", "--quiet", "hi"]) == 1
    assert main(["--resume", str(trace), "--max-rounds", "2", "--quiet"]) == 0
    assert reply_caps(server) == [{"max_tokens": 4096}, *[{"max_completion_tokens": 4096}] * 2]


def test_asking_for_max_completion_tokens_is_not_a_schema_refusal(serve, capsys):
    server = serve([FINISH], screen=wants_max_completion_tokens)
    assert main(["--mode", "schema", "--quiet", "hi"]) == 0
    assert [f["type"] for f in response_formats(server)] == ["json_schema", "json_schema"]
    assert reply_caps(server)[-1] == {"max_completion_tokens": 4096}


def test_a_400_about_max_tokens_that_names_no_alternative_is_an_error(serve, capsys):
    server = serve([{"status": 400, "body": {"error": {"message": "max_tokens must be at most 2048"}}}])
    assert main(["hi"]) == 3
    assert len(server.requests) == 1
    assert "max_tokens must be at most 2048" in capsys.readouterr().err


def test_a_reply_cut_off_at_the_cap_is_fed_back_saying_so(serve, capsys):
    cut = {"content": '{"tool": "calculator", "args": {"expression": "12 + 5', "finish_reason": "length"}
    server = serve([cut, act("finish", result="ok")])
    assert main(["hi"]) == 0
    said = server.sent_messages(1)[-1]["content"]
    assert said.startswith("Your reply could not be used: it was cut off at the length limit (it looks like an"
                           " action but is not JSON that can be read: keys and texts go in double quotes); keep"
                           " replies short")
    assert "cut off at the length limit" in capsys.readouterr().err


def test_a_cut_off_reply_whose_action_survived_runs_it_and_says_it_was_cut_off(serve, capsys):
    cut = {"content": act("calculator", expression="2 + 2") + "\nLet me explain at length why",
           "finish_reason": "length"}
    server = serve([cut, act("finish", result="4")])
    assert main(["--quiet", "hi"]) == 0
    lines = server.sent_messages(1)[-1]["content"].splitlines()
    assert json.loads(lines[1])["result"] == {"ok": True, "data": 4}
    assert lines[-1] == "Note: your last reply was cut off at the length limit; keep replies short, the JSON alone."


def test_resume_keeps_the_reply_cap(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    serve([act("calculator", expression="1 + 1")], key=None)
    assert main(["--max-reply-tokens", "0", "--max-rounds", "1", "--trace", str(trace), "--quiet", "hi"]) == 1
    assert events(trace, "start")[0]["max_reply_tokens"] == 0
    server = serve([act("finish", result="2")], key=None)
    assert main(["--resume", str(trace), "--max-rounds", "2", "--quiet"]) == 0
    assert reply_caps(server) == [{}]


def test_help_says_which_limit_is_the_run_budget_and_which_caps_each_reply(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--max-tokens N token budget of the whole run" in out
    assert "--max-reply-tokens N cap on each reply" in out
    assert "AGENT_MAX_REPLY_TOKENS default for --max-reply-tokens (4096)" in out and "0 sends none" in out


# --- what the schema lets a constrained model write ----------------------------------------

def test_in_schema_mode_finish_and_fail_come_alone():
    calls, ending = prompts.action_schema(in_use(REGISTRY), max_calls=5)["properties"]["actions"]["anyOf"]
    assert [b["properties"]["tool"]["enum"][0] for b in calls["items"]["anyOf"]] == [*REGISTRY, "recall", "note"]
    assert (calls["minItems"], calls["maxItems"]) == (1, 5)
    assert [b["properties"]["tool"]["enum"][0] for b in ending["items"]["anyOf"]] == ["finish", "fail"]
    assert (ending["minItems"], ending["maxItems"]) == (1, 1)
    assert "- finish or fail must come alone in a reply" in prompts.render_system_prompt(in_use(REGISTRY), "schema", 8)


def test_with_no_tools_exposed_the_schema_holds_only_finish_and_fail():
    calls, ending = prompts.action_schema(in_use({}), max_calls=8)["properties"]["actions"]["anyOf"]
    assert [b["properties"]["tool"]["enum"][0] for b in calls["items"]["anyOf"]] == ["recall", "note"]
    assert [b["properties"]["tool"]["enum"][0] for b in ending["items"]["anyOf"]] == ["finish", "fail"]
