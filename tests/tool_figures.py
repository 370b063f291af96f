"""Figures for --tools-file tools (not a test: run it by hand; docs/tools.md has what it gave).

    python tests/tool_figures.py cost [--calls 2000]

cost: what one call of a user tool costs, run in the worker process, next to a built-in tool
called in-process; and what starting the worker (a new interpreter importing the file) costs.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

SHOUT = 'def shout(text: str) -> str:\n    """Shout."""\n    return text.upper()\n'
def cost(calls: int) -> None:
    from agent_demo_kit.tools_file import ToolWorker
    from tools import REGISTRY, call_tool
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["cost"])
    parser.add_argument("--calls", type=int, default=2000)
    options = parser.parse_args()
    cost(options.calls)
