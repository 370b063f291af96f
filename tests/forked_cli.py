"""The command line as a child process that starts in milliseconds: forked from a server process
that imported agent-demo once (multiprocessing's forkserver), rather than a new interpreter that
imports it again (a quarter of a second of CPU each time, the suite's largest cost). The child is a
real process with its own pid, stdin, stdout and stderr, its own environment and working folder,
and its signals and exit status; it runs `agent_demo_kit.cli.main` as `python agent_demo.py` does.

What only a new interpreter shows (python -m, a folder's own modules shadowing ours, interpreter
flags, a shell around it) still starts one: conftest.start_cli decides.
"""
import atexit
import multiprocessing
import multiprocessing.reduction
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, List, Optional

PRELOADED = ["agent_demo", "agent_demo_kit.cli", "agent_demo_kit.side_commands", "agent_demo_kit.batch",
             "agent_demo_kit.client", "requests", "forked_cli"]
_CONTEXT: Optional[Any] = None


class _Fd:
    """A file descriptor handed to the child (through the fork server's socket)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _rebuild, (multiprocessing.reduction.DupFd(self.fd),)


def _rebuild(duplicate: Any) -> int:
    return duplicate.detach()


def _child(argv: List[str], cwd: str, env: dict, fds: List[int], terminal: Optional[str]) -> None:
    """In the child: its standard streams, folder and environment (and, given a terminal, a session
    of its own whose controlling terminal it is), then the command line."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    if terminal is not None:
        import fcntl
        import termios
        os.setsid()
        fcntl.ioctl(os.open(terminal, os.O_RDWR), termios.TIOCSCTTY, 0)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start
    sys.stdin = open(0, "r", encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1 if os.isatty(1) else -1)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    sys.argv = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent_demo.py"), *argv]
    from agent_demo_kit.cli import main
    try:
        code = main(argv)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    atexit._run_exitfuncs()  # as an interpreter that ends runs them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOADED)
    return _CONTEXT


class ForkedCli:
    """A subprocess.Popen for the command line, as far as the tests use one."""

    def __init__(self, argv: List[str], cwd: Optional[str], env: dict, stdin: Any, stdout: Any, stderr: Any,
                 text: bool = True, terminal: Optional[str] = None):
        ours, theirs = [None, None, None], []
        for index, given in enumerate((stdin, stdout, stderr)):
            if given == subprocess.PIPE:
                read, write = os.pipe()
                child, parent = (read, write) if index == 0 else (write, read)
                ours[index] = parent
                theirs.append(child)
            elif given == subprocess.DEVNULL or given is None:
                theirs.append(os.open(os.devnull, os.O_RDWR))
            else:
                theirs.append(os.dup(given if isinstance(given, int) else given.fileno()))
        self.process = context().Process(target=_child, args=(list(argv), cwd or os.getcwd(), dict(env),
                                                                [_Fd(fd) for fd in theirs], terminal), daemon=False)
        self.process.start()
        for fd in theirs:
            os.close(fd)
        self.pid = self.process.pid
        mode = dict(encoding="utf-8", errors="replace") if text else {}
        self.stdin = open(ours[0], "w" if text else "wb", **mode) if ours[0] is not None else None
        self.stdout = open(ours[1], "r" if text else "rb", **mode) if ours[1] is not None else None
        self.stderr = open(ours[2], "r" if text else "rb", **mode) if ours[2] is not None else None
        self.returncode: Optional[int] = None
        self.args = argv

    def poll(self) -> Optional[int]:
        if self.returncode is None and not self.process.is_alive():
            self.process.join()
            self.returncode = self.process.exitcode
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.returncode = self.process.exitcode
        return self.returncode

    def communicate(self, input: Any = None, timeout: Optional[float] = None):
        read = {}

        def drain(name: str, stream: Any) -> None:
            read[name] = stream.read()
            stream.close()
        readers = [threading.Thread(target=drain, args=(name, stream), daemon=True)
                   for name, stream in (("out", self.stdout), ("err", self.stderr)) if stream is not None]
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return read.get("out"), read.get("err")

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)
