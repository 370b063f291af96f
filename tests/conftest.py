import contextlib
import os
import shlex
import subprocess
import sys
import time

import hypothesis
import pytest

# The project is three top-level modules and one package; importable without installing.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The test modules, rewritten for pytest's assertion messages, are kept compiled from one run to the
# next, as the project's modules are by the child processes (some shells set PYTHONDONTWRITEBYTECODE).
sys.dont_write_bytecode = False

from scripted_server import ScriptedServer  # noqa: E402

# Property tests: 40 cases each in a run (hypothesis keeps the ones that failed and tries them first).
hypothesis.settings.register_profile("agent-demo", max_examples=40, deadline=None)
hypothesis.settings.load_profile("agent-demo")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "sk-live-DO-NOT-LEAK-0123456789"


@pytest.fixture(autouse=True, scope="session")
def no_controlling_terminal():
    """The tests run without a controlling terminal, as in CI: an approval question asked in-process
    would otherwise wait for someone at the developer's terminal. (A session leader, such as
    pytest started by setsid, cannot let go of its terminal without hanging up on it.)"""
    import fcntl
    import termios
    try:
        terminal = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return
    try:
        if os.getsid(0) != os.getpid():
            fcntl.ioctl(terminal, termios.TIOCNOTTY)
    finally:
        os.close(terminal)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """Each test starts without the developer's LLM_/AGENT_/OPENAI_ variables (retries wait 0.05 s at most),
    in an empty folder,
    with its run log folder under its own state home (subprocesses inherit XDG_STATE_HOME too)."""
    for name in list(os.environ):
        if name.startswith(("LLM_", "AGENT_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no settings file of the developer's
    monkeypatch.setenv("AGENT_MAX_RETRY_WAIT", "0.05")  # no real waits between retries, unless a test sets its own
    monkeypatch.chdir(tmp_path)
    # What a process keeps for its runs a while: a scripted server of an earlier test may have had this
    # test's port, with another window (or none), and connections of its own.
    from agent_demo_kit import windows
    from agent_demo_kit.client import shared_connections
    windows._windows.clear()
    shared_connections().close()


@pytest.fixture
def serve(monkeypatch):
    """Start a scripted server and point LLM_API_URL (and a key, unless key=None) at it."""
    servers = []

    def _serve(replies, key=KEY, screen=None, window=None):
        server = ScriptedServer(replies, screen=screen, window=window).__enter__()
        servers.append(server)
        monkeypatch.setenv("LLM_API_URL", server.url)
        if key:
            monkeypatch.setenv("LLM_API_KEY", key)
        return server
    yield _serve
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def cli(capsys, monkeypatch):
    """The command line in this process: cli(*args, stdin=None) gives (exit code, stdout, stderr).
    stdin, when given, arrives through a real pipe, as from `echo ... | agent-demo`."""
    import threading
    from agent_demo_kit.cli import main

    def run(*args, stdin=None):
        if stdin is not None:
            reading, writing = os.pipe()

            def feed():
                with open(writing, "wb") as pipe:
                    pipe.write(stdin.encode("utf-8"))
            threading.Thread(target=feed, daemon=True).start()
            monkeypatch.setattr(sys, "stdin", open(reading, encoding="utf-8"))
        try:
            code = main([str(arg) for arg in args])
        except SystemExit as usage:  # argparse's --help, --version and usage errors
            code = usage.code
        out, err = capsys.readouterr()
        return code, out, err
    return run


def sealed(record, at=0):
    """A record as agent-demo writes it for this test's user, at byte `at` of its file: a start,
    resume or follow-up record names its run and its place and carries its seal (what a hand-made
    trace needs to be taken up without a question)."""
    from agent_demo_kit.seals import sealed as with_seal
    return with_seal({"run": "0123456789abcdef", **record, "at": at})


def said_lines(err):
    """The lines agent-demo itself says on stderr (errors, summaries), without the round-by-round trace
    and without the command that continues a run cut short."""
    return [line for line in err.splitlines()
            if line.startswith("agent-demo:") and not line.startswith("agent-demo: to continue:")]


def child_environment(extra=None):
    """This test's environment for a child process, plus extra. Bytecode may be written, so each
    child does not compile the project again (some shells set PYTHONDONTWRITEBYTECODE)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra or {})
    return env


def start_cli(*args, env=None, shell_tail=None, python_flags=(), as_module=False, new_interpreter=False, **popen):
    """The real command line in a child process, the one way tests start it: python agent_demo.py ARGS,
    or python -m agent_demo ARGS with the project on PYTHONPATH as an install puts it (then shell_tail,
    such as "| head -c 1" or ">&-", through the shell). Text pipes; stdin empty. A child forked from a
    server that imported agent-demo once (forked_cli.py), unless what is tested is how a new
    interpreter starts (new_interpreter, as_module, python_flags, a shell, a terminal of its own)."""
    if not (new_interpreter or as_module or python_flags or shell_tail or set(popen) - {"stdin", "stdout", "stderr",
                                                                                         "cwd", "text", "terminal"}):
        from forked_cli import ForkedCli
        return ForkedCli([str(arg) for arg in args], popen.get("cwd"), child_environment(env),
                         popen.get("stdin", subprocess.DEVNULL), popen.get("stdout", subprocess.PIPE),
                         popen.get("stderr", subprocess.PIPE), text=popen.get("text", True),
                         terminal=popen.get("terminal"))
    program = ["-m", "agent_demo"] if as_module else [os.path.join(ROOT, "agent_demo.py")]
    command = [sys.executable, *python_flags, *program, *map(str, args)]
    if as_module:
        env = {"PYTHONPATH": ROOT, **(env or {})}
    if shell_tail:
        command = f"{shlex.join(command)} {shell_tail}"
    options = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True,
               **popen}
    return subprocess.Popen(command, shell=bool(shell_tail), env=child_environment(env), **options)


def run_cli(*args, stdin=None, env=None, timeout=60, **popen):
    """Run the command line to its end: (exit code, stdout, stderr)."""
    process = start_cli(*args, env=env, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                        **popen)
    out, err = process.communicate(stdin, timeout=timeout)
    return process.returncode, out, err


@contextlib.contextmanager
def terminal_as(name, monkeypatch):
    """While the block runs in this process, sys.stdout or sys.stderr (`name`) is a pseudo terminal;
    yields a list that holds what the terminal showed, as bytes, once the block has ended."""
    import pty
    import threading
    controller, terminal = pty.openpty()
    shown = []

    def drain():
        while True:
            try:
                data = os.read(controller, 65536)
            except OSError:  # the other end closed
                return
            if not data:
                return
            shown.append(data)
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    seen = []
    with open(terminal, "w", encoding="utf-8") as stream:
        monkeypatch.setattr(sys, name, stream)
        try:
            yield seen
        finally:
            monkeypatch.setattr(sys, name, getattr(sys, f"__{name}__"))
    reader.join(10)
    os.close(controller)
    seen.append(b"".join(shown))


@contextlib.contextmanager
def signal_once(signum, when, within=20.0):
    """While the block runs (the command line, in this process), send `signum` to this process once
    when() turns true, from another thread, as a user's Ctrl-C or a `kill` would. The handlers put
    in place meanwhile make a signal that comes after the block harmless to the test run."""
    import signal
    import threading
    armed, stop = [True], threading.Event()

    def interrupt(number, frame):
        if armed[0]:
            raise KeyboardInterrupt

    def watch():
        deadline = time.monotonic() + within
        while not stop.is_set() and time.monotonic() < deadline:
            if when():
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.01)
    previous = signal.signal(signal.SIGINT, interrupt), signal.signal(signal.SIGTERM, lambda number, frame: None)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        armed[0] = False
        stop.set()
        watcher.join()
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


QUESTION = b"? [y/N/a] "


def answer_on_a_terminal(argv, env, cwd, answers=(b"y\n",), stdin=None, type_ahead=b"", trace_on_terminal=False,
                         question=QUESTION):
    """Run the CLI with a pseudo terminal as its controlling terminal (and its stdin, unless `stdin`
    bytes are piped in; its stderr too if trace_on_terminal), type `type_ahead` at once, and give
    each approval question the next of `answers`; return (what the terminal showed, stdout, stderr,
    exit code)."""
    import pty
    import select
    controller, terminal = pty.openpty()
    name = os.ttyname(terminal)
    process = start_cli(*argv, env=env, cwd=cwd, stdin=subprocess.PIPE if stdin is not None else terminal,
                        stderr=terminal if trace_on_terminal else subprocess.PIPE, text=False,
                        terminal=name)  # its controlling terminal, in a session of its own
    os.write(controller, type_ahead)
    if stdin is not None:
        process.stdin.write(stdin)
        process.stdin.close()
    shown, given, deadline = b"", 0, time.monotonic() + 30
    while time.monotonic() < deadline:  # until the process has ended and all it showed is read
        if not select.select([controller], [], [], 0.05)[0]:
            if process.poll() is not None:
                break
            continue
        shown += os.read(controller, 65536)
        if given < min(len(answers), shown.count(question)):
            os.write(controller, answers[given])
            given += 1
    if process.poll() is None:  # still waiting after 30 s (on a question nobody answers): the test fails
        process.kill()
    out = process.stdout.read()
    err = b"" if trace_on_terminal else process.stderr.read()
    process.wait(timeout=30)
    os.close(controller)
    os.close(terminal)
    return shown, out, err, process.returncode


@pytest.fixture(autouse=True)
def processes_are_marked(request, monkeypatch):
    """A test that starts a process (the command line as a child, --check, a tools worker, an MCP
    server) carries the `processes` marker, so that `pytest -m "not processes"` is a fast loop that
    starts none; one that does not say so fails here."""
    import subprocess
    from forked_cli import ForkedCli
    started = []

    def counting(original):
        def starting(self, *args, **kwargs):
            started.append(args[0] if args else kwargs.get("args", kwargs.get("argv")))
            original(self, *args, **kwargs)
        return starting
    for kind in (subprocess.Popen, ForkedCli):
        monkeypatch.setattr(kind, "__init__", counting(kind.__init__))
    yield
    if started and request.node.get_closest_marker("processes") is None:
        pytest.fail(f"this test starts processes ({len(started)}, the first {started[0]!r}): mark it"
                    " @pytest.mark.processes", pytrace=False)
