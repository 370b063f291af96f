"""Many tasks: --batch runs a JSON Lines file of tasks through the same agent as one task, N at a
time in one process under one shared, adaptive limit on requests in flight, into an output folder
that a rerun of the same command picks up where it stopped; --summary adds up result folders
(shards merged) or the run log folder.

The output folder holds a trace per task (traces/ID.jsonl) and results.jsonl, a line a task as it
ends (its figures, read back from its trace: agent_demo_kit/metrics.py), rewritten at the end with
one line a task; and summary.json. A shard (--shard I/N) writes results-IofN.jsonl and
summary-IofN.json, so shards may share a folder. Whether a task is done is read from its trace, so
nothing that a rerun needs lives only in this process: after kill -9, a task with rounds recorded
is resumed from them, and one that ended is not run again.
"""
import collections
import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterable, List, NamedTuple, Optional, Tuple

from agent_demo import run_job
from agent_demo_kit.setup import prepare
from agent_demo_kit import metrics, scoring
from agent_demo_kit.batch_view import Saying
from agent_demo_kit.batch_folder import (check_output_folder, check_output_parents, configuration, default_out,
                                         another_configuration, put_results_in_order, refuse_another_configuration,
                                         refuse_another_task_file, results_name)
from agent_demo_kit.comparison import OUTPUT_FILES, FAILURES_SHOWN, failures, read_results, success
from agent_demo_kit.endings import ENDED, ConfigError, EndpointError, Interrupted, RunResult, SigTerm, Terminated
from agent_demo_kit.private_files import in_use, lock, only_yours_again, open_private, readable_by_group
from agent_demo_kit.records import number
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.request_gate import RequestGate
from agent_demo_kit.outcome import cost
from agent_demo_kit.seals import is_sealed, sealed
from agent_demo_kit.settings import DEFAULT_RETRY_ERRORS, HOSTED_PARALLEL, keyword_name, load_settings
from agent_demo_kit.task_file import BatchTask, read_tasks, task_hash
from agent_demo_kit.terminal import is_terminal
from agent_demo_kit.trace_file import has_start, last_run, read_records, sealed_run, started_as
from agent_demo_kit.urls import mcp_urls, secrets_of

LIVE_EVERY = 0.5  # seconds between redraws of the live line
DOWN_AFTER = 3  # tasks in a row without a connection to the endpoint that stop the batch
BUSY_TURNS = 3  # turns a task whose trace stays locked gets, before it is left to whoever holds it
FREED_WITHIN = 5.0  # seconds a task's trace may stay locked after its last run ended, before it is taken up


# --- the output folder -------------------------------------------------------------------------


def _same(recorded: Any, expected: Any) -> bool:
    """Is what a results line recorded as expected what the task file expects now (1 and 1.0 differ,
    and so do 1 and true: the line was scored against the value as it was written)?"""
    return json.dumps(recorded, sort_keys=True) == json.dumps(expected, sort_keys=True)


def summarize_runs(traces: List[Path]) -> dict:
    """--summary without a folder: the table of these runs (the run log folder's)."""
    tally = metrics.Tally()
    for path in traces:
        figures = metrics.run_figures(read_records(str(path)))
        if figures:
            tally.add(figures)
    return tally.summary()


# --- running ---------------------------------------------------------------------------------------

class Planned(NamedTuple):
    """A task to run now: from the start (fresh) or from its trace (when it holds a start)."""

    task: BatchTask
    fresh: bool
    traced: bool = False  # its trace holds a run's start
    busy: int = 0  # times its trace was found locked when its turn came


class Batch(Saying):
    """The tasks of one shard (or all of them), run into one output folder."""

    def __init__(self, tasks: List[BatchTask], out: Optional[Path], given: Dict[str, Any], environment: Dict[str, str],
                 parallel: Optional[int] = None, retry_errors: int = DEFAULT_RETRY_ERRORS, rerun_failed: bool = False,
                 part: Optional[Tuple[int, int]] = None, quiet: bool = False, named: Callable[[str], str] = keyword_name,
                 notes: Iterable[str] = (), match: Optional[str] = None, repeat: int = 1, source: str = "-",
                 command: Optional[str] = None, task_checks: bool = False, group_readable: bool = False,
                 scorers: Any = None, judge: Any = None):
        sliced = tasks if part is None else tasks[part[0]::part[1]]
        self.tasks = sliced if repeat == 1 else [task._replace(repeat=n, file=f"{task.file}@{n}" if n > 1 else task.file)
                                                 for task in sliced for n in range(1, repeat + 1)]
        self.given, self.environment, self.named = given, environment, named
        from agent_demo_kit.client import is_local  # not before a batch runs: --version starts without requests
        self.settings = load_settings(given, environment, named=named)  # what is wrong is said before any task runs
        self.match, self.tries, self.source, self.command = match, repeat, source, command
        self.task_checks = task_checks  # run the checks task lines name (--task-checks), beside --check
        # What grades each answer besides `expected`: scorers.Scorers (--scorer), judge.Judge (--judge).
        self.graders = [grader for grader in (scorers, judge) if grader is not None]
        self.group_readable = group_readable  # the output folder's group may read it (--group-readable)
        self.prices, self.config = self.settings.prices(), {**configuration(self.settings), "task_checks": task_checks}
        for task in sliced:  # a regex that does not compile is said before anything is sent
            try:
                if task.expected is not None:
                    scoring.check_expectation(task.expected, task.match or match)
            except scoring.BadExpectation as error:
                raise ConfigError(f"{source} line {task.line}: {error}") from None
        out = out if out is not None else default_out(source, self.settings.model)
        self.out, self.traces = out, out / "traces"
        self.parallel = parallel or (1 if is_local(self.settings.endpoint) else HOSTED_PARALLEL)
        self.parallel_given = parallel is not None
        self.retry_errors, self.rerun_failed, self.part, self.quiet = retry_errors, rerun_failed, part, quiet
        self.notes = list(notes)  # said at the start (keys of the task file passed by)
        self.stop = threading.Event()
        self.all_done = threading.Event()  # set when the last worker has ended
        self.working = 0  # workers still going
        self.gate = RequestGate(self.parallel, self.stop)
        self.tally = metrics.Tally(repeat)
        self.failed, self.failures = 0, []  # type: int, List[dict]  # tasks that did not succeed, and the first few
        self.endpoint_failed = False  # a refused key or an endpoint that cannot be reached stopped the batch
        self.stopped_by = 0  # 130 or 143 once Ctrl-C or SIGTERM stopped the batch
        self.scored_tasks = sum(task.scored for task in self.tasks)
        self.queue: Deque[Planned] = collections.deque()
        self.lock = threading.Lock()
        self.done = self.ran = self.skipped = 0
        self.started = time.monotonic()
        self.results: Any = None
        self.live = is_terminal(sys.stderr) and not quiet and environment.get("TERM") != "dumb"
        self.shown_live = False
        self.screen = threading.RLock()  # one writer of stderr at a time: a task's line, the live line
        self.changed: List[str] = []  # ids whose text changed since their last run: they start again
        self.stopped_because: Optional[str] = None  # said once: why no more tasks start
        self.elsewhere = 0  # tasks another agent-demo process was running when their turn came
        self.cut_off = 0  # tasks in a row that got no connection to the endpoint at all
        self.waiting: Dict[str, dict] = {}  # tasks that ended in an error and wait for their retry: their lines

    # --- the plan: what is done, what goes on, what starts ---

    def plan(self) -> None:
        """Decide each task from what the folder holds: one that ended is counted and not run again
        (--rerun-failed: one that did not finish, or was wrong, starts again); one that ended in an
        error goes on while it has errors left (--retry-errors); any other goes on from its trace, or
        starts. ConfigError, before anything is sent, when the folder holds another configuration's."""
        # Only the lines this batch wrote count: a line someone put in (an archive that came with its
        # results, say) carries no seal of the user's, and its task's trace decides instead.
        known = read_results(self.out, sealed_only=True)
        refuse_another_configuration(self.out, known, self.config)
        refuse_another_task_file(self.out, self.source)
        traced = set(os.listdir(self.traces))
        for task in self.tasks:
            line = known.pop(task.key, None)
            has_trace = f"{task.file}.jsonl" in traced
            if not has_trace:  # its record is gone (or never was): it runs, from the start
                line = None
            elif line is None or line.get("status") not in ENDED:
                # The trace knows better: the task went on after its line, or ended just before a kill -9.
                records = read_records(str(self.trace(task)))
                if not sealed_run(self.trace(task)):
                    raise ConfigError(f"{self.trace(task)} was not written by agent-demo as you (a record that set its"
                                      " run up carries no seal of yours for its place there): its figures and answer"
                                      " count for nothing; move it away and the task runs again")
                model = str(last_run(records)[0].get("model")) if last_run(records) else None
                if model is not None and model != self.settings.model.strip():
                    self.refuse([f"model {model}, now {self.settings.model.strip()} (in {self.trace(task).name})"])
                from_trace = self.line(task, metrics.run_figures(records))
                if from_trace and not started_as(records, task.task):
                    from_trace["task_hash"] = "changed"
                elif from_trace and from_trace["status"] in ENDED:
                    self.write(from_trace)
                line = from_trace or line
            if line is not None and line.get("task_hash") not in (None, task_hash(task.task)):
                self.changed.append(task.id)  # the file now says something else under this id
                self.queue.append(Planned(task, fresh=True, traced=has_trace))
                continue
            status = line.get("status") if line else None
            if line is not None and status in ENDED:
                line = self.rescored(line, task)
            again = self.rerun_failed and line is not None and (status != "finished" or line.get("correct") is False)
            if status in ENDED and not again \
                    or status == "error" and number(line.get("errors")) > self.retry_errors:
                self.count(line)
                self.skipped += 1
            else:
                self.queue.append(Planned(task, fresh=status in ENDED, traced=has_trace))

    def refuse(self, differences: List[str]) -> None:
        """Stop before anything is sent: the folder's results come from another configuration."""
        raise another_configuration(self.out, differences)

    def trace(self, task: BatchTask) -> Path:
        return self.traces / f"{task.file}.jsonl"

    def write(self, line: dict) -> None:
        """Add a line to the results file, at once (a kill -9 loses nothing written)."""
        self.results.write(json.dumps(sealed(line), ensure_ascii=False) + "\n")  # the user's own, and said so
        self.results.flush()

    def line(self, task: BatchTask, figures: Optional[dict]) -> Optional[dict]:
        """A task's results line: its id and try, its figures, whether its answer was right, its cost,
        its trace (relative to the folder), its configuration, when it ended."""
        if figures is None:
            return None
        return self.scored({"id": task.id, "repeat": task.repeat, **figures, "trace": f"traces/{task.file}.jsonl",
                            "task_hash": task_hash(task.task), "config": self.config,
                            "ended_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}, task)

    def scored(self, line: dict, task: BatchTask) -> dict:
        """The line with its score against what the task expects (correct: null when it expects nothing;
        false when it did not finish; with promptfoo's asserts, true when all of them pass, each one's
        verdict beside it) and, with --price, its cost."""
        match = self.match_of(task)
        finished = line.get("status") == "finished"
        for name in ("metadata", "asserts"):
            line.pop(name, None)
        if task.metadata:  # what the file says of the task now: its groups in the summary
            line["metadata"] = task.metadata
        if task.asserts:  # judged only when the run finished: a failed run's "nothing" passes no not-contains
            line["asserts"] = [{"type": kind, "value": value,
                                "pass": scoring.assert_passes(line.get("answer"), kind, value) if finished else None}
                               for kind, value in task.asserts]
        line.update(expected=task.expected, match=match, correct=(
            None if not task.scored else finished and all(each["pass"] for each in line["asserts"]) if task.asserts
            else finished and scoring.score(line.get("answer"), task.expected, match)))
        return self.price(self.with_scores(line, task))

    def match_of(self, task: BatchTask) -> Optional[str]:
        """How the task's expected is matched (its line's match, else --match); none for promptfoo's
        asserts, which say themselves how they judge."""
        return None if task.asserts else task.match or self.match

    def with_scores(self, line: dict, task: BatchTask) -> dict:
        """The line with each --scorer's and the --judge's score of its answer, kept when it has them
        already (each grades a task once, when it ends, as the regex judge does)."""
        for grader in self.graders:
            if grader.graded(line):
                continue
            scores, error, kept = grader.score(task.task, line.get("answer"), task.expected,
                                               finished=line.get("status") == "finished", asserts=task.asserts)
            before = {name: score for name, score in (line.get("scores") if isinstance(line.get("scores"), dict)
                                                      else {}).items() if name not in grader.names()}
            for key in grader.kept_keys:  # another judge's word is not this one's
                line.pop(key, None)
            line["scores"] = {**before, **scores}
            line.update(kept)
            if error:
                line[grader.error_key] = error
            else:
                line.pop(grader.error_key, None)
        return line

    def price(self, line: dict) -> dict:
        """The line with its cost by --price now, when --price is given."""
        models = line.get("models") if isinstance(line.get("models"), dict) else {}
        if self.prices:
            line["cost"] = cost(models, self.prices)
            for name, used in models.items():
                if isinstance(used, dict) and name in self.prices:
                    used["cost"] = cost({name: used}, self.prices)
        return line

    def rescored(self, line: dict, task: BatchTask) -> dict:
        """A line read back, scored against what the file expects now (and priced by --price now),
        written again when that changed something."""
        before = {name: line.get(name) for name in ("expected", "match", "asserts", "correct", "cost", "scores",
                                                    "judge", "judge_error", "scorer_error")}
        judged = [[each.get("type"), each.get("value")] for each in before["asserts"] or () if isinstance(each, dict)]
        if _same(before["expected"], task.expected) and before["match"] == self.match_of(task) \
                and _same(judged, [list(each) for each in task.asserts or ()]) \
                and isinstance(before["correct"], bool) == task.scored:
            line = dict(line)  # scored once, when it ended (a sealed line): a regex is not run again
            self.price(self.with_scores(line, task))
        else:
            line = self.scored(dict(line), task)
        if any(line.get(name) != value for name, value in before.items()):
            self.write(line)
        return line

    def count(self, line: dict) -> None:
        """Add an ended task's line to the figures, and to the failures said at the end."""
        self.tally.add(line)
        if not success(line):
            self.failed += 1
            if len(self.failures) < FAILURES_SHOWN + 1:
                self.failures += failures([line])

    # --- the run ---

    def run(self, needed: Optional[float] = None) -> Tuple[int, dict]:
        """Run what the plan leaves, `parallel` at a time: the exit code of the whole (0 when every task
        finished, or the `needed` share of them; 1 otherwise; 130 or 143 when stopped) and the summary."""
        check_output_parents(self.out)  # before anything is made in it
        try:
            self.out.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.traces.mkdir(exist_ok=True, mode=0o700)
        except OSError as error:
            raise ConfigError(f"--out {self.out}: cannot make the output folder there: {error.strerror or error}") \
                from None
        check_output_folder(self.out)
        if self.group_readable:  # its own files: the results, summaries, the page, the traces
            readable_by_group(self.out, lambda name: bool(OUTPUT_FILES.fullmatch(name)) or name == "report.html"
                              or os.path.dirname(name) == "traces" and name.endswith(".jsonl"))
        path = self.out / results_name(self.part, "results")
        new = not path.exists()
        self.results = open(open_private(str(path), "the results file"), "a", encoding="utf-8")
        if not lock(self.results):
            self.results.close()
            raise ConfigError(f"{path} is being written by another agent-demo --batch that is still going")
        try:
            try:
                self.plan()
            except ConfigError:  # refused before anything was sent: leave no empty results file behind
                if new and self.results.tell() == 0:
                    path.unlink()
                raise
            self.say_start()
            self.say_task_checks()
            self.stopped_by = self.work_through()
            summary = self.say_end()
            kept = put_results_in_order(path, self.tasks)  # while the lock is held
            if kept and not self.quiet:
                self.say(f"{path.name} keeps {kept} tries from an earlier --repeat past this one's {self.tries}:"
                         f" these figures count {self.tries} try a task; --repeat N counts N")
            self.write_report()
        finally:
            self.results.close()
            if self.group_readable:
                only_yours_again(self.out)
        if self.stopped_by:
            return self.stopped_by, summary
        return EndpointError.exit_code if self.endpoint_failed else exit_code(summary, needed), summary

    def write_report(self) -> None:
        """report.html in the output folder: the figures, the charts, a row a task, each trace a click away."""
        from agent_demo_kit import report_page
        page = self.out / "report.html"
        try:
            redactor = Redactor(*secrets_of({"LLM_API_KEY": self.settings.api_key or "", "LLM_ESCALATE_KEY":
                                             self.settings.escalate_key or ""}, self.settings.url,
                                            self.settings.escalate_url, *mcp_urls(self.settings.mcp_servers)))
            report_page.write_page(page, report_page.folder_pieces(self.out, redactor, sealed_only=True))
        except Exception as error:  # the results stand without it, and the batch ends as it did
            self.say(f"the report page could not be written: {getattr(error, 'strerror', None) or error}")
            return
        if not self.quiet:
            self.say(f"report: {page}")

    def work_through(self) -> int:
        """Start the workers and wait; Ctrl-C (or SIGTERM) stops starting tasks and ends the running
        ones as resumable; a second Ctrl-C stops at once. 0, 130 or 143 (the outcome decides 0 or 1)."""
        self.working = min(self.parallel, len(self.queue))
        if not self.working:
            self.all_done.set()
        for n in range(self.working):
            threading.Thread(target=self.work, daemon=True, name=f"task-{n}").start()
        stopped = 0
        try:
            self.wait_for_workers()
        except (KeyboardInterrupt, SigTerm) as signal:
            stopped = Terminated.exit_code if isinstance(signal, SigTerm) else Interrupted.exit_code
            self.stop.set()
            again = "again" if isinstance(signal, SigTerm) else "Ctrl-C again"
            self.say(f"stopping: no new task starts; the running ones end as resumable ({again}: at once)")
            try:
                self.wait_for_workers()
            except (KeyboardInterrupt, SigTerm):
                from agent_demo_kit.checks import stop_checks
                stop_checks()  # a check in its own session would outlive the process
                self.say("stopped at once: the tasks that were running have no end record; the same command"
                         " goes on with them")
                if self.command:
                    self.say(f"to go on: {self.command}")
                sys.stderr.flush()
                if "agent_demo_kit.telemetry" in sys.modules:  # os._exit skips atexit: the spans go out first
                    sys.modules["agent_demo_kit.telemetry"].flush()
                os._exit(stopped)
        return stopped

    def wait_for_workers(self) -> None:
        """Until every worker has ended, redrawing the live line. (Not Thread.join: a Ctrl-C inside it can
        leave a thread that still runs looking ended.)"""
        while not self.all_done.wait(LIVE_EVERY):
            self.show_live()

    def work(self) -> None:
        """A worker: take the next task, run it, record it, until none is left or the batch stops. Its
        tasks' requests go out on one session of its own, on the process's shared connections."""
        from agent_demo_kit.client import SharedSession
        try:
            session = SharedSession()
            self.work_on(session)
        finally:
            with self.lock:
                self.working -= 1
                if not self.working:
                    self.all_done.set()

    def work_on(self, session: Any) -> None:
        while not self.stop.is_set():
            with self.lock:
                if not self.queue:
                    return
                planned = self.queue.popleft()
            line, may_pass = self.run_one(planned, session)
            with self.lock:
                if line is None and planned.busy < BUSY_TURNS:  # locked a while longer: its turn comes again
                    self.queue.append(planned._replace(busy=planned.busy + 1))
                    continue
                if line is None:  # another agent-demo process is running it: its line is that one's to write
                    self.elsewhere += 1
                    continue
                self.write(line)
                if may_pass and number(line.get("errors")) <= self.retry_errors and not self.stop.is_set() \
                        and number(line.get("attempts")) <= self.retry_errors + DOWN_AFTER:
                    self.queue.append(Planned(planned.task, fresh=False, traced=True))
                    self.waiting[planned.task.key] = line  # counted with it if the batch stops before its turn
                    continue
                self.waiting.pop(planned.task.key, None)
                self.count(line)
                self.done += 1
                self.ran += 1
                self.say_task(line)

    def run_one(self, planned: Planned, session: Any = None) -> Tuple[Optional[dict], bool]:
        """Run one task, or take it up from its trace: its results line, read back from the trace, and
        whether an error it ended in may pass next time (the endpoint's may; a setting's will not). No
        line when another agent-demo process is running the task; the line of its trace when that
        process ended it meanwhile."""
        task = planned.task
        trace = self.trace(task)
        if trace.exists():  # a check or a worker another task started may hold a copy a moment after its run
            free_within(trace, FREED_WITHIN)
            if in_use(trace):
                return None, False
            figures = metrics.run_figures(read_records(str(trace))) if not planned.fresh else None
            if figures and figures["status"] in ENDED:  # ended by another process since the plan
                if not sealed_run(trace):  # or put there by someone: not a result, and not to be run on from
                    return self.line(task, {**metrics.no_figures(), "status": "error", "errors": 1, "error":
                                            f"{trace} ended without your seal: it was not written by agent-demo"
                                            " as you; move it away and the task runs again"}), False
                return self.line(task, figures), False
        resume = not planned.fresh and planned.traced and has_start(trace)
        # A task file is data: its line's check runs only when the user said so, beside --check.
        own_check = (task.check, f"the check of {self.source} line {task.line}") \
            if self.task_checks and task.check is not None else None
        written: Optional[List[dict]] = None if resume else []  # a new run's records: all its figures need
        try:
            with prepare(task.task, given=self.given, environment=self.environment, named=self.named,
                         trace=None if resume else str(trace), resume=str(trace) if resume else None,
                         session=session, task_check=own_check, gate=self.gate, written=written,
                         expected=None if task.expected is None else scoring.expected_text(task.expected),
                         settings=self.settings) as job:
                outcome, _ = run_job(job, stop=self.stop)
        except ConfigError as error:  # this task's own check cannot start, its trace cannot be taken up, ...
            outcome = RunResult(error)
        except Exception as error:  # a bug of ours: this task ends in an error, the others go on
            outcome = RunResult(EndpointError(f"internal error: {type(error).__name__}: {error}"))
        unreachable = getattr(outcome.ending, "unreachable", False)
        with self.lock:  # a few tasks in a row with no connection at all: the endpoint is down, not busy
            self.cut_off = self.cut_off + 1 if unreachable else 0
            down = self.cut_off >= DOWN_AFTER
        if outcome.key_refused or down:  # every task would fail alike: stop here, once
            self.endpoint_failed = True
            refused = "the endpoint is not set up for these requests" if getattr(
                outcome.ending, "set_up_wrong", False) else "the endpoint refused the key"
            self.stop_starting(f"{refused} ({outcome.error}): no more tasks start; the same command goes on once the"
                               " key is right" if outcome.key_refused else
                               f"{outcome.error}: no more tasks start; the same command goes on once the endpoint"
                               " answers")
        figures = metrics.run_figures(written if written else read_records(str(trace)))
        if figures is None or figures["status"] != outcome.status:  # ended before its trace could say so
            figures = {**(figures or metrics.no_figures()), "status": outcome.status,
                       "error": outcome.error, "errors": (figures or {}).get("errors", 0) + (outcome.status == "error")}
        may_pass = outcome.status == "error" and not isinstance(outcome.ending, ConfigError) and not self.stop.is_set()
        return self.line(task, figures), may_pass

    def stop_starting(self, why: str) -> None:
        """No more tasks start (the running ones end as resumable), and why is said once."""
        with self.lock:
            first, self.stopped_because = self.stopped_because is None, self.stopped_because or why
        self.stop.set()
        if first:
            self.say(why)

    def summary(self) -> dict:
        """The table of this run's tasks (those that did not run, as "pending": not done, not right), as
        summary.json holds it, with the configuration, the task file and the first failures."""
        pending = len(self.tasks) - self.tally.runs  # the rates are of every task of the file (or shard)
        summary = self.tally.summary(pending, self.scored_tasks - self.tally.scored, len(self.tasks) // self.tries)
        return {**summary, "config": self.config,
                "tasks_file": None if self.source == "-" else self.source if self.source.startswith("hf:")
                else os.path.abspath(self.source),
                "failed_or_wrong": self.failed, "failures": self.failures[:FAILURES_SHOWN]}



def run_batch(tasks: Any, out: Any, *, parallel: Optional[int] = None, retry_errors: int = DEFAULT_RETRY_ERRORS,
              rerun_failed: bool = False, shard: Optional[Tuple[int, int]] = None, match: Optional[str] = None,
              repeat: int = 1, group_readable: bool = False, **settings: Any) -> dict:
    """--batch from Python: run `tasks` (task texts, or dicts with "task" and optionally "id", "check",
    "expected", "match"; ids are their positions from 1 when not given) into the folder `out`, as the
    command line does (the same folder again goes on where it stopped), quietly; the summary.
    settings: the command line's settings by their long names, as for agent_demo.run. ConfigError as
    agent_demo.run raises it."""
    from agent_demo_kit.environment import read_environment
    if match is not None and match not in scoring.MATCHES:
        raise ConfigError(f"match must be one of {', '.join(scoring.MATCHES)}, got {match!r}")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ConfigError(f"repeat must be a whole number of at least 1, got {repeat!r}")
    text = "".join(json.dumps(item if isinstance(item, dict) else {"task": item}) + "\n" for item in tasks)
    batch = Batch(read_tasks(text, "tasks"), Path(out), settings, read_environment(), parallel=parallel,
                  retry_errors=retry_errors, rerun_failed=rerun_failed, part=shard, quiet=True, match=match,
                  repeat=repeat, group_readable=group_readable)
    return batch.run()[1]


def free_within(trace: Path, seconds: float) -> None:
    """Wait (at most `seconds`) until no process holds the trace's lock: a child that another thread
    forks holds a copy of every open file until it starts its own program."""
    deadline = time.monotonic() + seconds
    while in_use(trace) and time.monotonic() < deadline:
        time.sleep(0.02)


def exit_code(summary: dict, needed: Optional[float]) -> int:
    """0 when every task succeeded (finished, and right when it expected an answer), or at least the
    --pass-rate share did; else 1."""
    rate = summary["succeeded"] / summary["runs"] if summary["runs"] else 1.0
    return 0 if rate >= (1.0 if needed is None else needed) else 1
