"""arun() and astream(): the loop from asyncio, its async tools, its shared limit on requests in
flight, cancelling, and the typed events a run reports (run(on_event=...) too)."""
import asyncio
import json
import threading
from pathlib import Path

import pytest

import agent_demo
from agent_demo import events
from agent_demo_kit.cli import main
from scripted_server import ScriptedServer, action as act
from test_escalation import ByModel


def two_rounds(tool="calculator", **args):
    """A screen: the tool first (the calculator on 2 + 3 by default), then the answer."""
    args = args if tool != "calculator" else {"expression": "2 + 3"}

    def screen(body):
        done = sum(message["role"] == "assistant" for message in body["messages"])
        return {"content": act(tool, **args) if done == 0 else act("finish", result="5")}
    return screen


async def fetch_length(text: str) -> int:
    """The text's length, found by an async library.

    Args:
        text: the text
    """
    await asyncio.sleep(0)
    return len(text) * 100


def test_twenty_gathered_runs_share_the_limit_on_requests_in_flight():
    async def twenty(server, parallel):
        return await asyncio.gather(*[agent_demo.arun(f"task {n}", url=server.url, parallel=parallel)
                                      for n in range(20)])
    with ScriptedServer([], screen=two_rounds(), most_in_flight=4) as server:
        results = asyncio.run(twenty(server, 4))
        assert [result.status for result in results] == ["finished"] * 20
        assert server.peak_in_flight <= 4 and server.too_many == 0, "never more than the limit in flight"
        assert len(server.requests) == 40
    with ScriptedServer([], screen=two_rounds(), most_in_flight=4) as server:  # a limit above what it serves
        results = asyncio.run(twenty(server, 8))
        assert [result.status for result in results] == ["finished"] * 20, "its 429s cost no task"


def test_an_async_tools_awaited_value_is_what_the_model_receives_in_arun_and_in_run():
    seen_loops = []

    async def on_which_loop(text: str) -> str:
        """Say which loop runs it.

        Args:
            text: anything
        """
        seen_loops.append(asyncio.get_running_loop())
        return text.upper()

    async def in_arun(server):
        result = await agent_demo.arun("x", url=server.url, tools=[fetch_length, on_which_loop])
        return result, asyncio.get_running_loop()
    with ScriptedServer([], screen=two_rounds("fetch_length", text="hello")) as server:
        result, caller = asyncio.run(in_arun(server))
        assert result.calls[0]["result"] == {"ok": True, "data": 500}
        assert '"data": 500' in server.sent_messages(1)[-1]["content"], "the model got the awaited value"
    with ScriptedServer([], screen=two_rounds("on_which_loop", text="a")) as server:
        result, caller = asyncio.run(in_arun(server))
        assert seen_loops == [caller], "awaited on the caller's own loop"
        result = agent_demo.run("x", url=server.url, tools=[on_which_loop])
        assert result.calls[0]["result"] == {"ok": True, "data": "A"} and result.status == "finished"


def test_a_blocking_tool_under_arun_leaves_the_event_loop_free():
    loop_ran = threading.Event()

    def waits_for_the_loop() -> bool:
        """Wait until the event loop has run something else."""
        return loop_ran.wait(30)

    async def both(server):
        run = asyncio.ensure_future(agent_demo.arun("x", url=server.url, tools=[waits_for_the_loop]))
        while not server.requests:  # the run has started; the loop goes on meanwhile
            await asyncio.sleep(0.01)
        loop_ran.set()
        return await run
    with ScriptedServer([], screen=two_rounds("waits_for_the_loop")) as server:
        result = asyncio.run(both(server))
    assert result.calls[0]["result"] == {"ok": True, "data": True}


def test_a_cancelled_arun_ends_interrupted_with_its_end_record_and_resumes(tmp_path, monkeypatch, capsys):
    trace = tmp_path / "run.jsonl"
    started, release = threading.Event(), threading.Event()

    def slow(text: str) -> str:
        """Take a while.

        Args:
            text: anything
        """
        started.set()
        release.wait(30)
        return text

    async def cancel_it(server):
        run = asyncio.ensure_future(agent_demo.arun("x", url=server.url, tools=[slow], trace=trace))
        while not started.is_set():
            await asyncio.sleep(0.01)
        run.cancel()
        await asyncio.sleep(0)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await run
    with ScriptedServer([], screen=two_rounds("slow", text="a")) as server:
        asyncio.run(cancel_it(server))
        assert len(server.requests) == 1, "no request after the cancel"
        end = json.loads(trace.read_text().splitlines()[-1])
        assert (end["event"], end["status"]) == ("end", "interrupted")
        monkeypatch.setenv("LLM_API_URL", server.url)
        assert main(["--resume", str(trace)]) == 0
    assert capsys.readouterr().out == "5\n"


def test_astream_yields_the_documented_events_in_order():
    script = ByModel(small=[act("calculator", expression="2 + 3"),
                            {"status": 404, "body": {"error": {"message": "model 'small' not found"}}}],
                     big=[act("finish", result="5")])

    async def collect(server):
        return [event async for event in agent_demo.astream("add", url=server.url, model="small", escalate="big",
                                                            stream=True)]
    with ScriptedServer([], screen=script) as server:
        seen = asyncio.run(collect(server))
    kinds = [type(event).__name__ for event in seen if not isinstance(event, (events.Text, events.Note))]
    assert kinds == ["Started", "ReplyArrived", "ToolCalled", "ToolResult", "RoundDone", "Escalated",
                     "ReplyArrived", "ToolCalled", "ToolResult", "RoundDone", "Ended"]
    first_reply = seen.index(next(event for event in seen if isinstance(event, events.ReplyArrived)))
    pieces = [event.text for event in seen[:first_reply] if isinstance(event, events.Text)]
    assert len(pieces) > 1 and "".join(pieces) == act("calculator", expression="2 + 3"), "streamed as it came"
    called = [event for event in seen if isinstance(event, events.ToolCalled)]
    assert [(event.round, event.tool) for event in called] == [(1, "calculator"), (2, "finish")]
    escalated = next(event for event in seen if isinstance(event, events.Escalated))
    assert (escalated.after_round, escalated.from_model, escalated.to_model) == (1, "small", "big")
    assert seen[-1].result.status == "finished" and seen[-1].result.result == "5"


@pytest.mark.processes
def test_on_event_sees_the_same_events_and_a_rejected_answer(serve, tmp_path):
    serve([act("finish", result="4"), act("finish", result="5")], key=None)
    seen = []
    result = agent_demo.run("add", check='test "$AGENT_ANSWER" = 5', on_event=seen.append)
    assert result.status == "finished"
    [rejected] = [event for event in seen if isinstance(event, events.AnswerRejected)]
    assert (rejected.round, rejected.answer) == (1, "4") and "the answer check exited with 1" in rejected.why
    assert isinstance(seen[-1], events.Ended) and seen[-1].result is result


def test_leaving_astream_early_stops_the_run(tmp_path):
    trace = tmp_path / "run.jsonl"
    calls = iter(range(1000))

    def screen(body):
        return {"content": act("calculator", expression=f"{next(calls)} + 1")}

    async def first_round_only(server):
        async for event in agent_demo.astream("x", url=server.url, trace=trace, max_rounds=50):
            if isinstance(event, events.RoundDone):
                break
    with ScriptedServer([], screen=screen) as server:
        asyncio.run(first_round_only(server))
        assert len(server.requests) <= 2
    records = [json.loads(line) for line in Path(trace).read_text().splitlines()]
    assert (records[-1]["event"], records[-1]["status"]) == ("end", "interrupted")


def test_the_api_is_what_dir_shows_and_every_name_is_documented():
    assert sorted(dir(agent_demo)) == sorted(agent_demo.__all__)
    documented = (Path(__file__).parent.parent / "docs" / "python.md").read_text()
    for name in agent_demo.__all__:
        assert f"`{name}" in documented or f"agent_demo.{name}" in documented, name
    for kind in events.EVENT_TYPES:
        assert f"`{kind.__name__}" in documented, kind.__name__


def test_no_event_holds_the_key_even_split_across_streamed_pieces(serve):
    from conftest import KEY
    serve([{"content": f"my key is {KEY}, see? " + act("finish", result=f"it is {KEY}")}])
    seen = []
    result = agent_demo.run("x", on_event=seen.append, stream=True)
    assert result.status == "finished"
    pieces = [event.text for event in seen if isinstance(event, events.Text)]
    assert len(pieces) > 5 and "see?" in "".join(pieces)
    shown = repr(seen)
    assert KEY not in shown and KEY[:12] not in shown and KEY[-12:] not in shown


def test_no_event_holds_a_key_written_across_lines_or_as_a_tool_name(serve):
    from conftest import KEY
    folded = "\n".join(KEY[n:n + 8] for n in range(0, len(KEY), 8))
    serve([{"content": f"the key:\n{folded}\nthere. " + act(KEY)}, act("finish", result="done")])
    seen = []
    agent_demo.run("x", on_event=seen.append, stream=True)
    pieces = "".join(event.text for event in seen if isinstance(event, events.Text))
    assert "there." in pieces and KEY not in pieces.replace("\n", "")
    shown = repr(seen)
    assert KEY not in shown and KEY[:12] not in shown


@pytest.mark.parametrize("raises_at", [events.ToolCalled, events.Ended])
def test_an_on_event_that_raises_reaches_the_caller_as_it_was_raised(serve, tmp_path, raises_at):
    serve([act("finish", result="x")], key=None)

    def fussy(event):
        if isinstance(event, raises_at):
            raise ValueError("my listener")
    with pytest.raises(ValueError, match="my listener"):
        agent_demo.run("x", on_event=fussy, trace=tmp_path / "run.jsonl")
    assert json.loads((tmp_path / "run.jsonl").read_text().splitlines()[-1])["event"] == "end"

    async def streamed():
        seen = []
        with pytest.raises(ValueError, match="my listener"):
            async for event in agent_demo.astream("x", on_event=fussy):
                seen.append(event)
        return seen
    assert isinstance(asyncio.run(streamed())[-1], events.Ended), "astream still ends with Ended"


def test_cancelling_an_arun_cancels_the_async_tool_it_waits_for(tmp_path):
    trace = tmp_path / "run.jsonl"
    started = []

    async def forever(text: str) -> str:
        """Wait for something that never comes.

        Args:
            text: anything
        """
        started.append(text)
        await asyncio.Event().wait()
        return text

    async def cancel_it(server):
        run = asyncio.ensure_future(agent_demo.arun("x", url=server.url, tools=[forever], trace=trace))
        while not started:
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    with ScriptedServer([], screen=two_rounds("forever", text="a")) as server:
        asyncio.run(cancel_it(server))
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert (records[-1]["event"], records[-1]["status"]) == ("end", "interrupted")
    [call] = records[-2]["calls"]
    assert call["result"] == {"ok": False, "error": "the run was stopped while the tool ran"}


def test_a_run_cancelled_while_it_waits_its_turn_sends_nothing(tmp_path):
    release = threading.Event()
    asked = []

    def screen(body):
        asked.append(body["messages"][1]["content"])
        release.wait(30)  # the first run's request is answered only once the second was cancelled
        return {"content": act("finish", result="done")}

    async def two(server):
        first = asyncio.ensure_future(agent_demo.arun("first", url=server.url, parallel=1))
        while not asked:
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(agent_demo.arun("second", url=server.url, parallel=1,
                                                       trace=tmp_path / "second.jsonl"))
        await asyncio.sleep(0.05)  # it has started and waits for the one request allowed in flight
        second.cancel()
        for _ in range(3):  # the cancellation reaches the run (its stop is set) before the first answers
            await asyncio.sleep(0)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await second
        return await first
    with ScriptedServer([], screen=screen) as server:
        assert asyncio.run(two(server)).status == "finished"
    assert [text.startswith("Task: first") for text in asked] == [True], "the cancelled run sent nothing"
    end = json.loads((tmp_path / "second.jsonl").read_text().splitlines()[-1])
    assert (end["event"], end["status"]) == ("end", "interrupted")
