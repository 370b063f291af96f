"""docs/python.md's examples run as written, against the scripted server, and print what they say
they print (a `# ...` comment after a print, or comment lines closing the example)."""
import contextlib
import io
import re
from pathlib import Path

import pytest

from scripted_server import ScriptedServer, action as act

DOC = Path(__file__).resolve().parent.parent / "docs" / "python.md"
REPLIES = [  # each example's model, in the order the examples come
    [act("word_count", text="one two three"), act("finish", result=3)],
    [act("page_length", url="https://example.com"), act("finish", result=19)],
    [act("calculator", expression="2 + 3"), act("finish", result=5)],
    [act("finish", result={"order_id": "A1002", "status": "pending"})],
]


def examples():
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def promised(code):
    """What an example says it prints, line by line."""
    lines = code.rstrip().splitlines()
    said = [line.split("#", 1)[1].strip() for line in lines if line.lstrip().startswith("print(") and "#" in line]
    closing = []
    for line in reversed(lines):
        if not line.startswith("# "):
            break
        closing.insert(0, line[2:].strip())
    return said + closing


def test_every_example_has_its_model():
    assert len(examples()) == len(REPLIES)


@pytest.mark.parametrize("number", range(len(REPLIES)))
def test_the_example_runs_and_prints_what_it_says(number, monkeypatch):
    code = examples()[number]
    assert "url=" not in code, "the examples find the scripted server as the doc starts it: through LLM_API_URL"
    replies = REPLIES[number]

    def screen(body):
        done = sum(message["role"] == "assistant" for message in body["messages"])
        return {"content": replies[min(done, len(replies) - 1)]}
    printed = io.StringIO()
    with ScriptedServer([], screen=screen) as server, contextlib.redirect_stdout(printed):
        monkeypatch.setenv("LLM_API_URL", server.url)  # as the doc's eval line sets it
        exec(compile(code, f"docs/python.md example {number + 1}", "exec"),
             {"__name__": "__main__"})
    out = printed.getvalue().splitlines()
    expected = promised(code)
    assert expected, "the example says what it prints"
    position = 0
    for line in out:
        if position < len(expected) and line == expected[position]:
            position += 1
    assert position == len(expected), f"printed {out}, the doc says {expected}"
