"""Nothing a tool does escapes it: whatever it raises, and a --tools-file function that hangs, forks,
exits or crashes in its worker process, costs one error result, and nothing it started outlives the run."""
import asyncio

import pytest

from agent_demo_kit.settings import Settings
from conftest import KEY
from scripted_model import ScriptedModel, run
from scripted_server import action as act
from tools import call_tool, registry_of

FINISH = act("finish", result="done")


class Custom(BaseException):
    """Not an Exception, like asyncio.CancelledError."""


def cancelled(x: str) -> str:
    """Raise CancelledError."""
    raise asyncio.CancelledError("cancelled inside")


def custom(x: str) -> str:
    """Raise a BaseException of its own."""
    raise Custom(f"the key is {KEY}")


@pytest.mark.parametrize("function, error", [(cancelled, "cancelled failed: CancelledError: cancelled inside"),
                                             (custom, "custom failed: Custom: the key is")])
def test_a_tool_raising_a_base_exception_is_an_error_result_and_the_run_goes_on(function, error):
    registry = registry_of(function)
    assert call_tool(function.__name__, {"x": "a"}, registry)["error"].startswith(error)
    model = ScriptedModel(act(function.__name__, x="a"), FINISH)
    outcome = run("go", Settings(), model, registry=registry)
    assert (outcome.status, outcome.rounds) == ("finished", 2)
    assert error in model.requests[1]["messages"][-1]["content"]
