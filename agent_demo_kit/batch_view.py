"""What a batch says as it goes, on stderr: the first lines (where it runs, what goes on from where,
the task file's checks), a line a task as it ends, a live line on a terminal (done/total, the
counts, tokens, time and an ETA), and the table, the failures and how to go on at its end.

It imports metrics, comparison, batch_folder and urls.
"""
import json
import shutil
import sys
import time
from typing import Dict, List

from agent_demo_kit import metrics
from agent_demo_kit.batch_folder import results_name
from agent_demo_kit.private_files import write_private
from agent_demo_kit.comparison import FAILURES_SHOWN, render_failures
from agent_demo_kit.urls import display_url


class Saying:
    """The batch's words; a part of Batch, which holds what they are about."""

    # --- what is said ---

    def say(self, text: str) -> None:
        with self.screen:
            self.clear_live()
            print(f"agent-demo: {text}", file=sys.stderr, flush=True)

    def say_start(self) -> None:
        if self.quiet:
            return
        total = len(self.tasks)
        where = f" (shard {self.part[0]} of {self.part[1]} slices)" if self.part else ""
        why = "--parallel" if self.parallel_given else (
            "a local server answers one request at a time; --parallel N to change" if self.parallel == 1
            else "the default for a hosted endpoint; --parallel N to change")
        left = len(self.queue)
        goes_on = sum(not planned.fresh and planned.traced for planned in self.queue)
        print(f"agent-demo: batch of {total} task(s){where} into {self.out}/, {self.parallel} at a time ({why})",
              file=sys.stderr)
        chosen = self.environment.where_requests_go(self.settings) if hasattr(self.environment, "where_requests_go") \
            else ""
        if chosen:
            print(f"agent-demo: requests go to {display_url(self.settings.endpoint)}{chosen}", file=sys.stderr)
        if self.skipped or goes_on:
            print(f"agent-demo: {self.skipped} already ended, {goes_on} go on from their traces,"
                  f" {left - goes_on} start", file=sys.stderr, flush=True)
        if self.changed:
            shown = ", ".join(self.changed[:5]) + (f" and {len(self.changed) - 5} more" if len(self.changed) > 5 else "")
            print(f"agent-demo: {len(self.changed)} task(s) say something else than when they last ran ({shown}):"
                  " they start again", file=sys.stderr, flush=True)
        for said in self.notes:
            print(f"agent-demo: {said}", file=sys.stderr, flush=True)

    def say_task_checks(self) -> None:
        """The commands task lines name as checks, with their lines, said once before the first request
        (even under --quiet): run as the user with --task-checks, else passed by."""
        named: Dict[str, List[int]] = {}
        for task in self.tasks:
            if task.check is not None and task.repeat == 1:
                named.setdefault(task.check, []).append(task.line)
        if not named:
            return
        if not self.task_checks:
            lines = sorted(line for found in named.values() for line in found)
            shown = ", ".join(map(str, lines[:10])) + (f" and {len(lines) - 10} more" if len(lines) > 10 else "")
            print(f"agent-demo: {len(lines)} task line(s) of {self.source} name a check (line {shown}): not run,"
                  " since a task file is data; --task-checks runs them as you, beside --check", file=sys.stderr,
                  flush=True)
            return
        print(f"agent-demo: --task-checks: these commands from {self.source} run as you on the answers of their"
              " tasks" + (", beside --check" if self.settings.check is not None else "") + ":", file=sys.stderr)
        for command, lines in named.items():  # every one: what runs as the user is never left unsaid
            shown = ", ".join(map(str, lines[:5])) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
            print(f"  line {shown}: {command}", file=sys.stderr)
        sys.stderr.flush()

    def say_task(self, line: dict) -> None:
        """One line a task as it ends (not under --quiet), above the live line."""
        if self.quiet:
            return
        said = line.get("answer") if line["status"] == "finished" else line.get("error") or line.get("summary") or ""
        said = said if isinstance(said, str) else json.dumps(said, ensure_ascii=False)
        said = " ".join(said.split())
        tried = f" (try {line['repeat']})" if self.tries > 1 else ""
        verdict = {True: ", right", False: ", wrong"}.get(line.get("correct"), "") if line["status"] == "finished" else ""
        scores = line.get("scores") if isinstance(line.get("scores"), dict) and line["status"] == "finished" else {}
        verdict += "".join(f", {name} {score:g}" for name, score in scores.items())  # --scorer's, --judge's
        text = (f"[{self.done + self.skipped}/{len(self.tasks)}] {line['id']}{tried}: {line['status']}{verdict},"
                f" {line['rounds']} round(s), {line['seconds']:.1f} s" + (f": {said[:120]}" if said else ""))
        if self.live:  # a line a task on a terminal: cut to its width, never wrapped
            text = text[:shutil.get_terminal_size().columns - 1]
        with self.screen:
            self.clear_live()
            print(text, file=sys.stderr, flush=True)
            self.show_live()

    def show_live(self) -> None:
        """On a terminal: done/total, counts per status, tokens, elapsed and ETA, on one redrawn line."""
        if not self.live:
            return
        summary = self.tally.summary()
        elapsed = time.monotonic() - self.started
        left = len(self.tasks) - self.done - self.skipped
        eta = f", ETA {clock(elapsed / self.ran * left)}" if self.ran and left else ""
        counts = ", ".join(f"{status} {count}" for status, count in summary["status_counts"].items())
        text = (f"{self.done + self.skipped}/{len(self.tasks)} done ({counts or 'none yet'}),"
                f" {summary['tokens']['total']:,} tokens, {clock(elapsed)} elapsed{eta}")
        with self.screen:
            self.clear_live()
            sys.stderr.write(text[:shutil.get_terminal_size().columns - 1])
            sys.stderr.flush()
            self.shown_live = True

    def clear_live(self) -> None:
        """Take the live line away (our own code, so that what comes next starts on a clean line)."""
        if self.shown_live:
            write_code = getattr(sys.stderr, "write_code", sys.stderr.write)
            write_code("\r\033[K")
            self.shown_live = False

    def say_end(self) -> dict:
        """The table on stderr and in summary.json; a task whose retry never came (the batch stopped) is
        counted as its last run ended."""
        for line in self.waiting.values():
            self.count(line)
            self.done += 1
            self.say_task(line)
        self.waiting.clear()
        summary = self.summary()
        write_private(self.out / results_name(self.part, "summary"), [json.dumps(summary, indent=2).encode() + b"\n"])
        self.clear_live()
        if not self.quiet:
            print("\n".join(metrics.render(summary)), file=sys.stderr)
            said = render_failures(self.failures, FAILURES_SHOWN)
            if said and self.failed > len(self.failures):
                said[-1] = f"  ... and {self.failed - FAILURES_SHOWN} more (in {self.out / results_name(self.part, 'results')})"
            said[:1] = [f"{self.failed} task(s) did not finish or were wrong:"] if said else []
            print("\n".join(said), file=sys.stderr)
            errors = summary["status_counts"].get("error", 0)
            if errors and not self.stop.is_set():
                print(f"agent-demo: {errors} task(s) ended in an error with no retries left; --retry-errors"
                      f" {self.retry_errors + 1} runs them once more", file=sys.stderr)
            if self.command and self.failed > errors and not self.stop.is_set():
                again = self.command if self.rerun_failed else f"{self.command} --rerun-failed"
                print(f"agent-demo: to run the ones that did not finish or were wrong again: {again}",
                      file=sys.stderr)
            if self.elsewhere:
                print(f"agent-demo: {self.elsewhere} task(s) were being run by another agent-demo process and"
                      " are left to it", file=sys.stderr)
            print(f"agent-demo: results in {self.out / results_name(self.part, 'results')}", file=sys.stderr,
                  flush=True)
        if self.command and (self.stopped_by or self.endpoint_failed):  # even under --quiet: how to go on
            print(f"agent-demo: to go on: {self.command}", file=sys.stderr, flush=True)
        return summary


def clock(seconds: float) -> str:
    """Seconds as h:mm:ss or m:ss."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
