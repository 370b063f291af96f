"""A scripted model for in-process loop tests: the real client, with canned replies in place of HTTP.

Retries, form changes and everything else the client decides still run; only the
attempt itself is played from the script, and every request body is kept.
"""
import copy
from typing import Any, List, Optional, Sequence

from agent_demo import Agent
from agent_demo_kit.checks import Judge, checks_for
from agent_demo_kit.client import ModelClient, RequestForm
from agent_demo_kit.records import Reply
from agent_demo_kit.seam import EachRound, Hooks, Job
from agent_demo_kit.settings import Settings
from agent_demo_kit.tools import REGISTRY


class ScriptedModel(ModelClient):
    """A reply is text, a Reply, or an exception to raise; the last one repeats forever (a model
    that never finishes)."""

    def __init__(self, *replies: Any, usage: Optional[dict] = None):
        super().__init__(Settings())
        self.replies, self.usage = list(replies), usage
        self.requests: List[dict] = []  # each request body, as it would have been sent

    def attempt(self, body: dict) -> Reply:
        self.requests.append(copy.deepcopy(body))
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        if isinstance(reply, BaseException):
            raise reply
        return copy.deepcopy(reply) if isinstance(reply, Reply) else Reply(content=reply, usage=self.usage)

    def messages(self, index: int) -> List[dict]:
        """The messages of request number index (0-based; -1 for the last)."""
        return self.requests[index]["messages"]


def agent(settings: Settings, model: Any, registry=REGISTRY, log=None, approve=None, on_round=None) -> Agent:
    """The agent setup.py would make of these parts: log (a TraceFile, say) and on_round listen to its hooks."""
    hooks = Hooks([each for each in (log, on_round and EachRound(on_round)) if each is not None],
                  getattr(log, "redactor", None))
    judge = Judge(settings, checks_for(settings.check, "--check")) if settings.check is not None else None
    return Agent(Job(settings, model, dict(registry), hooks, "", approve, judge, trace_path=getattr(log, "path", None)))


def run(task: str, settings: Settings, model: ScriptedModel, registry=REGISTRY, log=None,
        history: Sequence = (), approve=None):
    """Run the agent in-process against a scripted model, as the command line would."""
    model.settings, model.form = settings, RequestForm(mode=settings.mode, stream=False)  # played whole, not streamed
    the_agent = agent(settings, model, registry, log, approve)
    model.trace = the_agent.hooks
    return the_agent.run(task, history)
