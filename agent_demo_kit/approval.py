"""The approval question: asked on the controlling terminal whatever stdin is, about a call as it
will run (its tool first, then its arguments as JSON), always whole on the screen, with every
character that could make it read other than it runs shown as its escape; and the y/N question a
resume asks about what only its trace names.

It imports terminal and redaction.
"""
import os
import re
import unicodedata
from typing import Callable, Optional, Set

from agent_demo_kit.records import to_json
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.terminal import (ACTIVE, CONTROLLING_TERMINAL, SafeStream, columns, escaped, first_columns,
                                     last_columns)



QUESTION_LINES = 6  # the most one line of a question takes of the terminal: it stays whole on 80x24


_WHITESPACE_RUN = re.compile(r"\s{5,}")


MARKS_ON_ONE = 2  # combining marks shown on one character; more (stacked over the lines around) are escaped


def _hidden(character: str) -> bool:
    """Whether a question shows character as an escape: what the trace escapes (the one rule, ACTIVE),
    and, since a question's line is what runs, every other character but plain letters, marks,
    digits, punctuation, symbols and the plain space (Unicode's C* and Z* categories: a no-break
    space would make "rm\u00a0-rf" read as "rm -rf")."""
    category = unicodedata.category(character)
    return ACTIVE.match(character) is not None or category[0] == "C" or category[0] == "Z" and character != " "


def visible(text: str) -> str:
    """text with every character a question must not show raw as its escape (see _hidden), and the
    combining marks past MARKS_ON_ONE on one character too."""
    shown, marks = [], 0
    for character in text:
        marks = marks + 1 if unicodedata.combining(character) else 0
        shown.append(escaped(character) if marks > MARKS_ON_ONE or _hidden(character) else character)
    return "".join(shown)


def _whitespace_shown(match: "re.Match") -> str:
    run = match.group()
    kind = {" ": "spaces", "\t": "tabs"}.get(run[0], "whitespace characters") if len(set(run)) == 1 \
        else "whitespace characters"
    return f"[{len(run):,} {kind}]"


def question_line(line: str, room: int) -> str:
    """One line of a question in at most `room` columns, whatever it holds: runs of whitespace said
    as such ([4,000 spaces]), what is invisible escaped, and when still too long its head and its
    end with the length of the whole between them, so the tool's name and the end of a command show."""
    whole = len(line)
    line = _WHITESPACE_RUN.sub(_whitespace_shown, line)
    if len(line) <= room:
        shown = visible(line)
        if columns(shown) <= room:
            return shown
    cut = f" [... cut here: {whole:,} characters in all ...] "
    head_room = (room - len(cut)) * 2 // 3
    tail_room = room - len(cut) - head_room
    return (first_columns(visible(line[:head_room]), head_room) + cut
            + last_columns(visible(line[len(line) - tail_room:]), tail_room))


def terminal_confirm(redactor: Redactor) -> Optional[Callable[[str], bool]]:
    """A y/N question asked on the controlling terminal (default no); None when the process has none."""
    approver = terminal_approver(redactor)
    return None if approver is None else confirming(approver)


def confirming(approver: "TerminalApprover") -> Callable[[str], bool]:
    """A y/N question asked by this approver: True only for yes."""
    return lambda question: approver.ask(question) in ("y", "yes")


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
            try:
                width = os.get_terminal_size(descriptor).columns or 80
            except OSError:
                width = 80
            # Whole on the screen, whatever the call holds: each line cut to a few of the terminal's lines.
            room = max(width, 40) * QUESTION_LINES - 1
            terminal.write("\n".join(question_line(line, room) for line in self.redactor(question).split("\n")))
            terminal.finish()
            answer = os.read(descriptor, 1024)  # one line: the terminal hands it over on Enter
            if not answer:  # Ctrl-D: end the line the question left open
                terminal.write("\n")
                terminal.finish()
            return answer.decode("utf-8", "replace").strip().lower()
        finally:
            os.close(descriptor)
