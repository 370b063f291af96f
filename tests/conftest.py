import os
import sys

import pytest

# The project is three top-level modules and one package; importable without installing.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripted_server import ScriptedServer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "sk-live-DO-NOT-LEAK-0123456789"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """Each test starts without the developer's LLM_/AGENT_/OPENAI_ variables, in an empty folder,
    with its run log folder under its own state home (subprocesses inherit XDG_STATE_HOME too)."""
    for name in list(os.environ):
        if name.startswith(("LLM_", "AGENT_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def serve(monkeypatch):
    """Start a scripted server and point LLM_API_URL (and a key, unless key=None) at it."""
    servers = []

    def _serve(replies, key=KEY, screen=None):
        server = ScriptedServer(replies, screen=screen).__enter__()
        servers.append(server)
        monkeypatch.setenv("LLM_API_URL", server.url)
        if key:
            monkeypatch.setenv("LLM_API_KEY", key)
        return server
    yield _serve
    for server in servers:
        server.__exit__(None, None, None)


def said_lines(err):
    """The lines agent-demo itself says on stderr (errors, summaries), without the round-by-round trace
    and without the command that continues a run cut short."""
    return [line for line in err.splitlines()
            if line.startswith("agent-demo:") and not line.startswith("agent-demo: to continue:")]


def answer_on_a_terminal(argv, env, cwd, answer=b"y\n"):
    """Run the CLI with stdin on a pseudo terminal, answer its first [y/N] question; return
    (what the terminal showed, stdout, stderr, exit code)."""
    import pty
    import select
    import subprocess
    controller, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "agent_demo.py"), *argv], stdin=terminal,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    shown = b""
    while b"[y/N]" not in shown and select.select([controller], [], [], 20)[0]:
        shown += os.read(controller, 1024)
    os.write(controller, answer)
    out, err = process.communicate(timeout=30)
    os.close(controller)
    os.close(terminal)
    return shown, out, err, process.returncode
