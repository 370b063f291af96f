"""Which of the project's modules a run loads, and their lines: for the layout test and the benchmark.

python tests/loaded_modules.py cli ARGS...   runs `python agent_demo.py ARGS` in this process
python tests/loaded_modules.py api TASK      runs agent_demo.run(TASK) (settings from the environment)
Either way the last line on stdout is a JSON object: {"module": lines, ...} of every project module
loaded when the process exits.
"""
import atexit
import json
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def project_modules() -> dict:
    """Each loaded module whose file is the project's (not a test's), with its lines."""
    loaded = {}
    for name, module in list(sys.modules.items()):
        path = Path(os.path.realpath(getattr(module, "__file__", None) or "/"))
        if ROOT in path.parents and path.suffix == ".py" and "tests" not in path.relative_to(ROOT).parts:
            loaded[name] = len(path.read_text(encoding="utf-8").splitlines())
    loaded.setdefault("agent_demo", loaded.pop("__main__", 0) or loaded.get("agent_demo", 0))
    return loaded


def main() -> None:
    how, arguments = sys.argv[1], sys.argv[2:]
    sys.path.insert(0, str(ROOT))
    atexit.register(lambda: print("\n" + json.dumps(project_modules()), flush=True))
    if how == "cli":
        sys.argv = [str(ROOT / "agent_demo.py"), *arguments]
        runpy.run_path(str(ROOT / "agent_demo.py"), run_name="__main__")
    else:
        import agent_demo
        print(agent_demo.run(" ".join(arguments)).status)


if __name__ == "__main__":
    main()
