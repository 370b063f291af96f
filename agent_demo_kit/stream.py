"""Reading what the endpoint sends back: a Reply, from a plain JSON body or from server-sent events.

Servers differ: CRLF or LF line ends, comments and `event:` lines, a `data:` field
split over several lines, a usage chunk with no choices, `[DONE]` or just the end of
the stream, tool-call arguments in pieces. All of it is folded into the same Reply a
plain request gives.
"""
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

from agent_demo_kit.endings import EndpointError
from prompts import clip

TextListener = Callable[[str], None]  # gets each piece of a streamed reply as it arrives


@dataclass
class Reply:
    """What the model said in one round, however it arrived."""

    content: str
    tool_calls: List[dict] = field(default_factory=list)
    usage: Optional[dict] = None
    latency_ms: int = 0
    finish_reason: Optional[str] = None  # "length" when the reply was cut off
    reasoning: str = ""  # reasoning_content, which some servers send beside the content


def parse_body(text: str) -> Any:
    """A body's JSON, made safe to print and to send back: NaN and Infinity become null, and
    lone surrogates (from \\ud800-style escapes) become "?". ValueError if it is not JSON."""
    try:
        body = json.loads(text, parse_constant=lambda name: None,
                          parse_float=lambda number: float(number) if math.isfinite(float(number)) else None)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return json.loads(json.dumps(body, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8"))


def events(chunks: Iterator[bytes]) -> Iterator[str]:
    """The data of each server-sent event, in order (comments and other fields skipped)."""
    buffer, data = b"", []
    for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:  # a blank line ends an event
                if data:
                    yield "\n".join(data)
                data = []
            elif line.startswith("data:"):
                data.append(line[5:][1:] if line[5:6] == " " else line[5:])
    tail = buffer.rstrip(b"\r").decode("utf-8", errors="replace")
    if tail.startswith("data:"):
        data.append(tail[5:].lstrip(" "))
    if data:  # a stream that ended without its last blank line
        yield "\n".join(data)


class StreamedReply:
    """The pieces of a streamed reply, put back together."""

    def __init__(self, on_text: Optional[TextListener] = None):
        self.on_text = on_text
        self.content: List[str] = []
        self.reasoning: List[str] = []
        self.tool_calls: Dict[int, dict] = {}
        self.finish_reason: Optional[str] = None
        self.usage: Optional[dict] = None
        self.model: Any = None

    def add(self, chunk: Any) -> None:
        """Fold one chunk (a parsed event) into the reply."""
        if not isinstance(chunk, dict):
            return
        if chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise EndpointError(f"the endpoint reported an error mid-reply: {clip(' '.join(str(message).split()), 300)}")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else choice.get("message")
        if not isinstance(delta, dict):
            return
        for name, pieces in (("reasoning_content", self.reasoning), ("content", self.content)):
            piece = delta.get(name)
            if isinstance(piece, str) and piece:
                pieces.append(piece)
                if self.on_text:
                    self.on_text(piece)
        for position, call in enumerate(delta.get("tool_calls") or []):
            if isinstance(call, dict):
                self._add_call(call, position)

    def _add_call(self, call: dict, position: int) -> None:
        index = call.get("index")
        if not isinstance(index, int):  # some servers send no index: a new id starts a new call
            last = max(self.tool_calls, default=None)
            fresh = last is None or call.get("id") and call.get("id") != self.tool_calls[last]["id"]
            index = (position if last is None else last + 1) if fresh else last
        known = self.tool_calls.setdefault(index, {"id": None, "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
        if call.get("id"):
            known["id"] = call["id"]
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if isinstance(function.get("name"), str):
            known["function"]["name"] += function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            known["function"]["arguments"] += arguments
        elif arguments is not None:  # a server that sends the arguments whole, as an object
            known["function"]["arguments"] = arguments

    def reply(self) -> Reply:
        """The same Reply a plain request would have given."""
        calls = [self.tool_calls[index] for index in sorted(self.tool_calls)]
        return Reply(content="".join(self.content), usage=self.usage, finish_reason=self.finish_reason,
                     tool_calls=[{**call, "id": call["id"] or f"call_{n}"} for n, call in enumerate(calls, 1)],
                     reasoning="".join(self.reasoning))


def read_stream(chunks: Iterator[bytes], on_text: Optional[TextListener] = None) -> Reply:
    """Read a whole event stream into a Reply; EndpointError if it ends before the reply is complete."""
    reply, done = StreamedReply(on_text), False
    for data in events(chunks):
        if data.strip() == "[DONE]":
            done = True
            break
        try:
            chunk = parse_body(data)
        except ValueError:
            continue  # a line of some other dialect: the next events still count
        reply.add(chunk)
    if not done and reply.finish_reason is None:  # neither [DONE] nor a finish_reason: it was cut off
        raise EndpointError("the reply stopped arriving: the stream ended before the reply was complete")
    return reply.reply()
