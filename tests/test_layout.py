"""The structure holds: the README's Layout is the import order (each module imports only from the
ones above it, so there is no cycle, lazy imports included), every module is listed, none passes 500
lines, each says its one job first; the Agent is made whole; the trace format has one owner."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted([*ROOT.glob("*.py"), *(ROOT / "agent_demo_kit").glob("*.py")])
MOST_LINES = 500


IN_THE_PACKAGE = ("tools", "prompts")  # beside agent_demo.py in the repository, installed in the package


def module_name(path):
    relative = path.relative_to(ROOT).with_suffix("")
    if relative.name in IN_THE_PACKAGE and len(relative.parts) == 1:
        return f"agent_demo_kit.{relative.name}"
    return ".".join(relative.parts).replace(".__init__", "")


def source_of(module):
    if module == "agent_demo_kit":
        return ROOT / "agent_demo_kit/__init__.py"
    if module.split(".")[-1] in IN_THE_PACKAGE:
        return ROOT / (module.split(".")[-1] + ".py")
    return ROOT / (module.replace(".", "/") + ".py")


def layout():
    """The modules the README lists, top to bottom, as module names."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    paths = re.findall(r"^- `([\w/]+\.py)`", section, re.M)
    return [module_name(ROOT / path) for path in paths]


def imported(module):
    """Every project module the file imports, at its top or inside a function (not when it runs as a
    script: python agent_demo.py starts the command line)."""
    tree = ast.parse(source_of(module).read_text(encoding="utf-8"))
    tree.body = [node for node in tree.body if not (isinstance(node, ast.If) and "__main__" in ast.dump(node.test))]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names - {module}


def test_each_module_imports_only_from_the_ones_above_it_in_the_readme():
    order = layout()
    for position, module in enumerate(order):
        below = set(order[position + 1:])
        assert not imported(module) & below, f"{module} imports {sorted(imported(module) & below)}"


def test_the_readme_lists_every_module_once():
    listed = layout()
    assert sorted(listed) == sorted(module_name(path) for path in MODULES)
    assert len(listed) == len(set(listed))


def test_the_readme_is_short_enough_to_read_through():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md: {len(lines)} lines; the details belong in docs/"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_module_is_one_job_named_first_in_at_most_500_lines(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MOST_LINES, f"{path.name}: {len(text.splitlines())} lines"
    assert ast.get_docstring(ast.parse(text)), f"{path.name} says nothing of its job first"


def assignments_to_an_agent(tree):
    """Where code assigns an attribute of an agent that is not itself (`agent.x = ...`, `job.agent.x = ...`)."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for each in ast.walk(target):
                if isinstance(each, ast.Attribute):
                    chain, base = [], each.value
                    while isinstance(base, ast.Attribute):
                        chain.append(base.attr)
                        base = base.value
                    if isinstance(base, ast.Name):
                        chain.append(base.id)
                    if "agent" in chain:
                        found.append(f"line {node.lineno}: {ast.unparse(target)}")
    return found


def test_nothing_outside_the_agent_sets_its_attributes():
    for path in MODULES:
        assert assignments_to_an_agent(ast.parse(path.read_text(encoding="utf-8"))) == [], path.name


def test_an_agent_assigned_from_outside_would_be_found():
    assert assignments_to_an_agent(ast.parse("job.agent.stop = event\nagent.on_round = f\nself.x = 1\n")) == [
        "line 1: job.agent.stop", "line 2: agent.on_round"]


def test_one_module_owns_the_trace_format():
    """No module but trace_file.py names a record's event or parses a trace line."""
    for path in MODULES:
        if path.name == "trace_file.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
        assert "event" not in constants and not any(isinstance(value, bytes) and b'"event"' in value
                                                    for value in constants), path.name
