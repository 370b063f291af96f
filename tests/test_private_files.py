"""The run log folder and trace files are checked like ~/.ssh: ours, writable by nobody else, not
reached through someone else's symlink; what fails is refused with one line saying how to fix it."""
import json
import os
import stat

import pytest

from agent_demo_kit.cli import main
from conftest import KEY, said_lines
from scripted_server import ScriptedServer, action as act

NOBODY = 65534
root_only = pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                               reason="giving a file to another user needs root")


def plant(folder, url, tools_file):
    """What another user leaves in a shared run log folder: a bare start record naming their own
    endpoint and their own tools file."""
    folder.mkdir(parents=True, exist_ok=True)
    planted = folder / "20991231-235959-abcdef.jsonl"
    planted.write_text(json.dumps({"event": "start", "task": "t", "url": url, "tools_files": [str(tools_file)]}) + "\n")
    return planted


@pytest.fixture
def their_tools(tmp_path):
    """A tools file that leaves a mark when it is imported."""
    path = tmp_path / "theirs.py"
    path.write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n\n"
                    "def t(x: str) -> str:\n    '''T.'''\n    return x\n")
    return path


def test_a_run_log_folder_writable_by_others_is_refused_before_a_planted_run_is_read(
        tmp_path, monkeypatch, capsys, their_tools):
    monkeypatch.setenv("LLM_API_KEY", KEY)
    folder = tmp_path / "state" / "agent-demo" / "runs"
    with ScriptedServer([act("finish", result="stolen")]) as theirs:
        plant(folder, theirs.url, their_tools)
        os.chmod(folder, 0o777)
        assert main(["--resume"]) == 2
    assert theirs.requests == [] and not (tmp_path / "imported").exists()
    assert said_lines(capsys.readouterr().err) == [
        f"agent-demo: error: the run log folder {folder} is writable by others (mode 777): chmod 700 {folder}"]


@root_only
def test_a_trace_file_of_another_user_is_refused(tmp_path, monkeypatch, capsys, their_tools):
    monkeypatch.setenv("LLM_API_KEY", KEY)
    folder = tmp_path / "state" / "agent-demo" / "runs"
    with ScriptedServer([act("finish", result="stolen")]) as theirs:
        planted = plant(folder, theirs.url, their_tools)
        os.chmod(folder, 0o700)
        os.chown(planted, NOBODY, NOBODY)
        for resume in (["--resume"], ["--resume", str(planted)]):
            assert main(resume) == 2
            [line] = said_lines(capsys.readouterr().err)
            assert line.startswith(f"agent-demo: error: the trace file {planted} belongs to ")
            assert line.endswith(f"(uid {NOBODY}), not to you: use one of your own (taking it over would make"
                                 " someone else's file yours to obey)")
        assert main(["--trace", str(planted), "--quiet", "hi"]) == 2, "appending to it is refused too"
    assert theirs.requests == [] and not (tmp_path / "imported").exists()


def test_a_trace_file_writable_by_its_group_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    trace = tmp_path / "run.jsonl"
    trace.write_text(json.dumps({"event": "start", "task": "t"}) + "\n")
    os.chmod(trace, 0o620)
    assert main(["--resume", str(trace)]) == 2
    assert said_lines(capsys.readouterr().err) == [
        f"agent-demo: error: the trace file {trace} is writable by its group (mode 620): chmod 600 {trace}"]


@pytest.mark.parametrize("umask", [0, 0o277])
def test_folders_it_creates_are_0700_parents_included_whatever_the_umask(serve, cli, tmp_path, umask):
    serve([act("finish", result="ok")])
    before = os.umask(umask)
    try:
        code, out, err = cli("--quiet", "hi")
    finally:
        os.umask(before)
    assert (code, out) == (0, "ok\n")
    state = tmp_path / "state"
    for folder in (state, state / "agent-demo", state / "agent-demo" / "runs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    [trace] = (state / "agent-demo" / "runs").glob("*.jsonl")
    assert stat.S_IMODE(trace.stat().st_mode) == 0o600


@root_only
@pytest.mark.parametrize("through", ["folder", "parent"])
def test_a_run_log_folder_reached_through_another_users_symlink_is_refused(tmp_path, monkeypatch, capsys,
                                                                            through):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    folder = link if through == "folder" else link / "runs"
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(folder))
    with ScriptedServer([act("finish", result="ok")]) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        assert main(["--quiet", "hi"]) == 2
        assert server.requests == []
    assert said_lines(capsys.readouterr().err) == [
        f"agent-demo: error: the run log folder {folder} is reached through {link}, a symlink owned by"
        f" nobody (uid {NOBODY}), not by you: use a path of your own"]
    assert list(target.iterdir()) == []
    os.lchown(link, 0, 0)  # the user's own symlink is followed
    with ScriptedServer([act("finish", result="ok")]) as server:
        monkeypatch.setenv("LLM_API_URL", server.url)
        assert main(["--quiet", "hi"]) == 0


@root_only
def test_a_trace_path_that_is_another_users_symlink_creates_nothing(tmp_path, monkeypatch, capsys):
    victim = tmp_path / "victim.txt"
    link = tmp_path / "run.jsonl"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    monkeypatch.setenv("LLM_API_URL", "http://127.0.0.1:9/v1")
    assert main(["--trace", str(link), "hi"]) == 2
    assert "a symlink owned by nobody" in capsys.readouterr().err
    assert not victim.exists()


def test_runs_refuses_a_shared_folder_too(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "runs"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o770)
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(folder))
    assert main(["--runs"]) == 2
    assert said_lines(capsys.readouterr().err) == [
        f"agent-demo: error: the run log folder {folder} is writable by its group (mode 770): chmod 700 {folder}"]


@pytest.mark.processes
def test_resume_shows_where_requests_go_and_which_tools_files_it_imports(serve, tmp_path, capsys):
    tools_file = tmp_path / "mine.py"
    tools_file.write_text("def shout(text: str) -> str:\n    '''Shout.'''\n    return text.upper()\n")
    trace = tmp_path / "run.jsonl"
    server = serve([act("shout", text="a"), act("finish", result="A")])
    assert main(["--tools-file", str(tools_file), "--trace", str(trace), "--max-rounds", "1", "--quiet", "x"]) == 1
    assert main(["--resume", str(trace), "--tools-file", str(tools_file), "--max-rounds", "2"]) == 0
    err = capsys.readouterr().err
    assert f"resuming {trace}\n  requests go to {server.url}/chat/completions\n  tools files: {tools_file}\n" in err


def test_a_trace_path_in_a_symlink_loop_is_one_clear_error(serve, tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    server = serve([act("finish", result="never")])
    assert main(["--trace", str(tmp_path / "a" / "t.jsonl"), "hi"]) == 2
    assert server.requests == []
    [said] = said_lines(capsys.readouterr().err)
    assert said.startswith("agent-demo: error: ") and "too many levels of symlinks" in said


def test_a_trace_path_with_dot_dot_is_followed_like_any_other(serve, tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    serve([act("finish", result="ok")])
    assert main(["--quiet", "--trace", str(tmp_path / "logs" / ".." / "t.jsonl"), "hi"]) == 0
    assert (tmp_path / "t.jsonl").exists()


@root_only
def test_a_folder_of_a_user_without_a_name_is_refused_naming_the_uid(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "runs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 54321, 54321)  # a uid no account has
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(folder))
    assert main(["--runs"]) == 2
    [said] = said_lines(capsys.readouterr().err)
    assert "uid 54321" in said


@pytest.mark.parametrize("mode, refused", [(0o777, "others"), (0o775, "its group"), (0o1777, None)],
                         ids=["writable by others", "by its group", "sticky, as /tmp"])
def test_a_run_log_folder_s_parents_are_checked_as_ssh_checks_a_home(serve, cli, tmp_path, monkeypatch, mode, refused):
    server = serve([act("finish", result="ok")])
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    folder = shared / "mine" / "runs"
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(shared / "mine", 0o700)
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(folder))
    code, out, err = cli("--quiet", "hi")
    if refused is None:
        assert (code, out) == (0, "ok\n") and len(list(folder.glob("*.jsonl"))) == 1
        return
    assert code == 2 and server.requests == [] and list(folder.iterdir()) == []
    assert said_lines(err) == [
        f"agent-demo: error: the run log folder {folder} is inside {shared}, which is writable by {refused} (mode"
        f" {mode:o}): they can put a folder of theirs in its place; use a folder whose parents only you can change"]
    assert cli("--runs")[0] == 2, "nor is it read"


@root_only
def test_a_run_log_folder_inside_another_user_s_folder_is_refused(serve, cli, tmp_path, monkeypatch):
    serve([act("finish", result="ok")])
    theirs = tmp_path / "theirs"
    (theirs / "runs").mkdir(parents=True, mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(theirs / "runs"))
    code, out, err = cli("--quiet", "hi")
    assert code == 2 and f"is inside {theirs}, which belongs to nobody (uid {NOBODY})" in err


def test_the_folders_it_makes_get_their_mode_through_a_descriptor_never_by_name(serve, cli, tmp_path, monkeypatch):
    serve([act("finish", result="ok")])
    by_name = []
    monkeypatch.setattr(os, "chmod", lambda path, *args, **kwargs: by_name.append(path))  # a name may be swapped
    code, out, err = cli("--quiet", "hi")
    assert (code, by_name) == (0, [])
    assert stat.S_IMODE((tmp_path / "state" / "agent-demo" / "runs").stat().st_mode) == 0o700


def test_a_symlink_of_yours_in_a_shared_folder_is_no_way_to_the_run_log_folder(serve, cli, tmp_path, monkeypatch):
    serve([act("finish", result="ok")])
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    shared.mkdir()
    os.chmod(shared, 0o777)  # not sticky: anyone may put their own folder in place of the link
    mine.mkdir(mode=0o700)
    (shared / "link").symlink_to(mine)
    monkeypatch.setenv("AGENT_DEMO_LOG_DIR", str(shared / "link" / "runs"))
    code, out, err = cli("--quiet", "hi")
    assert code == 2 and f"is inside {shared}, which is writable by others (mode 777)" in err
    assert list(mine.iterdir()) == []
