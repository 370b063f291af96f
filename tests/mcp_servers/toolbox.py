"""An MCP server built on the SDK's low-level Server, with a tool for each kind of answer, served
over streamable HTTP on a listening socket it inherits: python toolbox.py FD. The socket is the
test's, so a client can connect at once, while this server takes a second or two to import the SDK.
"""
import base64
import json
import os
import socket
import sys

import anyio
import mcp.types as types
import uvicorn
from mcp.server.lowlevel import Server

RED_DOT_PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
TEXT = {"type": "object", "properties": {"text": {"type": "string", "description": "what to say"}}, "required": ["text"]}
PATH = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
NOTHING = {"type": "object", "properties": {}}
READ_ONLY = types.ToolAnnotations(read_only_hint=True)
# What a real server may send: references, combinators, a property without a type, formats.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "odd_schema.json")) as file:
    ODD = json.load(file)
TOOLS = [
    types.Tool(name="echo", description="Say the text back.", input_schema=TEXT, annotations=READ_ONLY),
    types.Tool(name="add", description="Add two integers.", annotations=READ_ONLY,
               input_schema={"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                             "required": ["a", "b"]}),
    types.Tool(name="broken", description="Always fails.", input_schema=NOTHING),
    types.Tool(name="picture", description="A picture with a caption.", input_schema=NOTHING, annotations=READ_ONLY),
    types.Tool(name="documents", description="Embedded and linked resources.", input_schema=NOTHING),
    types.Tool(name="erase", description="Erase a file.", input_schema=PATH,
               annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True)),
    types.Tool(name="touch", description="Touch a file.", input_schema=PATH),
    types.Tool(name="calculator", description="A calculator of its own.", input_schema=TEXT),
    types.Tool(name="odd", description="Takes odd arguments and says them back.", input_schema=ODD),
]


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


async def list_tools(context, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(context, params) -> types.CallToolResult:
    name, args = params.name, params.arguments or {}
    if name == "echo":
        return types.CallToolResult(content=[text(args["text"])])
    if name == "add":
        total = args["a"] + args["b"]
        return types.CallToolResult(content=[text(str(total))], structured_content={"sum": total})
    if name == "broken":
        return types.CallToolResult(content=[text("the disk is on fire")], is_error=True)
    if name == "picture":
        image = types.ImageContent(type="image", data=base64.b64encode(RED_DOT_PNG).decode(), mime_type="image/png")
        return types.CallToolResult(content=[text("a red dot"), image])
    if name == "documents":
        notes = types.TextResourceContents(uri="file:///notes.txt", text="buy milk", mime_type="text/plain")
        blob = types.BlobResourceContents(uri="file:///data.bin", blob=base64.b64encode(bytes(300)).decode(),
                                          mime_type="application/octet-stream")
        return types.CallToolResult(content=[
            types.EmbeddedResource(type="resource", resource=notes),
            types.EmbeddedResource(type="resource", resource=blob),
            types.ResourceLink(type="resource_link", uri="https://example.com/report.pdf", name="report")])
    if name in ("erase", "touch"):
        return types.CallToolResult(content=[text(f"{name}: {args['path']}")])
    if name in ("calculator", "odd"):
        return types.CallToolResult(content=[text(json.dumps(args, sort_keys=True))])
    raise ValueError(f"no tool {name}")


async def serve(fd: int) -> None:
    server = Server("toolbox", on_list_tools=list_tools, on_call_tool=call_tool)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    await uvicorn.Server(config).serve(sockets=[socket.socket(fileno=fd)])


if __name__ == "__main__":
    anyio.run(serve, int(sys.argv[1]))
