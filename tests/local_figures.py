"""Measure the three modes against a real local endpoint (not a test: never run in CI).

    LLM_API_URL=http://127.0.0.1:8765/v1 LLM_MODEL=smollm2 python tests/local_figures.py [--runs 3]
        [--modes json,schema,tools] [--max-rounds 6] [--timeout 180] [--traces DIR] [-- extra CLI flags]

Runs the CLI --runs times per mode on the task below, each with a trace file, and prints per mode:
the share of rounds whose reply became actions (no format error), the share whose calls were all
valid too (a known tool, arguments that fit its schema), how many runs finished and how many of
those with the right answer (1536 and 待支付), how the runs ended, the schema variants the runs
settled on, and the longest reply in tokens. docs/modes.md, "Local servers", has the figures it gave.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, str(Path(__file__).resolve().parent.parent / "agent_demo.py")]
TASK = "Compute (12 + 500) * 3, then check the status of order A1002."
INVALID = ("bad arguments for", "unknown tool")


def read_trace(path: Path) -> list:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    return records


def refused_as_invalid(call: dict) -> bool:
    """A call to an unknown tool, or with arguments that do not fit the tool's schema."""
    return not call["result"].get("ok") and str(call["result"].get("error", "")).startswith(INVALID)


def judge(records: list) -> dict:
    """One run's figures from its trace."""
    rounds = [r for r in records if r.get("event") == "round"]
    parsed = [r for r in rounds if r["calls"] and not any(c.get("format_error") for c in r["calls"])]
    valid = [r for r in parsed if not any(refused_as_invalid(call) for call in r["calls"])]
    end = next((r for r in reversed(records) if r.get("event") == "end"), {})
    variants = [r.get("to_variant") or r.get("to_mode") for r in records if r.get("event") == "fallback"]
    result = str(end.get("result"))
    return {"rounds": len(rounds), "parsed": len(parsed), "valid": len(valid), "status": end.get("status"),
            "right": end.get("status") == "finished" and "1536" in result and "待支付" in result,
            "settled_on": variants[-1] if variants else None,
            "longest_reply": max((r.get("usage", {}).get("completion_tokens") or 0 for r in rounds), default=0)}


def measure(mode: str, runs: int, args: argparse.Namespace, folder: Path) -> list:
    results = []
    for number in range(1, runs + 1):
        trace = folder / f"{mode}-{number}.jsonl"
        started = time.monotonic()
        subprocess.run([*CLI, "--mode", mode, "--max-rounds", str(args.max_rounds), "--timeout", str(args.timeout),
                        "--trace", str(trace), "--quiet", *args.extra, TASK],
                       capture_output=True, text=True, timeout=3600)
        figures = judge(read_trace(trace))
        figures["seconds"] = round(time.monotonic() - started)
        print(f"  {mode} run {number}: {json.dumps(figures, ensure_ascii=False)}", flush=True)
        results.append(figures)
    return results


def summary(mode: str, results: list) -> str:
    rounds = sum(r["rounds"] for r in results)

    def share(key: str) -> str:
        count = sum(r[key] for r in results)
        return f"{count}/{rounds} ({100 * count / max(rounds, 1):.0f}%)"
    finished = sum(r["status"] == "finished" for r in results)
    endings = collections.Counter(r["status"] for r in results)
    settled = collections.Counter(r["settled_on"] or "(first form)" for r in results)
    return (f"{mode:6}  rounds with actions {share('parsed')}, all calls valid {share('valid')};"
            f" finished {finished}/{len(results)} (right answer {sum(r['right'] for r in results)});"
            f" endings {dict(endings)}; settled on {dict(settled)};"
            f" longest reply {max(r['longest_reply'] for r in results)} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="json,schema,tools")
    parser.add_argument("--max-rounds", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--traces", help="keep the trace files in this folder")
    parser.add_argument("extra", nargs="*", help="more CLI flags, after --")
    args = parser.parse_args()
    if not os.environ.get("LLM_API_URL"):
        sys.exit("set LLM_API_URL (and LLM_MODEL) to the local endpoint first")
    folder = Path(args.traces or tempfile.mkdtemp(prefix="agent-demo-figures-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"task: {TASK}\nendpoint: {os.environ['LLM_API_URL']} ({os.environ.get('LLM_MODEL', '')}),"
          f" {args.runs} runs per mode, --max-rounds {args.max_rounds}, traces in {folder}", flush=True)
    lines = [summary(mode, measure(mode, args.runs, args, folder)) for mode in args.modes.split(",")]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
