"""A scripted model for loop tests: plays canned replies in order and keeps every request."""
import copy
from typing import Any, List, Optional

from client import Reply


class ScriptedModel:
    """Called like ModelClient.ask. A reply is text, a Reply, or an exception to raise;
    the last one repeats forever (a model that never finishes)."""

    def __init__(self, *replies: Any, usage: Optional[dict] = None):
        self.replies, self.usage = list(replies), usage
        self.requests: List[dict] = []  # each request's messages and options, as sent

    def __call__(self, messages: List[dict], **options: Any) -> Reply:
        self.requests.append({"messages": copy.deepcopy(messages), **options})
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        if isinstance(reply, BaseException):
            raise reply
        return reply if isinstance(reply, Reply) else Reply(content=reply, usage=self.usage)

    def messages(self, index: int) -> List[dict]:
        """The messages of request number index (0-based; -1 for the last)."""
        return self.requests[index]["messages"]
