"""Figures for --tools-file tools (not a test: run it by hand; docs/tools.md has what it gave).

    python tests/tool_figures.py cost [--calls 2000]
    python tests/tool_figures.py kills [--rounds 800] [--kills 30] [--seed 1]

cost: what one call of a user tool costs, run in the worker process, next to a built-in tool
called in-process; and what starting the worker (a new interpreter importing the file) costs.

kills: one run whose only tool has side effects (it appends its number to a file), killed with
kill -9 at random moments, each time followed by --resume, until it has made --rounds calls. The
scripted model always asks for the number after the last one it heard about, so a redone round
asks again for the call that was cut short. Prints the calls made, the side effects that
happened, any that happened twice, and how often the model was told an outcome is unknown.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from scripted_server import ScriptedServer, action  # noqa: E402

CLI = [sys.executable, str(ROOT / "agent_demo.py")]
SHOUT = 'def shout(text: str) -> str:\n    """Shout."""\n    return text.upper()\n'
APPEND = '''
from agent_demo_kit.tools import tool


@tool(side_effects=True)
def append_line(n: int) -> str:
    """Append n to effects.txt."""
    with open("effects.txt", "a") as effects:
        effects.write(f"{n}\\n")
    return f"appended {n}"
'''


def cost(calls: int) -> None:
    from agent_demo_kit.tools_worker import ToolWorker
    from agent_demo_kit.tools import REGISTRY, call_tool
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "shout.py"
        path.write_text(SHOUT)
        starts, per_call, built_in = [], [], []
        for _ in range(5):
            worker = ToolWorker(60.0)
            began = time.perf_counter()
            registry = {**REGISTRY, **worker.load(str(path))}
            starts.append(time.perf_counter() - began)
            for sample, name, args in ((per_call, "shout", {"text": "hi"}), (built_in, "calculator",
                                                                            {"expression": "12 + 500"})):
                began = time.perf_counter()
                for _ in range(calls):
                    call_tool(name, args, registry)
                sample.append((time.perf_counter() - began) / calls)
            worker.stop()
    print(f"a user tool's call, in the worker  {statistics.median(per_call) * 1e3:.3f} ms (median of 5 x {calls})")
    print(f"a built-in tool's call, in-process {statistics.median(built_in) * 1e3:.3f} ms")
    print(f"starting the worker, file imported {statistics.median(starts) * 1e3:.0f} ms (once a run, and after a"
          " call that hung or ended it)")


def next_call(body: dict) -> str:
    """The scripted model: the number after the last one it was told about (a call it cannot be
    sure of is not asked again), or finish once all are done."""
    if not isinstance(body, dict):  # a request cut by kill -9
        return None
    told = [int(n) for message in body["messages"] if message["role"] == "user"
            for n in re.findall(r'"tool": "append_line", "args": \{"n": (\d+)\}', message["content"])]
    done = max(told, default=0)
    return action("append_line", n=done + 1) if done < next_call.rounds else action("finish", result="done")


def kills(rounds: int, times: int, seed: int) -> None:
    random.seed(seed)
    next_call.rounds = rounds
    with ScriptedServer([], screen=next_call) as server:
        folder = Path(tempfile.mkdtemp(prefix="tool-figures-"))
        (folder / "append.py").write_text(APPEND)
        trace = folder / "run.jsonl"
        env = {**os.environ, "LLM_API_URL": server.url, "AGENT_MAX_CONTEXT": "8000"}
        first = [*CLI, "--tools-file", "append.py", "--trace", str(trace), "--yes", "--max-rounds", str(rounds * 2),
                 "--quiet", "append the numbers"]
        command, killed = first, 0
        while True:
            size = trace.stat().st_size if trace.exists() else 0
            process = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True)
            while killed < times and process.poll() is None and (trace.stat().st_size if trace.exists() else 0) <= size:
                time.sleep(0.005)  # until it has resumed: a kill while it starts up proves nothing
            if killed < times and process.poll() is None:
                time.sleep(random.uniform(0, 0.3))
                process.send_signal(signal.SIGKILL)
                killed += 1
            err = process.communicate()[1]
            if process.returncode == 0 or "already ended with status 'finished'" in err:  # killed before its end
                break
            if process.returncode != -signal.SIGKILL:
                sys.exit(f"the run ended with exit code {process.returncode}: {err.strip()}\n(trace: {trace})")
            command = [*CLI, "--resume", str(trace), "--yes", "--quiet"] if trace.exists() else first
        effects = (folder / "effects.txt").read_text().split()
        records = [json.loads(line) for line in trace.read_text().splitlines() if line.startswith("{")]
        shutil.rmtree(folder)  # kept when the run went wrong, to be looked at
    calls = [call for r in records if r["event"] == "round" for call in r["calls"] if call["tool"] == "append_line"]
    unknown = [call for call in calls if str(call["result"].get("error", "")).startswith("outcome unknown")]
    twice = sorted({n for n in effects if effects.count(n) > 1})
    never = [call["args"]["n"] for call in unknown if str(call["args"]["n"]) not in effects]
    print(f"kill -9 {killed} times during a run of {rounds} calls with side effects, each followed by --resume:")
    print(f"  side effects that happened     {len(effects)} ({len(set(effects))} distinct)")
    print(f"  happened twice                 {len(twice)} {twice or ''}")
    print(f"  redone calls not run again     {len(unknown)} (the model was told the outcome is unknown;"
          f" {len(never)} of them had not happened)")
    print(f"  notes telling the user         {sum(1 for r in records if r['event'] == 'note')}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["cost", "kills"])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=800)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    cost(options.calls) if options.figure == "cost" else kills(options.rounds, options.kills, options.seed)
