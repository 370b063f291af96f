"""The README's Layout is the import order: each module imports only from the ones above it."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def layout():
    """The modules the README lists, top to bottom, as module names."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    paths = re.findall(r"^- `([\w/]+\.py)`", section, re.M)
    return [path[:-3].replace("/", ".") for path in paths]


def imported(module):
    """Every project module the file imports, at its top or inside a function (not when it runs as a
    script: python agent_demo.py starts the command line)."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8"))
    tree.body = [node for node in tree.body if not (isinstance(node, ast.If) and "__main__" in ast.dump(node.test))]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_each_module_imports_only_from_the_ones_above_it_in_the_readme():
    order = layout()
    assert "agent_demo_kit.batch" in order and "agent_demo_kit.escalation" in order
    for position, module in enumerate(order):
        below = set(order[position + 1:])
        assert not imported(module) & below, f"{module} imports {sorted(imported(module) & below)}"
