"""A scripted OpenAI-compatible chat-completions server on loopback, for tests and the benchmark.

It plays a list of canned replies in order and records every request it gets.
A canned reply is either a string (the assistant's content) or a dict:
  {"content": ..., "tool_calls": [...], "usage": {...} or None, "finish_reason": "length",
   "status": 429, "headers": {...}, "body": "raw text" or a JSON value,
   "delay": seconds before answering, "drop": true to close without replying,
   "trickle": seconds between the pieces of a body sent in 8 pieces,
   "gzip": true to compress the body, "short": true to promise more body than is sent,
   "refuse_stream": true to answer a streaming request with a 400, "no_stream": true to answer it
   with a plain JSON body, "piece_delay": seconds between the events of a streamed reply,
   "keep_alive": seconds between the comments (and empty pieces) a streamed reply sends forever
   after its content, "pings": how many ": ping" comments come before it, "ping_every" seconds apart
   (as llama-cpp-python's server sends while it reads a long prompt), "endless": true to stream its content again and again, never ending,
   "drip": seconds between the bytes of a first event that never ends, inside one announced chunk,
   "close": true to say "Connection: close" with a streamed reply ("size_line": true, with "drip":
   the chunk's size line is what drips),
   "cut": true to end a streamed reply before any event (as a server that failed mid-way),
   "linger": seconds between the keep-alives it sends after [DONE] instead of ending the stream (with
   "drip": between the bytes of a chunk after [DONE] that never ends); each
   of the three for ENDLESS_SECONDS, so that a reader that does not stop fails its test instead of
   hanging it (`hung_up` counts the streams whose reader went away first)}
A request with "stream": true gets its reply as server-sent events, a few characters an event
(but "short", "gzip" and "trickle" are about a plain body: those replies come as one, as from a
server that ignores "stream").
When the script runs out, the last reply is repeated (a model that never finishes).
`screen` (tests only) is a function of each request's body that may answer it instead, with a
canned reply, without using up the script: a server that refuses some request options, say.
`like_llama_cpp_python` is one. `window` (tests only): the context window GET /props announces, as
llama.cpp's server does; without it, /props and every path but chat completions are 404.
`most_in_flight` (tests only): a request that arrives while that many are being answered gets a
429, as a rate-limited endpoint answers; `peak_in_flight` is the most it answered at once.

Run it by hand: python tests/scripted_server.py [--by-task] FILE [PORT] [--background] (--help says more).
"""
import gzip
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, List, Optional, Union

Canned = Union[str, dict]

# What llama-cpp-python's server (0.3) answers to response_format json_schema.
LLAMA_CPP_PYTHON_REFUSAL = {"status": 500, "body": {"error": {
    "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg':"
               " \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', 'ctx': {'expected':"
               " \"'text' or 'json_object'\"}}\n\n  File \"/opt/venv/lib/python3.11/site-packages/llama_cpp/server/"
               "app.py\", line 376, in create_chat_completion\n    POST /v1/chat/completions",
    "type": "internal_server_error", "param": None, "code": None}}}


ENDLESS_SECONDS = 20.0


def like_llama_cpp_python(body: Any) -> Optional[Canned]:
    """A screen: refuse what llama-cpp-python's server refuses (response_format json_schema); it
    drops tools without a word, so those requests get the scripted reply."""
    response_format = body.get("response_format") if isinstance(body, dict) else None
    if isinstance(response_format, dict) and response_format.get("type") not in ("text", "json_object"):
        return LLAMA_CPP_PYTHON_REFUSAL
    return None


def action(tool: str, **args: Any) -> str:
    """An action as a model writes it."""
    return json.dumps({"tool": tool, "args": args}, ensure_ascii=False)


def completion(content: Any = None, tool_calls: Any = None, usage: Any = "default",
               finish_reason: str = "stop") -> dict:
    """A chat-completions body with one choice."""
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body = {"id": "chatcmpl-test", "object": "chat.completion", "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}
    if usage == "default":
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if usage is not None:
        body["usage"] = usage
    return body


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)  # a client that gave up is expected


class ScriptedServer:
    """Serves canned replies in order; `requests` holds what each request carried."""

    def __init__(self, replies: List[Canned], port: int = 0,
                 screen: Optional[Callable[[Any], Optional[Canned]]] = None, window: Optional[int] = None,
                 most_in_flight: Optional[int] = None, window_limit: Optional[int] = None, overflow: str = "cut"):
        self.replies = list(replies)
        self.screen = screen
        self.window = window  # the context window GET /props announces, as llama.cpp's server does
        # A window the server enforces without saying it (llama-cpp-python's): a request of more tokens (its
        # characters over 3) is cut off ("cut": a stream ends with no event, a plain request's connection
        # closes unanswered) or answered with llama-cpp-python's HTTP 500 ("500") or its HTTP 400 ("400").
        self.window_limit, self.overflow, self.past_limit = window_limit, overflow, 0
        self.played = 0  # scripted replies used up
        self.requests: List[dict] = []
        self.connections = 0
        self.gets = 0  # GET requests (the window asked for)
        self.get_answer: Optional[Canned] = None  # tests only: what every GET but /props gets instead of a 404
        self.most_in_flight, self.in_flight, self.peak_in_flight, self.too_many = most_in_flight, 0, 0, 0
        self.hung_up = 0  # endless, dripping or lingering streams whose reader hung up before ENDLESS_SECONDS
        self._lock = threading.Lock()
        self._hang_up = threading.Condition(self._lock)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is visible

            def setup(self):
                super().setup()
                # Headers and body go out in two writes; without this, Nagle's algorithm
                # and delayed ACKs add ~40 ms to every reply.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with server._lock:
                    server.connections += 1

            def log_message(self, *args):
                pass

            def do_GET(self):  # /props, as llama.cpp's server says its window; anything else is not here
                with server._lock:
                    server.gets += 1
                if self.path == "/props" and server.window:
                    server._send(self, 200, {"default_generation_settings": {"n_ctx": server.window}})
                elif server.get_answer is not None:
                    server._answer(self, server.get_answer)
                else:
                    server._send(self, 404, {"error": {"message": "not found"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.split("?")[0].endswith("/chat/completions"):  # /api/show, say: not this server
                    server._send(self, 404, {"error": {"message": "not found"}})
                    return
                with server._lock:
                    if server.most_in_flight is not None and server.in_flight >= server.most_in_flight:
                        server.too_many += 1
                        refused = True
                    else:
                        server.in_flight += 1
                        server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
                        refused = False
                if refused:
                    server._send(self, 429, {"error": {"message": "too many requests in flight"}})
                    return
                try:
                    self.answer(raw)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def answer(self, raw):
                with server._lock:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = raw.decode("utf-8", "replace")
                    server.requests.append({"path": self.path, "headers": dict(self.headers),
                                            "body": body, "time": time.monotonic()})
                    tokens = len(raw) // 3  # as a tokenizer counts a request, about
                    wants_stream = isinstance(body, dict) and body.get("stream") is True
                    canned = server.past_window(tokens, wants_stream) if server.window_limit \
                        and tokens > server.window_limit else server.screen(body) if server.screen else None
                    if canned is None:
                        index, server.played = server.played, server.played + 1
                        canned = server.replies[min(index, len(server.replies) - 1)] if server.replies else ""
                server._answer(self, canned, wants_stream)

        self.httpd = _QuietServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.005,), daemon=True)  # stops within 5 ms

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        data = json.dumps(body).encode("utf-8")
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _answer(self, handler: BaseHTTPRequestHandler, canned: Canned, wants_stream: bool = False) -> None:
        spec = {"content": canned} if isinstance(canned, str) else dict(canned)
        if spec.get("delay"):
            time.sleep(spec["delay"])
        if spec.get("drop"):
            handler.close_connection = True
            handler.connection.shutdown(2)
            return
        if wants_stream and spec.get("refuse_stream"):
            spec = {"status": 400, "body": {"error": {"message": "stream is not supported by this server"}}}
        elif wants_stream and not spec.keys() & {"body", "no_stream", "short", "gzip", "trickle"}:
            self._stream(handler, spec)
            return
        if "body" in spec:
            body = spec["body"]
            data = (body if isinstance(body, str) else json.dumps(body)).encode("utf-8")
        else:
            data = json.dumps(completion(spec.get("content"), spec.get("tool_calls"), spec.get("usage", "default"),
                                         spec.get("finish_reason", "stop"))).encode("utf-8")
        if spec.get("gzip"):
            data = gzip.compress(data)
        handler.send_response(spec.get("status", 200))
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data) + (100 if spec.get("short") else 0)))
        if spec.get("gzip"):
            handler.send_header("Content-Encoding", "gzip")
        if spec.get("short"):
            handler.close_connection = True
        for name, value in spec.get("headers", {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        if spec.get("trickle"):
            step = max(1, len(data) // 8)
            for start in range(0, len(data), step):
                handler.wfile.write(data[start:start + step])
                handler.wfile.flush()
                time.sleep(spec["trickle"])
        else:
            handler.wfile.write(data)

    def past_window(self, tokens: int, stream: bool) -> Canned:
        """What llama-cpp-python's server does with a request past its window (the caller holds the lock)."""
        self.past_limit += 1
        if self.overflow == "cut":  # the stream starts, then ends with no event: the error went to its log
            return {"cut": True} if stream else {"drop": True}
        if self.overflow == "400":  # its error handler's words for the same ValueError
            return {"status": 400, "body": {"error": {
                "message": f"This model's maximum context length is {self.window_limit} tokens. However, you"
                           f" requested {tokens} tokens ({tokens} in the messages, None in the completion). Please"
                           " reduce the length of the messages or completion.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}}
        return {"status": 500, "body": {"error": {
            "message": f"Requested tokens ({tokens}) exceed context window of {self.window_limit}",
            "type": "internal_server_error", "param": None, "code": None}}}

    def _stream(self, handler: BaseHTTPRequestHandler, spec: dict) -> None:
        """The reply as server-sent events: content a few characters an event, tool calls in two pieces."""
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        if spec.get("close"):  # the connection ends with this reply (nginx says so on a keep-alive's last)
            handler.send_header("Connection", "close")
            handler.close_connection = True
        handler.end_headers()

        def send(data: str) -> None:
            event = f"data: {data}\r\n\r\n".encode("utf-8")
            handler.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            handler.wfile.flush()
            time.sleep(spec.get("piece_delay", 0))

        def chunk(delta: dict, finish: Any = None) -> str:
            return json.dumps({"object": "chat.completion.chunk",
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        handler.wfile.write(b"5\r\n: hi\n\r\n")  # a comment line, which readers skip
        try:
            for _ in range(spec.get("pings", 0)):  # as llama-cpp-python's server says it is reading the prompt
                time.sleep(spec.get("ping_every", 0.1))
                handler.wfile.write(b"8\r\n: ping\n\n\r\n")
                handler.wfile.flush()
        except OSError:
            return
        if spec.get("cut"):  # the stream ends before any event: no [DONE], no finish_reason
            handler.wfile.write(b"0\r\n\r\n")
            return
        if spec.get("drip") and not spec.get("linger"):  # one event's chunk announced whole, then its bytes one at a time
            self._for_a_while(handler, b"1" if spec.get("size_line") else b"100000\r\n: ",
                              b"0" if spec.get("size_line") else b".", spec["drip"])
            return
        content = spec.get("content") or ""
        size = 7 if len(content) < 500 else 250 if len(content) < 5000 else 4000  # long replies in bigger pieces
        until = time.monotonic() + ENDLESS_SECONDS
        try:
            while True:  # once, unless endless (then until the reader hangs up)
                for start in range(0, len(content), size):
                    send(chunk({"content": content[start:start + size]}))
                while spec.get("keep_alive") and time.monotonic() < until:
                    handler.wfile.write(b"d\r\n: keep-alive\n\r\n")
                    send(chunk({"content": ""}))
                    time.sleep(spec["keep_alive"])
                if not spec.get("endless") or time.monotonic() > until:
                    break
        except OSError:  # the reader stopped reading: as it should
            self._count_hang_up()
            return
        for index, call in enumerate(spec.get("tool_calls") or []):
            arguments = call["function"].get("arguments", "")
            send(chunk({"tool_calls": [{"index": index, "id": call.get("id"), "type": "function",
                                        "function": {"name": call["function"]["name"],
                                                     "arguments": arguments[:len(arguments) // 2]}}]}))
            send(chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[len(arguments) // 2:]}}]}))
        send(chunk({}, spec.get("finish_reason", "stop")))
        usage = spec.get("usage", "default")
        if usage == "default":
            usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if usage is not None:
            send(json.dumps({"object": "chat.completion.chunk", "choices": [], "usage": usage}))
        send("[DONE]")
        if spec.get("linger"):  # [DONE], then keep-alives, or a chunk that never ends
            drip = bool(spec.get("drip"))
            if not self._for_a_while(handler, b"100000\r\n: " if drip else b"",
                                     b"." if drip else b"d\r\n: keep-alive\n\r\n", spec["linger"]):
                return
        handler.wfile.write(b"0\r\n\r\n")

    def _for_a_while(self, handler: BaseHTTPRequestHandler, first: bytes, each: bytes, every: float) -> bool:
        """Write `first`, then `each` every `every` seconds for ENDLESS_SECONDS; False (and counted in
        hung_up) when the reader hung up first."""
        until = time.monotonic() + ENDLESS_SECONDS
        try:
            handler.wfile.write(first)
            while time.monotonic() < until:
                handler.wfile.write(each)
                handler.wfile.flush()
                time.sleep(every)
        except OSError:
            self._count_hang_up()
            return False
        return True

    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _count_hang_up(self) -> None:
        with self._hang_up:
            self.hung_up += 1
            self._hang_up.notify_all()

    def hang_ups(self, at_least: int) -> int:
        """hung_up, once it is at_least (a server notices its reader gone at its next write), or after
        ENDLESS_SECONDS."""
        with self._hang_up:
            self._hang_up.wait_for(lambda: self.hung_up >= at_least, ENDLESS_SECONDS)
            return self.hung_up

    def restart(self) -> None:
        """Play the script again from its first reply, with no requests recorded."""
        with self._lock:
            self.requests.clear()
            self.played = 0

    def sent_messages(self, index: int) -> List[dict]:
        """The messages of request number index (0-based)."""
        return self.requests[index]["body"]["messages"]


class ByTaskText:
    """A screen that answers each request by its task (a mapping file): {"task text": [replies...]}, each
    task's replies played one a round (the last repeated; one reply alone is every round's), a key found
    in the task's text when no task is exactly it, "*" for any other task. With two such files and two
    servers, a batch can be tried on two "models" without writing a server."""

    def __init__(self, mapping: dict):
        if isinstance(mapping, dict):
            mapping = {task: [replies] if isinstance(replies, (str, dict)) else replies
                       for task, replies in mapping.items()}
        if not isinstance(mapping, dict) or not all(isinstance(replies, list) and replies
                                                     for replies in mapping.values()):
            raise ValueError('a mapping file is a JSON object: {"task text": [reply, ...], "*": [...]}')
        self.mapping = mapping

    def __call__(self, body: Any) -> Canned:
        messages = body.get("messages") or [] if isinstance(body, dict) else []
        task = next((str(message.get("content") or "") for message in messages if message.get("role") == "user"), "")
        task = task[len("Task: "):] if task.startswith("Task: ") else task
        task = task.split("\n\n", 1)[0].strip()  # what agent-demo adds after the task (notes, a digest)
        replies = self.mapping.get(task) or next((replies for key, replies in self.mapping.items()
                                                  if key != "*" and key in task), None) or self.mapping.get("*")
        if replies is None:
            return {"status": 404, "body": {"error": {"message": f"no reply scripted for the task {task[:80]!r}"}}}
        done = sum(message.get("role") == "assistant" for message in messages)
        return replies[min(done, len(replies) - 1)]


# What --background prints for the shell to eval when no server started: nothing stale is left to talk
# to or to kill, and the eval fails.
CANNOT_START = "unset LLM_API_URL SCRIPTED_SERVER_PID; false\n"


def main(argv: List[str]) -> int:
    """python tests/scripted_server.py [--by-task] FILE [PORT] [--background]"""
    import argparse
    import errno
    import subprocess
    parser = argparse.ArgumentParser(prog="scripted_server.py", description="A scripted OpenAI-compatible server on"
                                     " loopback: it prints LLM_API_URL=... once it listens.")
    parser.add_argument("file", help="a JSON list of replies, played in order (the last repeated); with --by-task, a"
                        ' JSON object of replies by task: {"task text": [reply, ...], "*": [...]}')
    parser.add_argument("port", nargs="?", type=int, default=0, help="the port (default: a free one)")
    parser.add_argument("--by-task", action="store_true", help="FILE maps each task to its replies, a reply a round")
    parser.add_argument("--background", action="store_true", help="start in the background and print shell lines"
                        ' that set LLM_API_URL and SCRIPTED_SERVER_PID: eval "$(python tests/scripted_server.py'
                        ' --background replies.json)"; when it cannot start, it says why on stderr and prints lines'
                        " that unset both and fail, so no other server is talked to and no other process ended")
    parser.add_argument("--detached", action="store_true", help=argparse.SUPPRESS)  # the background server itself
    args = parser.parse_args(argv)
    try:
        with open(args.file, encoding="utf-8") as script:
            replies = json.load(script)
        screen = ByTaskText(replies) if args.by_task else None
    except (OSError, ValueError) as error:
        print(f"scripted_server.py: {args.file}: {error}", file=sys.stderr)
        print(CANNOT_START if args.background else "", end="")
        return 2
    if args.background:  # the server in a process of its own; this one says where it listens, and ends
        server = subprocess.Popen([sys.executable, __file__, *(a for a in argv if a != "--background"), "--detached"],
                                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  start_new_session=True, text=True)
        said = server.stdout.readline().strip()
        if not said.startswith("LLM_API_URL="):  # its one line of why, and shell lines that leave nothing stale
            sys.stderr.write(server.stderr.read())
            print(CANNOT_START, end="")
            return server.wait() or 2
        print(f"export {said}; SCRIPTED_SERVER_PID={server.pid}")
        return 0
    try:
        scripted = ScriptedServer([] if screen else replies, port=args.port, screen=screen).__enter__()
    except OSError as error:
        busy = error.errno == errno.EADDRINUSE
        print(f"scripted_server.py: port {args.port} is {'in use by another server' if busy else 'not usable'}"
              f" ({error.strerror}); leave the port out and a free one is taken", file=sys.stderr)
        return 2
    print(f"LLM_API_URL={scripted.url}", flush=True)
    if args.detached:  # whoever started it has gone: nothing more is written to its pipes
        with open(os.devnull, "w") as nowhere:
            os.dup2(nowhere.fileno(), 1)
            os.dup2(nowhere.fileno(), 2)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        scripted.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
