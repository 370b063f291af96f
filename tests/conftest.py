import os
import sys

import pytest

# The project is top-level modules; make them importable without installing.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripted_server import ScriptedServer  # noqa: E402

KEY = "sk-live-DO-NOT-LEAK-0123456789"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """Each test starts without the developer's LLM_/AGENT_ variables, in an empty folder."""
    for name in list(os.environ):
        if name.startswith(("LLM_", "AGENT_")):
            monkeypatch.delenv(name)
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
