"""Benchmark the harness against a zero-latency scripted server on loopback (not a test).

    python tests/benchmark.py [--rounds 200 1000] [--think 2000] [--max-context 24000]

It prints the machine's load average at the start and the end, the batch figures, then, for each
run length (the first also without think blocks), it prints what a prompt cache could reuse (the common prefix
of consecutive requests' messages over their size), how many requests kept less
than half of the previous one, the largest request against --max-context, and
the harness time per round next to a bare `requests.Session` loop that posts
the same request bodies, in the same process, to the same server. Then what a
hostile endpoint costs (100,000 calls in one reply, a 32 MB event line, endless
keep-alives), and the start-up time of --help next to a bare interpreter. Compare figures as ratios
within one run: the machines are shared and noisy.

    python tests/benchmark.py --suite

times the test suite as the README runs it, and the fast loop, with the load beside each.

    python tests/benchmark.py --scorer-cost 1000

times a batch of that many tasks with a Python scorer (--scorer) against the same batch without.

    python tests/benchmark.py --page 10000

makes the report page of two configurations of that many tasks and opens it in Chromium.

    python tests/benchmark.py --instructions

counts instead (with valgrind's callgrind): the instructions a two-round batch task takes next to a
bare requests loop making its two requests, and a round of a long run (rounds 61 to 180, with and
without think blocks) next to a bare loop posting the same bodies, each request answered from bytes
recorded from the scripted server, so that no network, no server and no other job is counted.
"""
import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from agent_demo_kit.cli import main as cli_main  # noqa: E402
from scripted_server import ScriptedServer, action  # noqa: E402

CLI = [sys.executable, str(HERE.parent / "agent_demo.py")]
TRIALS = 5  # each timing is the median of this many runs, the two loops taking turns going first


def long_run_replies(rounds: int, think: int) -> list:
    """Distinct calculator calls, each after a long think block, then finish."""
    thought = "<think>" + ("I should add the next number. " * (think // 30 + 1))[:think] + "</think>\n"
    calls = [thought + action("calculator", expression=f"{n} + 1") for n in range(rounds - 1)]
    return calls + [thought + action("finish", result="done")]


class Stopwatch:
    """Wall time and this process's CPU time (the client's and the server thread's) of a block."""

    def __enter__(self) -> "Stopwatch":
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def harness_run(server: ScriptedServer, rounds: int, max_context: int) -> tuple:
    """The real CLI, in this process: (Stopwatch, its --json outcome, the bodies it sent, connections it opened)."""
    server.restart()
    connections = server.connections
    os.environ["LLM_API_URL"] = server.url
    stdout = io.StringIO()
    with Stopwatch() as watch, contextlib.redirect_stdout(stdout):
        cli_main(["--quiet", "--json", "--max-rounds", str(rounds), "--max-context", str(max_context),
                         "add up"])
    return (watch, json.loads(stdout.getvalue()), [request["body"] for request in server.requests],
            server.connections - connections)


def bare_loop(server: ScriptedServer, bodies: list) -> Stopwatch:
    """What any client pays per round: post each body on one session and read the reply."""
    server.restart()
    session = requests.Session()
    url = server.url + "/chat/completions"
    with Stopwatch() as watch:
        for body in bodies:
            session.post(url, json=body, timeout=30).content  # read whole; a streamed reply is read, not parsed
    session.close()
    return watch


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common beginning of a and b."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # binary search on slices: C speed for long strings
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def prefix_figures(bodies: list) -> dict:
    """What a prompt cache could reuse: each request's common prefix with the one before it."""
    texts = [json.dumps(body["messages"]) for body in bodies]
    kept = [common_prefix(before, after) for before, after in zip(texts, texts[1:])]
    return {"reuse": sum(kept) / sum(len(text) for text in texts[1:]),
            "broken": sum(1 for before, shared in zip(texts, kept) if shared < len(before) / 2)}


def measure(rounds: int, think: int, max_context: int) -> dict:
    replies = long_run_replies(rounds, think)
    with ScriptedServer(replies) as server:
        watch, outcome, bodies, connections = harness_run(server, rounds, max_context)
        harness, bare = [watch], [bare_loop(server, bodies)]
        for trial in range(1, TRIALS):  # the two loops take turns going first
            if trial % 2:
                bare.append(bare_loop(server, bodies))
            harness.append(harness_run(server, rounds, max_context)[0])
            if not trial % 2:
                bare.append(bare_loop(server, bodies))
    sizes = [len(json.dumps(body)) for body in bodies]

    def per_round_ms(watches: list, clock: str) -> float:
        return statistics.median(getattr(watch, clock) for watch in watches) / len(bodies) * 1000
    times = {f"{loop}_{clock}": per_round_ms(watches, clock)
             for loop, watches in (("harness", harness), ("bare", bare)) for clock in ("cpu", "wall")}
    return {"rounds": outcome["rounds"], "status": outcome["status"], **times,
            "first": sizes[0], "last": sizes[-1], "largest": max(sizes), "connections": connections,
            **prefix_figures(bodies)}


def hostile_run(reply: dict, *flags: str) -> tuple:
    """One reply from a hostile endpoint, then finish, through the real CLI in this process:
    (Stopwatch, its --json outcome)."""
    with ScriptedServer([reply, action("finish", result="done")]) as server:
        os.environ["LLM_API_URL"] = server.url
        stdout = io.StringIO()
        with Stopwatch() as watch, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
            cli_main(["--quiet", "--json", "--max-rounds", "2", "--retries", "0", *flags, "hostile"])
    return watch, json.loads(stdout.getvalue())


def hostile_figures() -> None:
    """What a hostile endpoint costs: many calls in one reply, one huge event line, endless keep-alives."""
    from agent_demo_kit.replies import read_stream
    calls = [{"id": f"c{n}", "type": "function", "function": {"name": "calculator",
                                                             "arguments": json.dumps({"expression": f"{n} + 1"})}}
             for n in range(100_000)]
    print("hostile replies:")
    for how, reply in (("streamed", {"content": "", "tool_calls": calls}),
                       ("one plain body", {"content": "", "tool_calls": calls, "no_stream": True})):
        # With no reply cap, so that the 10 MB plain body is read whole, not refused as too long.
        watch, outcome = hostile_run(reply, "--mode", "tools", "--max-reply-tokens", "0")
        print(f"  100,000 calls, {how:<14}  {watch.wall:.2f} s ({watch.cpu:.2f} s CPU, the server's included),"
              f" status {outcome['status']}")
    line = b'data: {"choices": [{"delta": {"content": "' + b"x" * (32 << 20) + b'"}, "finish_reason": "stop"}]}\n\n'
    chunks = [line[start:start + 65536] for start in range(0, len(line), 65536)]
    with Stopwatch() as reading:
        read_stream(iter(chunks))
    with Stopwatch() as parsing:
        json.loads(line[len(b"data: "):])
    print(f"  one 32 MB event line        {reading.cpu:.2f} s CPU ({reading.cpu / parsing.cpu:.1f}x json.loads of it)")
    watch, outcome = hostile_run({"content": "Thinking", "keep_alive": 0.5}, "--timeout", "2", "--reply-deadline", "2")
    print(f"  keep-alives every 0.5 s     ended after {watch.wall:.1f} s with --reply-deadline 2, status {outcome['status']}")


def two_rounds(body: dict, latency: float = 0.0) -> dict:
    """A batch task's two rounds, each reply after `latency` seconds: the calculator, then the answer."""
    done = sum(message["role"] == "assistant" for message in body["messages"])
    content = action("calculator", expression="2 + 3") if done == 0 else action("finish", result="5")
    return {"content": content, "delay": latency}


PEAK_MEMORY = """import atexit, os, runpy, sys
def peak():
    with open("/proc/self/status") as status, open(os.environ["PEAK_FILE"], "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM")).split()[1])
atexit.register(peak)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def task_file(folder: str, tasks: int) -> str:
    """A task file of `tasks` lines of plain text."""
    path = os.path.join(folder, f"tasks-{tasks}.jsonl")
    with open(path, "w") as file:
        file.writelines(f"add 2 and 3, number {n}\n" for n in range(tasks))
    return path


def batch_run(server: ScriptedServer, tasks: int, parallel: int, *flags: str) -> tuple:
    """agent-demo --batch of `tasks` two-round tasks, in this process: (Stopwatch, its summary, the
    request bodies of each task)."""
    server.restart()
    folder = tempfile.mkdtemp()
    os.environ["LLM_API_URL"] = server.url
    stdout = io.StringIO()
    with Stopwatch() as watch, contextlib.redirect_stdout(stdout):
        cli_main(["--batch", task_file(folder, tasks), "--parallel", str(parallel), "--out",
                  os.path.join(folder, "out"), "--json", "-q", *flags])
    by_task: dict = {}
    for request in server.requests:
        by_task.setdefault(request["body"]["messages"][1]["content"], []).append(request["body"])
    return watch, json.loads(stdout.getvalue()), list(by_task.values())


def bare_threads(server: ScriptedServer, bodies: list, parallel: int) -> Stopwatch:
    """The same requests from a bare loop in this process: `parallel` threads, a session each, each
    task's requests in turn."""
    url = server.url + "/chat/completions"

    def work(mine: list) -> None:
        with requests.Session() as session:
            for task in mine:
                for body in task:
                    session.post(url, json=body, timeout=30).content
    threads = [threading.Thread(target=work, args=(bodies[n::parallel],)) for n in range(parallel)]
    with Stopwatch() as watch:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return watch


def threaded_runs(server: ScriptedServer, tasks: int, parallel: int) -> tuple:
    """The same tasks as agent_demo.run() calls from `parallel` threads of this process (the way a
    script runs many tasks without --batch): (Stopwatch, connections opened)."""
    import agent_demo
    from agent_demo_kit.client import shared_connections
    server.restart()
    shared_connections().close()  # its connections counted from none
    connections = server.connections
    texts = [f"add 2 and 3, number {n}" for n in range(tasks)]

    def work(mine: list) -> None:
        for text in mine:
            agent_demo.run(text, url=server.url)
    threads = [threading.Thread(target=work, args=(texts[n::parallel],)) for n in range(parallel)]
    with Stopwatch() as watch:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return watch, server.connections - connections


def peak_memory(server: ScriptedServer, tasks: int, parallel: int) -> int:
    """The peak memory (kB) of agent-demo --batch of `tasks` two-round tasks in a process of its own."""
    server.restart()
    folder = tempfile.mkdtemp()
    peak_file = os.path.join(folder, "peak")
    command = [sys.executable, "-c", PEAK_MEMORY, *CLI[1:], "--batch", task_file(folder, tasks), "--parallel",
               str(parallel), "--out", os.path.join(folder, "out"), "-q"]
    subprocess.run(command, check=False, env={**os.environ, "LLM_API_URL": server.url, "PEAK_FILE": peak_file})
    return int(Path(peak_file).read_text())


def batch_against_bare(tasks: int, parallel: int, latency: float) -> tuple:
    """Seconds per task of --batch, of the bare threaded loop making the same requests and of run()
    from as many threads (all in this process, beside the server's threads, taking turns; the median
    of three), the batch's summary, how many requests each made and the connections run() opened."""
    with ScriptedServer([], screen=lambda body: two_rounds(body, latency)) as server:
        watch, summary, bodies = batch_run(server, tasks, parallel)
        batch, bare, runs, connections = [watch], [bare_threads(server, bodies, parallel)], [], 0
        for trial in range(3):
            order = [("batch", "runs", "bare"), ("runs", "bare", "batch"), ("bare", "batch", "runs")][trial]
            for name in order:
                if name == "batch" and trial:
                    batch.append(batch_run(server, tasks, parallel)[0])
                elif name == "bare" and trial:
                    bare.append(bare_threads(server, bodies, parallel))
                elif name == "runs":
                    watch, connections = threaded_runs(server, tasks, parallel)
                    runs.append(watch)
    batch_s, bare_s, runs_s = (statistics.median(watch.wall for watch in watches) / tasks
                               for watches in (batch, bare, runs))
    return batch_s, bare_s, runs_s, summary, sum(map(len, bodies)), connections


def batch_figures(tasks: int, parallel: int, large: int) -> None:
    """--batch against the bare threaded loop, at no latency and at 20 ms a reply, and the peak
    memory of a batch process at tasks and at large."""
    print(f"batch: {tasks:,} two-round tasks, --parallel {parallel}")
    for latency in (0.0, 0.02):
        batch_s, bare_s, runs_s, summary, requests_made, connections = batch_against_bare(tasks, parallel, latency)
        print(f"  time per task, {latency * 1000:2.0f} ms a reply {batch_s * 1000:6.2f} ms ({batch_s / bare_s:.2f}x a bare"
              f" threaded requests loop making the same {requests_made:,} requests: {bare_s * 1000:.2f} ms),"
              f" {summary['status_counts']}")
        print(f"    run() from {parallel} threads     {runs_s * 1000:6.2f} ms ({runs_s / batch_s:.2f}x the batch,"
              f" {runs_s / bare_s:.2f}x the bare loop), {connections} connections opened")
    with ScriptedServer([], screen=two_rounds) as server:
        small_peak, large_peak = peak_memory(server, tasks, parallel), peak_memory(server, large, parallel)
    print(f"  peak memory                 {small_peak / 1024:.1f} MB at {tasks:,} tasks, {large_peak / 1024:.1f} MB"
          f" at {large:,} ({large_peak / small_peak:.2f}x)")


def scorer_figures(tasks: int, parallel: int) -> None:
    """A batch with a Python scorer (--scorer) against the same batch without, three runs each in turn,
    the fastest of each: what scoring each answer costs."""
    folder = tempfile.mkdtemp()
    scorer = os.path.join(folder, "score.py")
    with open(scorer, "w") as file:
        file.write("def same(task, answer, expected):\n    return str(answer).strip() == str(expected).strip()\n")
    times: Dict[bool, List[float]] = {False: [], True: []}
    with ScriptedServer([], screen=two_rounds) as server:
        for _ in range(3):
            for scored in (False, True):
                watch, summary, _ = batch_run(server, tasks, parallel, *(["--scorer", f"{scorer}:same"] if scored
                                                                        else []))
                times[scored].append(watch.wall)
    without, with_scorer = min(times[False]), min(times[True])
    print(f"batch of {tasks:,} tasks with a Python scorer: {with_scorer:.2f} s ({with_scorer / without:.2f}x the same"
          f" batch without: {without:.2f} s), the fastest of three runs each, in turn")


def page_figures(tasks: int) -> None:
    """The report page of two configurations of `tasks` tasks each (results lines made up, no traces):
    how large it is, how long it takes to make, and how long Chromium takes to open it and draw its
    first rows (with Playwright and Chromium installed)."""
    import shutil
    from agent_demo_kit import report_page
    folder = tempfile.mkdtemp()
    for model in ("small", "big"):
        out = os.path.join(folder, model)
        os.makedirs(out)
        with open(os.path.join(out, "results.jsonl"), "w") as file:
            for n in range(tasks):
                right = (n * 7 + len(model)) % 10 < 7
                file.write(json.dumps({"id": f"t{n}", "repeat": 1, "status": "finished", "answer": str(n),
                                       "expected": str(n if right else n + 1), "correct": right, "rounds": 2,
                                       "tokens": {"total": 300}, "seconds": 0.01, "config": {"model": model},
                                       "metadata": {"category": f"c{n % 5}"}, "ended_at": "2026-12-04T00:00:00"})
                           + "\n")
    with Stopwatch() as made:
        page = report_page.page(report_page.batch_data([os.path.join(folder, "small"), os.path.join(folder, "big")]))
    path = os.path.join(folder, "report.html")
    with open(path, "wb") as file:
        file.write(page)
    print(f"report page of 2 x {tasks:,} tasks: {len(page) / 1e6:.1f} MB, made in {made.wall:.2f} s")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser = None
    if not browser:
        print("  (no Chromium and Playwright here: not opened)")
        return
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=browser, args=["--no-sandbox"])
        tab = launched.new_page()
        started = time.perf_counter()
        tab.goto("file://" + path)
        tab.wait_for_selector("#tasks tbody tr")
        opened = time.perf_counter() - started
        launched.close()
    print(f"  opened in Chromium, first rows drawn: {opened:.2f} s")


def answered_from(answers: List[bytes]) -> None:
    """From now on each chat request of this process is answered with the next of `answers` (the bytes
    the scripted server sent), and nothing else is asked of the network (a local server's window: 404)."""
    import urllib3
    import requests.adapters
    left = iter(answers)

    def answer(adapter, request, **_: object) -> requests.Response:
        chat = request.url.endswith("/chat/completions")
        raw = urllib3.HTTPResponse(body=io.BytesIO(next(left) if chat else b"{}"), status=200 if chat else 404,
                                   headers={"Content-Type": "text/event-stream" if chat else "application/json"},
                                   preload_content=False)
        return adapter.build_response(request, raw)
    requests.adapters.HTTPAdapter.send = answer


def recorded(server: ScriptedServer, bodies: List[dict]) -> List[bytes]:
    """What the scripted server sends for these bodies, played again from its first reply."""
    server.restart()
    with requests.Session() as session:
        return [session.post(server.url + "/chat/completions", json=body).content for body in bodies]


def post_all(url: str, bodies: List[dict]) -> None:
    with requests.Session() as session:
        for body in bodies:
            session.post(url + "/chat/completions", json=body).content


def replayed(tasks: int, bare: bool) -> None:
    """`tasks` two-round tasks with no network: each request is answered from the bytes the scripted
    server sent for it, so that only the work of this process is counted (--instructions runs it under
    callgrind). bare: the same requests, posted by a bare requests loop."""
    with ScriptedServer([], screen=two_rounds) as server:
        _, _, bodies = batch_run(server, 1, 1)
        answers = recorded(server, bodies[0])
    answered_from(answers * tasks)
    os.environ["LLM_API_URL"] = server.url
    if bare:
        post_all(server.url, bodies[0] * tasks)
        return
    folder, said = tempfile.mkdtemp(), io.StringIO()
    with contextlib.redirect_stdout(said):
        cli_main(["--batch", task_file(folder, tasks), "--parallel", "1", "--out", os.path.join(folder, "out"), "-q",
                  "--json"])
    assert json.loads(said.getvalue())["status_counts"] == {"finished": tasks}  # as the server's tasks went


ROUNDS_COUNTED = 60, 180  # a long run's rounds 61 to 180, over which it is compacted four times


def replayed_rounds(rounds: int, think: int, max_context: int, bare: bool) -> None:
    """The first `rounds` rounds of a long run with no network, as replayed() does for a batch; bare:
    their bodies posted by a bare requests loop. The run recorded is as long whatever `rounds` is, so
    that recording it counts alike at every length."""
    with ScriptedServer(long_run_replies(ROUNDS_COUNTED[1], think)) as server:
        _, _, bodies, _ = harness_run(server, ROUNDS_COUNTED[1], max_context)
        answers = recorded(server, bodies)
    answered_from(answers[:rounds])
    if bare:
        post_all(server.url, bodies[:rounds])
        return
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        cli_main(["--quiet", "--json", "--max-rounds", str(rounds), "--max-context", str(max_context), "add up"])
    assert json.loads(said.getvalue())["rounds"] == rounds, said.getvalue()[:300]  # as the server's run went


def instructions_each(replay: List[str], few: int, more: int) -> float:
    """Instructions each task or round of a replay takes, counted by callgrind: the difference between
    `more` of them and `few`, so that start-up counts for nothing."""
    counted = []
    for units in (few, more):
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
                   *replay, str(units)]
        run = subprocess.run(command, capture_output=True, text=True, check=True)
        counted.append(int(re.search(r"Collected : (\d+)", run.stderr).group(1)))
    return (counted[1] - counted[0]) / (more - few)


def instruction_figures(think: int, max_context: int) -> None:
    """A batch task's instructions and a long run's per round, each next to the bare loop's."""
    harness, bare = (instructions_each([*flags, "--replay"], 20, 60) for flags in ([], ["--bare"]))
    print(f"instructions a two-round batch task, no network: {harness / 1e6:.2f} M ({harness / bare:.2f}x a bare"
          f" requests loop making the same 2 requests: {bare / 1e6:.2f} M)")
    for chars in (think, 0):
        flags = ["--think", str(chars), "--max-context", str(max_context)]
        harness, bare = (instructions_each([*flags, *extra, "--replay-rounds"], *ROUNDS_COUNTED)
                         for extra in ([], ["--bare"]))
        print(f"instructions a round of a long run, {chars}-char think blocks, no network: {harness / 1e6:.2f} M"
              f" ({harness / bare:.2f}x a bare requests loop posting the same bodies: {bare / 1e6:.2f} M)")


def median_seconds(command: list, times: int = 7) -> float:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def suite_figures() -> None:
    """The test suite's wall time as `pytest` runs it (the README's command) and the fast loop's, from the
    project's folder, with the load average before each: a figure of a busy machine says so."""
    for name, extra in (("the whole suite", []), ("the fast loop", ["-m", "not processes"])):
        load = " ".join(f"{value:.2f}" for value in os.getloadavg())
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", *extra], cwd=HERE.parent, capture_output=True,
                              text=True)
        seconds = time.perf_counter() - started
        said = (done.stdout.strip().splitlines() or ["(nothing said)"])[-1]
        print(f"{name}: {seconds:.1f} s on {os.cpu_count()} cores, load average {load} at its start: {said}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--think", type=int, default=2000, help="characters of think block per reply")
    parser.add_argument("--max-context", type=int, default=24000)
    parser.add_argument("--batch", type=int, nargs=2, default=[1000, 10000], metavar=("TASKS", "LARGE"),
                        help="batch figures: time per task at TASKS tasks, memory at TASKS and at LARGE")
    parser.add_argument("--only-batch", action="store_true", help="only the batch figures")
    parser.add_argument("--instructions", action="store_true",
                        help="only the instructions a batch task and a long run's round take against the bare loop's,"
                             " counted by callgrind with no network: the same on a busy machine as on an idle one"
                             " (needs valgrind)")
    parser.add_argument("--suite", action="store_true", help="only the test suite's time, whole and the fast loop"
                        " (-m 'not processes'), each run once, with the load average beside it")
    parser.add_argument("--scorer-cost", type=int, metavar="TASKS", help="only what a Python scorer (--scorer)"
                        " costs a batch of TASKS tasks, against the same batch without")
    parser.add_argument("--page", type=int, metavar="TASKS", help="only the report page of two configurations of"
                        " TASKS tasks: its size, and how long Chromium takes to open it")
    parser.add_argument("--replay", type=int, metavar="TASKS", help=argparse.SUPPRESS)  # what --instructions counts
    parser.add_argument("--replay-rounds", type=int, metavar="ROUNDS", help=argparse.SUPPRESS)  # and this
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.suite:
        suite_figures()
        return
    for name in [name for name in os.environ if name.startswith(("LLM_", "AGENT_"))]:
        del os.environ[name]
    os.chdir(tempfile.mkdtemp())  # no .env of the developer's
    os.environ["AGENT_DEMO_LOG_DIR"] = os.path.join(os.getcwd(), "runs")  # logged as by default, not in your home

    os.environ["LLM_API_KEY"] = "sk-benchmark"
    if args.replay:
        replayed(args.replay, args.bare)
        return
    if args.replay_rounds:
        replayed_rounds(args.replay_rounds, args.think, args.max_context, args.bare)
        return
    if args.instructions:
        instruction_figures(args.think, args.max_context)
        return
    if args.page:
        page_figures(args.page)
        return
    if args.scorer_cost:
        scorer_figures(args.scorer_cost, 8)
        return
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}"
          " (1, 5, 15 min) at the start")
    batch_figures(args.batch[0], 8, args.batch[1])
    if args.only_batch:
        return
    # The first length also without think blocks: what reading long replies costs, apart.
    for rounds, think in [(args.rounds[0], args.think), (args.rounds[0], 0), *((n, args.think) for n in args.rounds[1:])]:
        run = measure(rounds, think, args.max_context)
        print(f"long run: {run['rounds']} rounds, status {run['status']}, {think}-char think block per reply,"
              f" --max-context {args.max_context:,}")
        print(f"  prefix reused               {run['reuse']:.3f} (common prefix with the previous request)")
        print(f"  requests that broke it      {run['broken']} (kept less than half of the previous one)")
        print(f"  request size                round 1 {run['first']:,}, last {run['last']:,},"
              f" largest {run['largest']:,} chars")
        print(f"  harness time per round      {run['harness_cpu']:.2f} ms CPU ({run['harness_cpu'] / run['bare_cpu']:.2f}x"
              f" a bare requests loop posting the same bodies: {run['bare_cpu']:.2f} ms)")
        print(f"    the same, wall clock      {run['harness_wall']:.2f} ms ({run['harness_wall'] / run['bare_wall']:.2f}x"
              f" {run['bare_wall']:.2f} ms)")
        print(f"  TCP connections per run     {run['connections']}")
    hostile_figures()
    # Start-up: the three commands take turns, so the machine's other jobs weigh on each alike.
    commands = {"version": [*CLI, "--version"], "help": [*CLI, "--help"], "pass": [sys.executable, "-c", "pass"],
                "imports": [sys.executable, "-c", "import requests, dotenv"]}
    samples = {name: [] for name in commands}
    for _ in range(9):
        for name, command in commands.items():
            samples[name].append(median_seconds(command, times=1))
    version_s, help_s, bare_s, imports_s = (statistics.median(samples[name]) for name in commands)
    print("start-up (median of 9, taking turns):")
    print(f"  agent-demo --version        {version_s * 1000:.0f} ms  ({version_s / imports_s:.2f}x importing"
          " requests and dotenv)")
    print(f"  agent-demo --help           {help_s * 1000:.0f} ms  ({help_s / imports_s:.2f}x)")
    print(f"  python -c pass              {bare_s * 1000:.0f} ms")
    print(f"  import requests, dotenv     {imports_s * 1000:.0f} ms")
    print(f"machine: load average {' '.join(f'{load:.2f}' for load in os.getloadavg())} (1, 5, 15 min) at the end")


if __name__ == "__main__":
    main()
