"""A stdio MCP server in plain Python, for the ways a server misbehaves; it starts in a blink,
where one built on the SDK takes seconds, so a test can start it again and again.

python bare.py                        answers; its tools: echo, crash (the process exits), hang (no answer),
                                      peek (says read-only), tidy (says read-only and destructive at once)
python bare.py --exit-on-initialize   says why on stderr and exits when the handshake begins
python bare.py --silent               reads every message and never answers
"""
import json
import os
import sys

READ_ONLY = {"readOnlyHint": True}
TOOLS = [{"name": name, "description": description, "inputSchema": {"type": "object", "properties": properties},
          "annotations": annotations}
         for name, description, properties, annotations in [
             ("echo", "Say the text back.", {"text": {"type": "string"}}, {}),
             ("crash", "The server process exits.", {}, {}),
             ("hang", "Never answers.", {}, {}),
             ("peek", "Look without touching.", {}, READ_ONLY),
             ("tidy", "Tidy up.", {}, {**READ_ONLY, "destructiveHint": True})]]


def answer(request_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


def serve():
    for line in sys.stdin:
        message = json.loads(line)
        method, params = message.get("method"), message.get("params") or {}
        if "--silent" in sys.argv or "id" not in message:
            continue
        if method == "initialize":
            if "--exit-on-initialize" in sys.argv:
                print("bare: cannot open the database", file=sys.stderr, flush=True)
                sys.exit(3)
            answer(message["id"], {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                                   "serverInfo": {"name": "bare", "version": "1"}})
        elif method == "tools/list":
            answer(message["id"], {"tools": TOOLS})
        elif method == "tools/call" and params["name"] == "crash":
            print("bare: crashing", file=sys.stderr, flush=True)
            os._exit(1)
        elif method == "tools/call" and params["name"] in ("echo", "peek", "tidy"):
            answer(message["id"], {"content": [{"type": "text", "text": params["arguments"].get("text", "")}]})


if __name__ == "__main__":
    print(f"pid {os.getpid()}", file=sys.stderr, flush=True)
    serve()
