"""The approval question: asked on the controlling terminal (/dev/tty) whatever stdin is, as sudo
and git ask for a password, with the call exactly as it will run, shown inert, and type-ahead
dropped first. y runs the call, n refuses it, a says yes to that tool for the rest of the run."""
import os
from typing import Optional, Set

from agent_demo_kit.redaction import Redactor
from agent_demo_kit.terminal import SafeStream, to_json

CONTROLLING_TERMINAL = "/dev/tty"


def terminal_approver(redactor: Redactor) -> Optional["TerminalApprover"]:
    """The approval question, asked on the controlling terminal whatever stdin is (as sudo and git
    ask for a password); None when the process has no terminal."""
    try:
        os.close(os.open(CONTROLLING_TERMINAL, os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return None
    return TerminalApprover(redactor)


class TerminalApprover:
    """Asks y/N/a about each call: "a" says yes to that tool for the rest of the run."""

    def __init__(self, redactor: Redactor):
        self.redactor = redactor
        self.always: Set[str] = set()

    def __call__(self, call: dict) -> bool:
        if call["tool"] in self.always:
            return True
        # On a line of its own, the call exactly as it will run: JSON keeps the arguments' text
        # exact, and the terminal stream shows anything a terminal would act on escaped.
        warning = f"\nwarning: {call['tool']}: {call['warning']}" if call.get("warning") else ""
        again = " again (it may have run before the run was cut short)" if call.get("may_have_run") else ""
        answer = self.ask(f"{warning}\napprove {call['tool']} {to_json(call['args'])}{again}? [y/N/a] ")
        if answer == "a":
            self.always.add(call["tool"])
        return answer in ("y", "yes", "a")

    def ask(self, question: str) -> str:
        """The answer typed to question on the terminal, lowercase; what was typed before it was
        shown (while the model worked) is dropped, so it cannot answer a question not yet asked."""
        import termios  # POSIX only, like /dev/tty
        descriptor = os.open(CONTROLLING_TERMINAL, os.O_RDWR | os.O_NOCTTY)
        try:
            termios.tcflush(descriptor, termios.TCIFLUSH)
            terminal = SafeStream(open(descriptor, "w", encoding="utf-8", closefd=False), self.redactor, "drop",
                                  inert=True)
            terminal.write(question)
            terminal.finish()
            answer = os.read(descriptor, 1024)  # one line: the terminal hands it over on Enter
            if not answer:  # Ctrl-D: end the line the question left open
                terminal.write("\n")
                terminal.finish()
            return answer.decode("utf-8", "replace").strip().lower()
        finally:
            os.close(descriptor)
