"""The examples a newcomer copies run as written: the README's "Trying it without a key" and
docs/batch.md's two scripted models, each in a folder of its own with the project's tests/ beside it;
and every relative link in the docs leads to a file, and to a heading there when it names one."""
import contextlib
import os
import re
import signal
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, child_environment

DOCS = [Path(ROOT) / "README.md", *sorted((Path(ROOT) / "docs").glob("*.md"))]


def blocks(path: Path, after: str, until: str) -> list:
    """The fenced blocks (language, text) of a file's part between two headings."""
    text = path.read_text(encoding="utf-8")
    part = text[text.index(after):text.index(until, text.index(after) + len(after))]
    return re.findall(r"```(\w*)\n(.*?)```", part, re.S)


def run_as_written(tmp_path, script):
    (tmp_path / "tests").symlink_to(Path(ROOT) / "tests")
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    if not shutil.which("agent-demo", path=os.path.dirname(sys.executable)):  # not installed: the same, from here
        (bin_folder / "agent-demo").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT}/agent_demo.py" "$@"\n')
        (bin_folder / "agent-demo").chmod(0o755)
    path = os.pathsep.join([str(bin_folder), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    try:
        return subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env=child_environment({"PATH": path}))
    finally:  # a server the script started and did not end (it stopped early): ended here, by its pid
        for pid in started_from(tmp_path):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


def started_from(folder):
    """The processes whose command line names this test's folder: what its script started."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if str(folder).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return [pid for pid in found if pid != os.getpid()]


@pytest.mark.processes
def test_the_readmes_trying_it_without_a_key_runs_as_written(tmp_path):
    [(json_kind, replies), (sh_kind, commands)] = blocks(DOCS[0], "## Trying it without a key", "## Everyday use")
    assert (json_kind, sh_kind) == ("json", "sh")
    (tmp_path / "replies.json").write_text(replies)
    done = run_as_written(tmp_path, commands)
    assert (done.returncode, done.stdout) == (0, "512\n"), done.stderr


@pytest.mark.processes
def test_the_batch_docs_two_scripted_models_run_as_written(tmp_path):
    [(kind, commands)] = blocks(Path(ROOT) / "docs" / "batch.md", "## Trying it with two scripted models",
                                "## Two models side by side")
    done = run_as_written(tmp_path, commands)
    assert done.returncode == 0, done.stderr
    assert "right: 4" in done.stdout and "wrong: 5" in done.stdout, done.stdout
    assert (tmp_path / "tasks-results" / "report.html").exists()


def anchors(path: Path) -> set:
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_every_relative_link_in_the_docs_leads_somewhere(path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert broken == [], f"{path.name}: links that lead nowhere"


@pytest.mark.processes
def test_the_scripted_server_on_a_busy_port_says_so_in_one_line_and_exits_2(tmp_path):
    import socket
    (tmp_path / "replies.json").write_text('["hi"]')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "scripted_server.py"), "replies.json",
                               str(taken.getsockname()[1])], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "is in use by another server" in line and "leave the port out" in line
