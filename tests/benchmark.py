"""Benchmark the harness against a zero-latency scripted server on loopback (not a test).

    python tests/benchmark.py [--rounds 200] [--think 2000]

Prints: harness time per round over a long run, request size at round 1 and at
the last round (replies carry long think blocks), TCP connections per run, and
start-up time of --help next to a bare interpreter. Compare figures as ratios
within one run: the machines are shared and noisy.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from scripted_server import ScriptedServer, action  # noqa: E402

CLI = [sys.executable, str(HERE.parent / "agent_demo.py")]


def long_run_replies(rounds: int, think: int) -> list:
    """Distinct calculator calls, each after a long think block, then finish."""
    thought = "<think>" + ("I should add the next number. " * (think // 30 + 1))[:think] + "</think>\n"
    calls = [thought + action("calculator", expression=f"{n} + 1") for n in range(rounds - 1)]
    return calls + [thought + action("finish", result="done")]


def timed_run(replies: list, rounds: int) -> tuple:
    """Run the CLI against a fresh scripted server; return (seconds, outcome, server)."""
    with ScriptedServer(replies) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "AGENT_"))}
        env["LLM_API_URL"] = server.url
        started = time.perf_counter()
        finished = subprocess.run([*CLI, "--quiet", "--json", "--max-rounds", str(rounds), "add up"],
                                  env=env, capture_output=True, text=True, timeout=600)
        return time.perf_counter() - started, json.loads(finished.stdout), server


def measure_long_run(rounds: int, think: int) -> dict:
    one_round_s = statistics.median(timed_run(long_run_replies(1, think), 1)[0] for _ in range(5))
    wall, outcome, server = timed_run(long_run_replies(rounds, think), rounds)
    sizes = [len(json.dumps(request["body"])) for request in server.requests]
    # Start-up and the first round cost the same in both runs: the difference is the rounds' own time.
    per_round_ms = (wall - one_round_s) / (outcome["rounds"] - 1) * 1000
    return {"status": outcome["status"], "rounds": outcome["rounds"], "wall_s": wall, "one_round_s": one_round_s,
            "per_round_ms": per_round_ms, "first_request_chars": sizes[0],
            "last_request_chars": sizes[-1], "largest_request_chars": max(sizes),
            "connections": server.connections}


def median_seconds(command: list, times: int = 7) -> float:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--think", type=int, default=2000, help="characters of think block per reply")
    args = parser.parse_args()

    run = measure_long_run(args.rounds, args.think)
    help_s = median_seconds([*CLI, "--help"])
    bare_s = median_seconds([sys.executable, "-c", "pass"])
    imports_s = median_seconds([sys.executable, "-c", "import requests, dotenv"])

    print(f"long run: {run['rounds']} rounds, status {run['status']}, {args.think}-char think block per reply")
    print(f"  harness time per round      {run['per_round_ms']:.2f} ms (wall {run['wall_s']:.2f} s, minus a"
          f" 1-round run's {run['one_round_s']:.2f} s of start-up; the server answers at once)")
    print(f"  request size, round 1       {run['first_request_chars']:,} chars")
    print(f"  request size, round {run['rounds']:<8} {run['last_request_chars']:,} chars "
          f"({run['last_request_chars'] / run['first_request_chars']:.1f}x round 1; largest {run['largest_request_chars']:,})")
    print(f"  TCP connections per run     {run['connections']}")
    print("start-up (median of 7):")
    print(f"  agent-demo --help           {help_s * 1000:.0f} ms")
    print(f"  python -c pass              {bare_s * 1000:.0f} ms  (--help is {help_s / bare_s:.1f}x)")
    print(f"  import requests, dotenv     {imports_s * 1000:.0f} ms  (--help is {help_s / imports_s:.1f}x)")


if __name__ == "__main__":
    main()
