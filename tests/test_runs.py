"""The run log from a shell: --runs, naming a run, what --json says about it, --continue."""
import json
import time
from pathlib import Path

import pytest

from conftest import start_cli


def run_folder(tmp_path):
    """The run log folder of this test (under the state home conftest sets)."""
    return tmp_path / "state" / "agent-demo" / "runs"


def write_runs(folder, count, status="finished", task="compute something"):
    """count recorded runs, one a minute, the newest last; their paths, oldest first."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in range(count):
        started = time.time() - 60 * (count - n)
        path = folder / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}-{n:06x}.jsonl"
        path.write_text("\n".join(json.dumps(record) for record in [
            {"event": "start", "task": f"{task} {n}", "ts": started},
            {"event": "end", "status": status, "rounds": 1, "usage": {"total_tokens": 15}}]) + "\n")
        paths.append(path)
    return paths


# --- output closed early --------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--runs", "--help", "--version"])
def test_a_reader_that_goes_away_at_once_costs_no_traceback(tmp_path, flag):
    write_runs(run_folder(tmp_path), 30)
    process = start_cli(flag)
    process.stdout.close()  # before the child has written a line: its writes meet a closed pipe
    err = process.stderr.read()
    process.wait(timeout=30)
    assert (process.returncode, err) == (0, "")


def test_runs_into_head_gives_the_first_line_and_no_traceback(tmp_path):
    write_runs(run_folder(tmp_path), 30)
    for _ in range(3):
        process = start_cli("--runs", shell_tail="| head -1")
        out, err = process.communicate(timeout=30)
        assert (len(out.splitlines()), err) == (1, "")
