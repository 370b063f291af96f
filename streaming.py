"""Reading a streamed chat completion (server-sent events) into the body a plain request returns.

Servers differ: CRLF or LF line ends, comments and `event:` lines, a `data:` field
split over several lines, a usage chunk with no choices, `[DONE]` or just the end of
the stream, tool-call arguments in pieces. All of it is folded into one
chat-completions body, so the rest of the client reads both the same way.
"""
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from endings import EndpointError

TextListener = Callable[[str], None]  # gets each piece of text as it arrives


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
            raise EndpointError(f"the endpoint reported an error mid-reply: {' '.join(str(message).split())[:300]}")
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
        for field, pieces in (("reasoning_content", self.reasoning), ("content", self.content)):
            piece = delta.get(field)
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

    def body(self) -> dict:
        """The chat-completions body a plain request would have returned."""
        calls = [self.tool_calls[index] for index in sorted(self.tool_calls)]
        message = {"role": "assistant", "content": "".join(self.content)}
        if calls:
            message["tool_calls"] = [{**call, "id": call["id"] or f"call_{n}"} for n, call in enumerate(calls, 1)]
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        body: Dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}]}
        if self.usage is not None:
            body["usage"] = self.usage
        return body


def read_stream(chunks: Iterator[bytes], deadline: float, seconds: float, parse: Callable[[str], Any],
                on_text: Optional[TextListener] = None) -> dict:
    """Read a whole event stream into a chat-completions body, within the same deadline as a plain reply."""
    reply, done = StreamedReply(on_text), False

    def in_time(arriving: Iterator[bytes]) -> Iterator[bytes]:  # keep-alive comments count too
        for chunk in arriving:
            if time.monotonic() > deadline:
                raise EndpointError(f"the reply did not finish arriving within {seconds:g} s"
                                    " (the server is sending too slowly)")
            yield chunk
    for data in events(in_time(chunks)):
        if data.strip() == "[DONE]":
            done = True
            break
        try:
            chunk = parse(data)
        except ValueError:
            continue  # a line of some other dialect: the next events still count
        reply.add(chunk)
    if not done and reply.finish_reason is None:  # neither [DONE] nor a finish_reason: it was cut off
        raise EndpointError("the reply stopped arriving: the stream ended before the reply was complete")
    return reply.body()

