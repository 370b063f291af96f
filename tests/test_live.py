"""The live trace: streamed replies, the status line, round headers, think blocks, colour."""
import io
import json
import unicodedata
from pathlib import Path

import pytest

from agent_demo_kit.cli import main
from conftest import terminal_as
from scripted_server import action as act
from agent_demo_kit.terminal import Screen, Status
from agent_demo_kit.records import Reply
from agent_demo_kit.endings import EndpointError
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.replies import events, read_stream

ROOT = Path(__file__).resolve().parent.parent
THINK = "<think>First I add 2 and 2.\n" + "Then I check it carefully. " * 60 + "</think>\n"


def rounds_of(trace):
    """The round records of a trace, without what differs from run to run (the request's size: a streamed
    one asks for the stream)."""
    records = [json.loads(line) for line in Path(trace).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("latency_ms", "ts", "request_chars")} for r in records
            if r["event"] == "round"]


# --- server-sent events ------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    (b'data: {"a": 1}\n\ndata: [DONE]\n\n', ['{"a": 1}', "[DONE]"]),
    (b'data: {"a": 1}\r\n\r\ndata:{"b": 2}\r\n\r\n', ['{"a": 1}', '{"b": 2}']),
    (b': keep-alive\n\nevent: message\nid: 7\ndata: {"a":\ndata: 1}\n\n', ['{"a":\n1}']),
    (b'data: {"a": 1}\n\ndata: {"b": 2}', ['{"a": 1}', '{"b": 2}']),
])
def test_events_are_read_whatever_the_servers_line_ends_and_extra_fields(raw, expected):
    pieces = [raw[i:i + 3] for i in range(0, len(raw), 3)]  # arriving a few bytes at a time
    assert list(events(iter(pieces))) == expected


def chunk(delta, finish=None):
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"


def test_a_stream_folds_into_the_body_a_plain_request_returns():
    stream = (chunk({"role": "assistant"}) + chunk({"reasoning_content": "hm"}) + chunk({"content": "Hel"})
              + "data: not json at all\n\n" + chunk({"content": "lo"})
              + chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "calc", "arguments": '{"e'}}]})
              + chunk({"tool_calls": [{"index": 0, "function": {"arguments": '": 1}'}}]}) + chunk({}, "stop")
              + 'data: {"choices": [], "usage": {"total_tokens": 9}}\n\n' + "data: [DONE]\n\n")
    shown = []
    reply = read_stream(iter([stream.encode()]), shown.append)
    assert reply.content == "Hello" and reply.reasoning == "hm"
    assert reply.tool_calls == [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"e": 1}'}}]
    assert reply.usage == {"total_tokens": 9} and reply.finish_reason == "stop"
    assert shown == ["hm", "Hel", "lo"]


# --- streaming against the scripted server ---------------------------------------------------------

GOOD = [act("calculator", expression="2 + 2"), THINK + act("finish", result="4")]


def test_a_streamed_run_gives_the_same_result_usage_and_trace_as_a_plain_one(serve, capsys, tmp_path):
    plain, streamed = tmp_path / "plain.jsonl", tmp_path / "streamed.jsonl"
    serve(GOOD)
    assert main(["--no-stream", "--json", "--quiet", "--trace", str(plain), "add"]) == 0
    plain_out = json.loads(capsys.readouterr().out)
    server = serve(GOOD)
    assert main(["--stream", "--json", "--quiet", "--trace", str(streamed), "add"]) == 0
    streamed_out = json.loads(capsys.readouterr().out)
    assert server.requests[0]["body"]["stream"] is True
    assert streamed_out.pop("run_id") == "streamed" and plain_out.pop("run_id") == "plain"
    assert streamed_out.pop("trace") == str(streamed) and plain_out.pop("trace") == str(plain)
    assert streamed_out == plain_out and streamed_out["usage"]["total_tokens"] == 30
    assert rounds_of(streamed) == rounds_of(plain)


def test_streamed_native_tool_calls_arrive_in_pieces_and_still_run(serve, capsys):
    call = {"id": "c1", "type": "function", "function": {"name": "calculator",
                                                         "arguments": '{"expression": "6 * 7"}'}}
    done = {"id": "c2", "type": "function", "function": {"name": "finish", "arguments": '{"result": "42"}'}}
    server = serve([{"content": None, "tool_calls": [call]}, {"content": None, "tool_calls": [done]}])
    assert main(["--stream", "--mode", "tools", "--quiet", "x"]) == 0
    assert capsys.readouterr().out == "42\n"
    assert server.sent_messages(1)[-1] == {"role": "tool", "tool_call_id": "c1", "content": json.dumps(
        {"call": 1, "tool": "calculator", "args": {"expression": "6 * 7"}, "result": {"ok": True, "data": 42}})}


def test_an_endpoint_that_refuses_streaming_is_asked_without_it_once_and_for_all(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    server = serve([{"refuse_stream": True, "content": act("calculator", expression="1 + 1")},
                    {"refuse_stream": True, "content": act("calculator", expression="2 + 2")},
                    act("calculator", expression="3 + 3"), act("finish", result="6")])
    assert main(["--stream", "--trace", str(trace), "--max-rounds", "2", "x"]) == 1
    assert [r["body"].get("stream") for r in server.requests] == [True, None, None]
    assert "refused streaming" in capsys.readouterr().err
    assert [(r["name"], r["value"]) for r in map(json.loads, trace.read_text().splitlines())
            if r["event"] == "setting"] == [("stream", False)]
    assert main(["--stream", "--resume", str(trace), "--max-rounds", "3", "--quiet"]) == 0
    assert "stream" not in server.requests[3]["body"], "a resumed run does not ask again"


def test_an_endpoint_that_ignores_stream_and_answers_plainly_is_read(serve, capsys):
    serve([{"no_stream": True, "content": act("finish", result="plain")}])
    assert main(["--stream", "--quiet", "x"]) == 0
    assert capsys.readouterr().out == "plain\n"


def test_a_stream_that_trickles_past_the_timeout_is_cut_off(serve, capsys):
    serve([{"piece_delay": 0.4, "content": act("finish", result="slow" * 10)}])
    assert main(["--stream", "--timeout", "0.25", "--retries", "0", "x"]) == 3
    assert "nothing more came within 0.25 s" in capsys.readouterr().err


# --- the human trace ---------------------------------------------------------------------------------

def test_each_round_header_shows_its_time_and_tokens_and_think_blocks_are_shortened(serve, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    serve(GOOD)
    assert main(["--trace", str(trace), "add"]) == 0
    err = capsys.readouterr().err
    header = next(line for line in err.splitlines() if line.startswith("--- round 2/6 ---"))
    assert header.endswith(" s, 15 tokens")
    assert "thinking: First I add 2 and 2. … (" in err and "Then I check it carefully" not in err
    assert "Then I check it carefully" in trace.read_text(), "the trace file keeps the think block whole"


@pytest.fixture
def on_a_terminal(serve, capsys, monkeypatch):
    """Run the command line in this process with its stderr on a pseudo terminal; returns a function
    of (args, env_extra, replies) giving (exit code, stdout, what the terminal showed)."""
    def run(*args, env_extra=None, replies=GOOD):
        serve(replies, key=None)
        for name, value in (env_extra or {}).items():
            monkeypatch.setenv(name, value)
        with terminal_as("stderr", monkeypatch) as shown:
            code = main(list(args))
        return code, capsys.readouterr().out, shown[0].decode("utf-8", "replace")
    return run


SLOW = [{"piece_delay": 0.035, "content": act("calculator", expression="2 + 2")},  # 9 pieces: ~0.3 s
        THINK + act("finish", result="4")]


def test_on_a_terminal_the_trace_is_live_and_in_colour(on_a_terminal):
    code, out, shown = on_a_terminal("add", replies=SLOW)
    assert (code, out) == (0, "4\n")
    assert "\x1b[1;36m--- round 1/6 ---" in shown, "coloured headers"
    assert "model working" in shown and "chars): " in shown, "the reply shown as it arrives"
    assert "--- round 2/6 --- " in shown and " s, 15 tokens" in shown


def test_no_color_turns_colour_off_even_on_a_terminal(on_a_terminal):
    code, out, shown = on_a_terminal("add", env_extra={"NO_COLOR": "1"}, replies=SLOW)
    assert code == 0 and "\x1b[" not in shown
    assert "model working" in shown


def test_off_a_terminal_there_is_no_colour_and_no_status_line_but_the_reply_streams(serve, capsys):
    server = serve(SLOW, key=None)
    code, err = main(["add"]), capsys.readouterr().err
    assert code == 0
    assert "\x1b[" not in err and "model working" not in err and "\r" not in err
    assert server.requests[0]["body"]["stream"] is True, "streamed anyway: --timeout measures silence"


def test_a_stream_cut_off_before_its_end_is_not_taken_for_a_whole_reply():
    stream = chunk({"content": '[{"tool": "calculator", "args": {}}, {"tool": "fin'})
    with pytest.raises(EndpointError, match="stopped arriving"):
        read_stream(iter([stream.encode()]))


def test_tool_calls_without_an_index_are_told_apart_by_their_ids():
    stream = (chunk({"tool_calls": [{"id": "a", "function": {"name": "calculator", "arguments": '{"x": 1}'}}]})
              + chunk({"tool_calls": [{"id": "b", "function": {"name": "get_order_status", "arguments": "{}"}}]})
              + chunk({}, "tool_calls") + "data: [DONE]\n\n")
    reply = read_stream(iter([stream.encode()]))
    assert [(c["id"], c["function"]["name"]) for c in reply.tool_calls] == [
        ("a", "calculator"), ("b", "get_order_status")]


def test_the_status_line_fits_the_terminal_with_wide_characters():
    status = Status()
    status.feed("订单状态查询" * 100)
    line = status.line(60, Redactor())
    assert sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line) <= 60


@pytest.mark.parametrize("text, shown", [
    ("long reasoning\nmore lines</think>I will finish.", ["thinking: long reasoning … (25 chars)",
                                                         "model: I will finish."]),
    ("<think>never closed\nstill thinking", ["thinking: never closed … (27 chars)"]),
])
def test_think_blocks_the_server_cut_open_or_never_closed_are_shortened_too(text, shown):
    stream = io.StringIO()
    Screen(stream).show_reply(1, 6, Reply(content=text), text, {}, False)
    assert stream.getvalue().splitlines()[2:] == shown


def test_a_round_header_estimates_the_tokens_when_the_endpoint_reports_none(serve, capsys):
    serve([{"content": act("finish", result="ok"), "usage": None}])
    assert main(["hi"]) == 0
    header = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("--- round 1/6 ---"))
    assert header.endswith(" tokens") and ", ~" in header


def test_a_dumb_terminal_gets_no_colour_and_no_status_line(on_a_terminal):
    code, out, shown = on_a_terminal("add", env_extra={"TERM": "dumb"}, replies=SLOW)
    assert code == 0 and "finished after" in shown
    assert "\x1b[" not in shown and "model working" not in shown


@pytest.mark.processes
def test_a_running_tool_shows_on_the_status_line_under_its_action(on_a_terminal, tmp_path):
    tools = tmp_path / "slow_tools.py"
    tools.write_text("import time\n\ndef nap(seconds: float) -> str:\n    '''Sleep.'''\n"
                     "    time.sleep(seconds)\n    return 'rested'\n")
    code, out, shown = on_a_terminal("--tools-file", str(tools), "rest",
                                     replies=[act("nap", seconds=0.3), act("finish", result="rested")])
    assert (code, out) == (0, "rested\n")
    action = shown.index("action: nap(seconds=0.3)")
    assert shown.index("running nap 0 s", action) < shown.index("result: ", action)
