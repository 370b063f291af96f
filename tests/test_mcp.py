"""MCP servers' tools: naming servers, schemas every mode can use, calls and their results, and
servers that misbehave. The servers are real processes: tests/mcp_servers/toolbox.py (the SDK's
own server, over streamable HTTP), mcp_server_time (the SDK's, over stdio) when installed, and
bare.py, a plain-Python stdio server that starts in a blink, for the tests that start servers
again and again (one built on the SDK takes seconds: it imports the SDK)."""
import http.server
import importlib.util
import io
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytestmark = pytest.mark.processes  # every test here talks to an MCP server, a process

# Checked without importing it: the SDK takes a second or two to import, and the HTTP server
# below starts meanwhile.
if importlib.util.find_spec("mcp") is None:
    pytest.skip("needs the mcp package: pip install -e '.[test]' (Python 3.10+)", allow_module_level=True)

import jsonschema  # noqa: E402  (the mcp SDK depends on it)


from agent_demo_kit import prompts  # noqa: E402
from agent_demo_kit import tools  # noqa: E402
from agent_demo_kit.mcp_client import DESTRUCTIVE, McpTools  # noqa: E402
from agent_demo_kit.mcp_schemas import McpError, parse_server_specs
from agent_demo_kit.mcp_schemas import parameters_of as _parameters
from agent_demo_kit.schemas import simplify_schema
from agent_demo_kit.cli import main  # noqa: E402
from conftest import KEY, ROOT, child_environment, said_lines  # noqa: E402
from scripted_server import ScriptedServer, action as act  # noqa: E402

SERVERS = os.path.join(ROOT, "tests", "mcp_servers")
TOOLBOX = os.path.join(SERVERS, "toolbox.py")
BARE = os.path.join(SERVERS, "bare.py")
with open(os.path.join(SERVERS, "odd_schema.json")) as odd_file:
    ODD_SCHEMA = json.load(odd_file)


def pids(sink: io.StringIO) -> list:
    """The pid each start of a server said on its stderr (copied to the sink)."""
    return [int(pid) for pid in re.findall(r"^mcp \w+: pid (\d+)$", sink.getvalue(), re.MULTILINE)]


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# --- naming servers -----------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://user:mcpPASSWORD1@127.0.0.1:9/mcp", "http://127.0.0.1:9/mcp?token=mcpTOKEN12345"])
def test_a_secret_in_an_mcp_server_s_url_is_never_shown(serve, capsys, url):
    serve([act("finish", result="ok")])
    assert main(["--json", "--mcp", url, "hi"]) == 2  # nobody listens on port 9
    out, err = capsys.readouterr()
    assert "MCP server local_9" in err and "***" in err
    assert "mcpPASSWORD1" not in out + err and "mcpTOKEN12345" not in out + err


def test_an_mcp_url_with_an_at_in_its_path_or_a_utf8_login_is_taken():
    specs = parse_server_specs(["https://server.smithery.ai/@upstash/context7-mcp/mcp", "https://u:密码@example.com/mcp"])
    assert [spec.url for spec in specs] == ["https://server.smithery.ai/@upstash/context7-mcp/mcp",
                                            "https://u:密码@example.com/mcp"]


def test_an_mcp_url_s_secret_is_not_in_config_nor_in_a_batch_s_results(serve, capsys, tmp_path):
    serve([act("finish", result="ok")])
    url = "http://user:mcpPASSWORD1@127.0.0.1:9/mcp?token=mcpTOKEN12345"
    assert main(["--config", "--mcp", url]) == 0
    assert main(["--config", "--json", "--mcp", url]) == 0
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("add 2 and 3\n")
    main(["--batch", str(tasks), "--out", str(tmp_path / "out"), "--mcp", url])  # the server is not there
    assert (tmp_path / "out" / "results.jsonl").exists()
    written = "".join(path.read_text() for path in (tmp_path / "out").rglob("*") if path.is_file())
    shown = "".join(capsys.readouterr()) + written
    assert "mcpPASSWORD1" not in shown and "mcpTOKEN12345" not in shown


@pytest.mark.parametrize("url, said", [("http://127.0.0.1:abc/mcp", "port"), ("http://[::1/mcp", "cannot be read"),
                                       ("http://u:p/w@127.0.0.1:9/mcp", '"@" after where its host ends')])
def test_an_mcp_url_that_cannot_be_sent_to_is_a_one_line_error(serve, capsys, tmp_path, url, said):
    serve([act("finish", result="ok")])
    assert main(["--mcp", url, "hi"]) == 2
    assert said in capsys.readouterr().err
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"docs": {"url": url}}}))
    assert main(["--mcp-config", str(config), "hi"]) == 2
    err = capsys.readouterr().err
    assert said in err and "server docs" in err and "Traceback" not in err


def test_each_server_gets_a_short_name_from_its_command_url_or_config(tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                  "env": {"ROOT": "/tmp"}},
        "docs": {"url": "https://example.com/mcp"},
        "time": {"command": "uvx", "args": ["mcp-server-time"]}}}))
    specs = parse_server_specs(["python -m mcp_server_time", "uvx mcp-server-fetch", "https://mcp.deepwiki.com/mcp",
                                "http://127.0.0.1:8000/mcp"], str(config))
    assert [spec.name for spec in specs] == ["time", "fetch", "deepwiki", "local_8000", "files", "docs", "time_2"]
    assert specs[0].command == ("python", "-m", "mcp_server_time")
    assert specs[2].url == "https://mcp.deepwiki.com/mcp"
    assert specs[4].command == ("npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp")
    assert specs[4].env == {"ROOT": "/tmp"}


@pytest.mark.parametrize("content, said", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"servers": {}}', 'expected {"mcpServers"'),
    ('{"mcpServers": {"x": {"args": ["a"]}}}', 'server x has neither "command" nor "url"'),
    ('{"mcpServers": {"x": {"command": "run", "args": "a b"}}}', 'server x: "args" must be a list of strings'),
    ('{"mcpServers": {"x": {"command": "run", "env": {"N": 1}}}}', 'server x: "env" must map names to strings'),
    ('{"mcpServers": {"x": {"url": "ftp://example.com"}}}', 'server x: "url" must be an http:// or https:// URL'),
])
def test_a_bad_config_file_is_one_clear_error(tmp_path, content, said):
    path = tmp_path / "mcp.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(McpError) as raised:
        parse_server_specs([], str(path))
    assert said in str(raised.value) and str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_command_with_unbalanced_quotes_is_an_error():
    with pytest.raises(McpError, match="--mcp"):
        parse_server_specs(["python 'server.py"], None)


# --- schemas every mode can use ---------------------------------------------------------------

REJECTED_BY_GRAMMAR_CONVERTERS = {"$ref", "$defs", "definitions", "allOf", "oneOf", "not", "if", "then", "else",
                                  "patternProperties", "format", "dependentRequired", "dependentSchemas"}


def every_schema_in(schema: dict):
    yield schema
    for value in schema.get("properties", {}).values():
        yield from every_schema_in(value)
    for value in schema.get("anyOf", []):
        yield from every_schema_in(value)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from every_schema_in(schema[key])


def test_a_simplified_schema_is_typed_throughout_and_free_of_what_grammar_converters_reject():
    parameters, required = _parameters(ODD_SCHEMA)
    assert required == ["point", "when"]
    assert parameters["point"]["properties"] == {"x": {"type": "integer"}, "y": {"type": "integer"}}
    assert parameters["anything"]["anyOf"] == tools.ANY_JSON["anyOf"]
    assert parameters["when"]["description"] == "when (format: date-time)"
    assert "pattern" not in parameters["code"] and parameters["code"]["description"] == "code (pattern: [0-9]{3})"
    assert "pattern" not in parameters["choice"]["anyOf"][0], "a server's pattern is its own to check"
    for name, schema in parameters.items():
        assert schema["description"], name
        for part in every_schema_in(schema):
            assert "type" in part or "anyOf" in part, (name, part)
            assert not REJECTED_BY_GRAMMAR_CONVERTERS & set(part), (name, part)


@pytest.mark.parametrize("where", ["top", "nested", "property names"])
def test_a_servers_pattern_that_takes_for_ever_is_not_matched_here(where):
    slow = "^(a+)+$"
    schema = {"type": "object", "properties": {"text": {"type": "string", "pattern": slow}}, "required": ["text"]}
    args = {"text": "a" * 40 + "!"}
    if where == "nested":
        schema = {"type": "object", "properties": {"item": schema}, "required": ["item"]}
        args = {"item": args}
    elif where == "property names":
        schema = {"type": "object", "patternProperties": {slow: {"type": "string"}}, "additionalProperties": False}
        args = {"a" * 40 + "!": "x"}
    # In a process of its own: Python's re would hold this one, the test runner too, for hours.
    checked = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import json, sys
        from agent_demo_kit import tools
        from agent_demo_kit.mcp_schemas import argument_checker, parameters_of
        schema, args = json.loads(sys.argv[1]), json.loads(sys.argv[2])
        parameters, required = parameters_of(schema)
        print(json.dumps([tools.check_args(tools.Tool("t", "t", parameters, required, {{}}), args),
                          argument_checker(schema)(args), parameters]))
        """), json.dumps(schema), json.dumps(args)], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert checked.returncode == 0, checked.stderr
    local, server_schema, parameters = json.loads(checked.stdout)
    assert server_schema is None and (local is None or where == "property names"), "left to the server to judge"
    assert slow in json.dumps(parameters) or where != "top", "the model is told the pattern"


def test_alternative_argument_sets_offer_every_argument_and_require_none():
    either = {"type": "object", "oneOf": [{"properties": {"path": {"type": "string"}}, "required": ["path"]},
                                          {"properties": {"url": {"type": "string"}}, "required": ["url"]}]}
    parameters, required = _parameters(either)
    assert set(parameters) == {"path", "url"} and required == []
    described = tools.Tool("fetch", "a tool", parameters, required, {})
    assert tools.check_args(described, {"url": "https://example.com"}) is None


def test_a_recursive_schema_is_cut_off_rather_than_followed_forever():
    tree = {"$defs": {"Node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}, "$ref": "#/$defs/Node"}
    simple = simplify_schema(tree)
    assert simple["properties"]["children"]["items"]["anyOf"] == tools.ANY_JSON["anyOf"]


# Each value is valid under its schema; the simplified one must take it too.
ACCEPTED = [
    ({"type": ["integer", "null"]}, None),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, 3),
    ({"$ref": "#/$defs/Point"}, {"x": 1, "y": 2}),
    ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, 5),
    ({"enum": [1, "a"]}, "a"),
    ({"enum": [1, 2.5]}, 1),
    ({"const": "x"}, "x"),
    ({}, {"any": ["thing"]}),
    ({"description": "untyped"}, 1.5),
    ({"type": "string", "pattern": "[0-9]"}, "a1b"),
    ({"type": "string", "format": "email"}, "not an email"),
    ({"type": "object", "patternProperties": {"^t_": {"type": "string"}}, "additionalProperties": False}, {"t_a": "x"}),
    ({"type": "array", "prefixItems": [{"type": "string"}]}, ["a", 1]),
    ({"type": "number", "exclusiveMinimum": 0}, 0.5),
    ({"type": "integer", "not": {"const": 13}}, 14),
    ({"anyOf": [{"type": "object"}, {"type": "array", "items": {"type": "integer"}}]}, [1]),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "ab"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, {"a": "x", "b": 1}),
]


@pytest.mark.parametrize("schema, value", ACCEPTED)
def test_the_simplified_schema_takes_what_the_original_takes(schema, value):
    whole = {"type": "object", "$defs": ODD_SCHEMA["$defs"], "properties": {"v": schema}, "required": ["v"]}
    jsonschema.validate({"v": value}, whole)
    parameters, required = _parameters(whole)
    described = tools.Tool("t", "a tool", parameters, required, {})
    assert tools.check_args(described, {"v": value}) is None


# --- servers that work: the toolbox over HTTP, bare and the time server over stdio -----------------

@pytest.fixture(scope="module")  # once: the file runs on one worker (pyproject.toml)
def servers(tmp_path_factory):
    """One run's servers, started together: the toolbox over HTTP ("web") and bare over stdio; yields
    (McpTools, the sink their stderr went to). (The reference time server is run through the command
    line below, once: it takes a second or two to start.)"""
    listening = socket.create_server(("127.0.0.1", 0))  # ours: the client can connect before the server is up
    web = subprocess.Popen([sys.executable, TOOLBOX, str(listening.fileno())], pass_fds=[listening.fileno()],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{listening.getsockname()[1]}/mcp"
    listening.close()
    entries = {"web": {"url": url}, "bare": {"command": sys.executable, "args": [BARE]}}
    config = tmp_path_factory.mktemp("mcp") / "mcp.json"
    config.write_text(json.dumps({"mcpServers": entries}))
    sink, mcp_tools = io.StringIO(), McpTools()
    try:
        mcp_tools.start(parse_server_specs([], str(config)), tool_timeout=10, taken_names=tools.in_use(tools.REGISTRY),
                        stderr=sink, startup_timeout=30)
        yield mcp_tools, sink
    finally:
        mcp_tools.close()
        web.kill()
        web.wait()


def call(servers, name, **args):
    return tools.call_tool(name, args, servers[0].tools)


def test_tools_join_the_registry_and_a_clash_gets_the_server_name_in_front(servers):
    mcp_tools, _ = servers
    assert {"web_echo", "bare_echo", "web_calculator", "add", "odd", "crash"} <= set(mcp_tools.tools)
    assert not {"echo", "calculator"} & set(mcp_tools.tools)  # no tool hides another
    assert "MCP server web: its tool calculator is called web_calculator here, since another tool is named" \
           " calculator" in mcp_tools.notes
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name) for name in mcp_tools.tools)
    assert call(servers, "web_echo", text="over http") == {"ok": True, "data": "over http"}
    assert call(servers, "bare_echo", text="over stdio") == {"ok": True, "data": "over stdio"}
    assert call(servers, "web_calculator", text="1 + 1") == {"ok": True, "data": '{"text": "1 + 1"}'}


def test_every_mode_can_send_the_tools(servers):
    registry = tools.in_use({**tools.REGISTRY, **servers[0].tools})
    for mode in ("json", "schema", "tools"):
        assert "web_echo" in prompts.render_system_prompt(registry, mode, max_calls=8)
        json.dumps(prompts.request_options(mode, registry, max_calls=8), allow_nan=False)
    function = next(entry["function"] for entry in prompts.request_options("tools", registry, 8)["tools"]
                    if entry["function"]["name"] == "odd")
    assert function["parameters"]["required"] == ["point", "when"]
    assert "$ref" not in json.dumps(function["parameters"])


def test_a_result_is_its_text_or_its_structured_content(servers):
    assert call(servers, "web_echo", text="héllo") == {"ok": True, "data": "héllo"}
    assert call(servers, "add", a=2, b=3) == {"ok": True, "data": {"sum": 5}}


def test_an_is_error_result_is_a_failed_call_with_its_message(servers):
    assert call(servers, "broken") == {"ok": False, "error": "the disk is on fire"}


def test_images_and_binary_resources_are_described_not_sent(servers):
    assert call(servers, "picture") == {"ok": True, "data": "a red dot\n[image image/png, 70 bytes, not shown]"}
    assert call(servers, "documents")["data"].splitlines() == [
        "buy milk",
        "[resource file:///data.bin: application/octet-stream, 300 bytes, not shown]",
        "[resource link: https://example.com/report.pdf]"]


def test_annotations_of_a_local_server_decide_whether_a_call_asks_first_and_what_the_question_says(servers):
    registry = servers[0].tools
    assert (registry["peek"].side_effects, registry["peek"].warning) == (False, None)
    assert (registry["bare_echo"].side_effects, registry["bare_echo"].warning) == (True, None)
    assert (registry["tidy"].side_effects, registry["tidy"].warning) == (True, DESTRUCTIVE), \
        "read-only and destructive at once is not read-only"


def test_a_url_server_s_annotations_are_its_word_about_itself_and_skip_no_question(servers):
    registry = servers[0].tools
    assert (registry["add"].side_effects, registry["add"].warning) == (True, None)  # says read-only
    assert (registry["web_echo"].side_effects, registry["erase"].side_effects) == (True, True)
    assert registry["erase"].warning == DESTRUCTIVE  # a warning is believed: it only adds care


def test_arguments_are_judged_by_the_server_own_schema(servers):
    point = {"x": 1, "y": 2}
    taken = call(servers, "odd", point=point, when="now", size=14, tags={"t_a": "x"}, code="a123")
    assert taken["ok"] and json.loads(taken["data"])["tags"] == {"t_a": "x"}
    refused = call(servers, "odd", point=point, when="now", size=13)
    assert refused["ok"] is False and refused["error"].startswith("bad arguments for odd: size: ")
    assert call(servers, "odd", point={"x": 1}, when="now")["error"] == \
        "bad arguments for odd: point: 'y' is a required property"
    assert call(servers, "odd", point=point, when="now", code="abc")["ok"], "a pattern is the server's to check"
    assert call(servers, "odd", when="now")["error"].startswith("bad arguments for odd: missing point")  # ours


def test_a_server_stderr_goes_to_the_sink_line_by_line(servers):
    assert re.search(r"^mcp bare: pid \d+$", servers[1].getvalue(), re.MULTILINE)


def test_a_recorded_description_tells_what_changed(servers):
    mcp_tools, _ = servers
    recorded = json.loads(json.dumps(mcp_tools.describe()))
    web, bare = recorded[0], recorded[1]
    assert web["url"].startswith("http://127.0.0.1:") and web["tools"]["web_calculator"] == "calculator"
    assert bare["command"] == [sys.executable, BARE] and bare["digest"].startswith("sha256:")
    assert mcp_tools.changes_since(recorded) == []
    web["digest"], web["tools"] = "sha256:0", {**web["tools"], "paint": "paint"}
    web["tools"].pop("add")
    recorded.remove(bare)
    recorded.append({"name": "gone", "command": ["old-server"], "tools": {}, "digest": "sha256:1"})
    assert mcp_tools.changes_since(recorded) == [
        "MCP server web's tool list changed (new: add; gone: paint)",
        "MCP server gone is not connected now",
        "MCP server bare is new"]


# --- servers that misbehave ---------------------------------------------------------------------

@pytest.mark.processes
@pytest.mark.parametrize("command, said", [
    ("/nonexistent/mcp-server", "cannot run it: No such file or directory"),
    (f"{sys.executable} {BARE} --exit-on-initialize", "its stderr ended with: "),
    (f"{sys.executable} {BARE} --silent", "no answer to the handshake within 0.3 s"),
])
def test_a_server_that_does_not_start_is_one_line_naming_it(command, said):
    started = time.monotonic()
    with pytest.raises(McpError) as raised, McpTools() as mcp_tools:
        mcp_tools.start(parse_server_specs([command]), 10, stderr=io.StringIO(), startup_timeout=0.3)
    message = str(raised.value)
    assert message.startswith(f"MCP server {parse_server_specs([command])[0].name} (") and said in message
    assert "\n" not in message and time.monotonic() - started < 9  # not the 10 s a call may take
    if "--exit" in command:
        assert message.endswith("bare: cannot open the database")


@pytest.mark.processes
def test_a_server_that_crashes_is_restarted_once_then_its_calls_fail(capfd):
    sink = io.StringIO()
    with McpTools() as mcp_tools:
        registry = mcp_tools.start(parse_server_specs([f"{sys.executable} {BARE}"]), 10, stderr=sink)
        assert tools.call_tool("echo", {"text": "a"}, registry) == {"ok": True, "data": "a"}
        crashed = tools.call_tool("crash", {}, registry)
        assert crashed["error"] == ("crash failed: MCP server bare stopped and was restarted; the call may not"
                                    " have run: try it again if needed")
        assert tools.call_tool("echo", {"text": "b"}, registry) == {"ok": True, "data": "b"}
        assert "again" in tools.call_tool("crash", {}, registry)["error"]
        assert tools.call_tool("echo", {"text": "c"}, registry)["error"] == "echo failed: MCP server bare is not running"
    first, second = pids(sink)
    assert is_gone(first) and is_gone(second)
    shown = capfd.readouterr()
    assert shown.out == "" and "bare:" not in shown.err  # a server's stderr goes to the sink alone


@pytest.mark.processes
def test_a_call_that_hangs_ends_at_the_tool_timeout_and_the_server_goes_on():
    with McpTools() as mcp_tools:
        registry = mcp_tools.start(parse_server_specs([f"{sys.executable} {BARE}"]), tool_timeout=0.3,
                                   stderr=io.StringIO())
        started = time.monotonic()
        assert tools.call_tool("hang", {}, registry) == {
            "ok": False, "error": "hang did not finish within 0.3 s (--tool-timeout); it may still be running"}
        assert time.monotonic() - started < 10  # the hang is for ever
        assert tools.call_tool("echo", {"text": "still here"}, registry)["data"] == "still here"


@pytest.mark.processes
def test_close_ends_every_server_process_and_can_be_called_again():
    sink, mcp_tools = io.StringIO(), McpTools()
    registry = mcp_tools.start(parse_server_specs([f"{sys.executable} {BARE}", f"{sys.executable} {BARE}"]), 10,
                               stderr=sink)
    assert set(registry) == {f"{server}_{name}" for server in ("bare", "bare_2")
                             for name in ("echo", "crash", "hang", "peek", "tidy")}
    mcp_tools.close()
    mcp_tools.close()
    assert len(pids(sink)) == 2 and all(is_gone(pid) for pid in pids(sink))
    assert "not running" in tools.call_tool("bare_echo", {"text": "x"}, registry)["error"]


# --- through the command line ---------------------------------------------------------------------

def echo_then_finish(mode: str) -> list:
    """A scripted model that calls bare.py's echo in this mode, then finishes."""
    if mode == "tools":
        call = {"id": "e1", "type": "function", "function": {"name": "echo", "arguments": '{"text": "hello mcp"}'}}
        return [{"content": "", "tool_calls": [call]}, act("finish", result="done")]
    if mode == "schema":
        return [json.dumps({"actions": [{"tool": "echo", "args": {"text": "hello mcp"}}]}),
                json.dumps({"actions": [{"tool": "finish", "args": {"result": "done"}}]})]
    return [act("echo", text="hello mcp"), act("finish", result="done")]


@pytest.mark.processes
@pytest.mark.parametrize("mode", ["json", "schema", "tools"])
def test_a_server_named_with_mcp_serves_its_tools_in_every_mode(serve, capsys, mode):
    server = serve(echo_then_finish(mode))
    assert main(["--mcp", f"{sys.executable} {BARE}", "--mode", mode, "--yes", "--quiet", "say hello"]) == 0
    first = server.requests[0]["body"]
    assert "echo" in json.dumps(first["messages"][0]["content"] if mode == "json" else first)
    assert "hello mcp" in json.dumps(server.requests[1]["body"]["messages"][-1])
    [pid] = pids_said(capsys.readouterr().err)
    assert is_gone(pid), "the server is stopped when the run ends"


def pids_said(err: str) -> list:
    return [int(pid) for pid in re.findall(r"^mcp \w+: pid (\d+)$", err, re.MULTILINE)]


@pytest.mark.processes
def test_a_server_from_mcp_config_and_its_side_effects_are_asked_about(serve, capsys, tmp_path):
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"box": {"command": sys.executable, "args": [BARE]}}}))
    server = serve(echo_then_finish("json"))
    assert main(["--mcp-config", str(config), "--quiet", "say hello"]) == 0
    told = json.dumps(server.requests[1]["body"]["messages"][-1])
    assert "needs the user's approval" in told and '\\"ok\\": true' not in told, "no terminal to ask: refused"


@pytest.mark.processes
def test_a_server_that_does_not_start_is_a_configuration_error(serve, capsys):
    server = serve([act("finish", result="never")])
    assert main(["--mcp", f"{sys.executable} {BARE} --exit-on-initialize", "x"]) == 2
    err = capsys.readouterr().err
    [said] = said_lines(err)
    assert said.startswith("agent-demo: error: ") and "cannot open the database" in said
    assert err.count("cannot open the database") == 1, "its stderr is said once, in the error"
    assert server.requests == []


@pytest.mark.processes
def test_resume_starts_the_same_servers(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    serve([act("echo", text="one")])
    assert main(["--mcp", f"{sys.executable} {BARE}", "--yes", "--max-rounds", "1", "--trace", str(trace), "x"]) == 1
    assert json.loads(trace.read_text().splitlines()[0])["mcp"][0]["name"] == "bare"
    server = serve([act("echo", text="two"), act("finish", result="done")])
    assert main(["--resume", str(trace), "--mcp", f"{sys.executable} {BARE}", "--yes", "--max-rounds", "3",
                 "--quiet"]) == 0
    assert "two" in json.dumps(server.requests[1]["body"]["messages"][-1])


def time_call(mode: str) -> list:
    """A scripted model that asks the reference time server for the time in UTC, in this mode, then finishes."""
    if mode == "tools":
        call = {"id": "t1", "type": "function", "function": {"name": "get_current_time",
                                                             "arguments": '{"timezone": "UTC"}'}}
        return [{"content": "", "tool_calls": [call]}, act("finish", result="done")]
    if mode == "schema":
        return [json.dumps({"actions": [{"tool": "get_current_time", "args": {"timezone": "UTC"}}]}),
                json.dumps({"actions": [{"tool": "finish", "args": {"result": "done"}}]})]
    return [act("get_current_time", timezone="UTC"), act("finish", result="done")]


@pytest.mark.skipif(importlib.util.find_spec("mcp_server_time") is None, reason="needs mcp-server-time")
# One mode here (the server takes ~2 s to start: it imports the SDK); json and schema mode, and --mcp,
# are covered with bare.py above, and all three were run against this server by hand.
@pytest.mark.processes
@pytest.mark.parametrize("mode, named_by", [("tools", "--mcp-config")])
def test_a_reference_server_from_the_package_registry_answers_in_every_mode(serve, capsys, tmp_path, mode, named_by):
    server = serve(time_call(mode))
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]}}}))
    named = ["--mcp", f"{sys.executable} -m mcp_server_time"] if named_by == "--mcp" else ["--mcp-config", str(config)]
    assert main([*named, "--mode", mode, "--quiet", "what time is it in UTC?"]) == 0
    told = json.dumps(server.requests[1]["body"]["messages"][-1])
    assert '\\"ok\\": true' in told and "UTC" in told and "datetime" in told, told


@pytest.mark.processes
def test_no_server_process_is_left_after_sigterm_mid_call(serve, capsys):
    import signal
    from conftest import signal_once
    server = serve([act("hang")], key=None)
    seen = []  # the request to the model went out 0.1 s ago: the call is on its way to the server
    with signal_once(signal.SIGTERM, when=lambda: bool(server.requests) and len(seen.append(1) or seen) > 10):
        code = main(["--mcp", f"{sys.executable} {BARE}", "--yes", "--tool-timeout", "30", "x"])
    assert code == 143
    [pid] = pids_said(capsys.readouterr().err)
    deadline = time.monotonic() + 5
    while not is_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert is_gone(pid), "the server process was stopped with the run"


def test_an_empty_command_and_an_unreadable_config_are_one_clear_error(tmp_path):
    with pytest.raises(McpError, match="the server command is empty"):
        parse_server_specs(["  "])
    with pytest.raises(McpError, match=r"--mcp-config .*: cannot read it \(Is a directory\)"):
        parse_server_specs([], str(tmp_path))


def test_a_schema_jsonschema_cannot_use_leaves_the_arguments_to_the_server():
    from agent_demo_kit.mcp_client import placeholder
    from agent_demo_kit.mcp_schemas import argument_checker
    assert argument_checker({"type": "no-such-type"})({"anything": 1}) is None
    assert placeholder({"enum": ["b", "a"]}) == "b" and placeholder({"anyOf": [{"type": "integer"}]}) == 1


# --- a server's regular expressions, wherever they come from ------------------------------------------

SLOW = "^(a+)+$"  # Python's re takes ~2^n steps on "a" * n + "!", holding the whole process meanwhile
SHOUT_SERVER = """
import json, sys
SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "pattern": %r}}, "required": ["text"]}
TOOLS = [{"name": "shout", "description": "Shout.", "inputSchema": {"type": "object", "properties": {}},
          "outputSchema": SCHEMA}]
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method, params = message.get("method"), message.get("params") or {}
    result = ({"protocolVersion": params.get("protocolVersion"), "capabilities": {"tools": {}},
               "serverInfo": {"name": "shout", "version": "1"}} if method == "initialize" else
              {"tools": TOOLS} if method == "tools/list" else
              {"content": [{"type": "text", "text": "A" * 40}], "structuredContent": {"text": "a" * 40 + "!"}})
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\\n")
    sys.stdout.flush()
""" % SLOW


def test_a_pattern_in_a_servers_output_schema_that_takes_for_ever_does_not_hold_the_run(tmp_path):
    server = tmp_path / "shout.py"
    server.write_text(SHOUT_SERVER)
    with ScriptedServer([act("shout"), act("finish", result="done")]) as model:
        process = subprocess.Popen([sys.executable, os.path.join(ROOT, "agent_demo.py"), "--no-log", "-q", "--yes",
                                    "--tool-timeout", "5", "--mcp", f"{sys.executable} {server}", "shout"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=child_environment({"LLM_API_URL": model.url, "LLM_API_KEY": KEY}))
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            pytest.fail("the run was still matching the server's output pattern after 60 s")
        told = json.dumps(model.requests[1]["body"]["messages"][-1])
    assert (process.returncode, out) == (0, "done\n"), err
    assert "a" * 40 + "!" in told, "the result is data: the model is given it"


def test_a_servers_remote_ref_is_not_fetched_so_no_pattern_of_it_is_matched_here():
    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            body = json.dumps({"type": "string", "pattern": "^[0-9]+$"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        from agent_demo_kit.mcp_schemas import argument_checker
        remote = f"http://127.0.0.1:{web.server_port}/text.json"
        schema = {"type": "object", "properties": {"text": {"$ref": remote}, "n": {"type": "integer"}}}
        check = argument_checker(schema)
        assert check({"text": "abc"}) is None, "the server judges what its remote schema says"
        assert check({"n": "x"}) is not None, "the rest of the schema is still checked"
    finally:
        web.shutdown()
    assert asked == [], "a schema's $ref is not fetched: the server's own schema is all there is"


def test_a_servers_patterns_are_not_even_compiled_here(monkeypatch):
    from agent_demo_kit.mcp_schemas import argument_checker
    compiled = []
    compile_for_real = re.compile
    monkeypatch.setattr(re, "compile", lambda pattern, *args: compiled.append(pattern) or compile_for_real(pattern,
                                                                                                      *args))
    huge = "^" + "[\\u0000-\\U0010ffff]" * 3 + "(x)$"  # a server's may be megabytes: Python compiles them slowly
    schema = {"type": "object", "properties": {"text": {"type": "string", "pattern": huge}},
              "patternProperties": {huge: {"type": "string"}}, "$defs": {"t": {"pattern": huge}}}
    parameters, _ = _parameters(schema)
    assert argument_checker(schema)({"text": "abc"}) is None
    assert huge not in compiled, "a server's pattern is compiled here"


def test_a_value_in_a_servers_schema_that_holds_a_key_named_pattern_is_kept():
    from agent_demo_kit.mcp_schemas import argument_checker
    schema = {"type": "object", "properties": {"rule": {"const": {"pattern": "x"}}, "kind": {"enum": [{"pattern": 1}]},
                                               "pattern": {"type": "string"}}, "required": ["pattern"]}
    check = argument_checker(schema)
    assert check({"rule": {"pattern": "x"}, "kind": {"pattern": 1}, "pattern": "any"}) is None
    assert check({"rule": {}, "pattern": "any"}) is not None and check({}) is not None


# Each value is valid under its server's schema; with the patterns left out, a check would reject it.
NARROWED_WITHOUT_PATTERNS = [
    ({"type": "string", "not": {"pattern": "^rm "}}, "ls -l"),
    ({"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "^b"}]}, "apple"),
    ({"type": "string", "if": {"pattern": "^#"}, "then": {"maxLength": 3}, "else": {"minLength": 5}}, "hello"),
    ({"type": "object", "patternProperties": {"^x_": {"type": "string"}}, "additionalProperties": {"type": "integer"}},
     {"x_name": "text"}),
    ({"type": "array", "contains": {"pattern": "^!"}, "maxContains": 1}, ["!a", "b"]),
    ({"type": "string", "not": {"$ref": "#/$defs/danger"}}, "ls -l"),
]


@pytest.mark.parametrize("schema, value", NARROWED_WITHOUT_PATTERNS)
def test_where_leaving_a_pattern_out_would_reject_good_arguments_the_server_judges_them(schema, value):
    from agent_demo_kit.mcp_schemas import argument_checker
    whole = {"type": "object", "$defs": {"danger": {"type": "string", "pattern": "^rm "}}, "properties": {"v": schema}}
    jsonschema.validate({"v": value}, whole)
    assert argument_checker(whole)({"v": value}) is None


def test_a_servers_schema_that_takes_for_ever_to_check_is_left_to_the_server():
    # Each level is either of two copies of the next: a string fails all 2^40 ways before the check ends.
    levels = {f"l{n}": {"anyOf": [{"$ref": f"#/$defs/l{n + 1}"}, {"$ref": f"#/$defs/l{n + 1}"}]} for n in range(40)}
    schema = {"type": "object", "$defs": {**levels, "l40": {"type": "integer"}},
              "properties": {"n": {"$ref": "#/$defs/l0"}, "m": {"type": "integer"}}}
    checked = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys
        from agent_demo_kit.mcp_schemas import argument_checker
        check = argument_checker(json.loads(sys.argv[1]))
        print(json.dumps([check({"n": "x"}), check({"n": 1}), check({"m": "x"})]))
        """), json.dumps(schema)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)[:2] == [None, None], "left to the server to judge"
    assert json.loads(checked.stdout)[2] is not None, "a schema checked within its steps is still checked"
