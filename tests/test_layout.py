"""The structure holds: a core that does one run and imports no layer, layers that import the core
(and only the layers they say they use), no cycle, lazy imports included; a plain run loads the
core and nothing else (tests/loaded_modules.py counts it); the README's Layout lists every module
once, core and layers apart; each module says its one job first; the Agent is made whole; the trace
format has one owner."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_environment

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted([*ROOT.glob("*.py"), *(ROOT / "agent_demo_kit").glob("*.py")])
IN_THE_PACKAGE = ("tools", "prompts")  # beside agent_demo.py in the repository, installed in the package

# The core does one run: the loop and what a round needs, the seam it reports to, setting a run up.
# Some of it loads only when used (aio and request_gate for arun(), schemas for a schema).
CORE = {"agent_demo_kit", "agent_demo_kit.limits", "agent_demo_kit.records", "agent_demo_kit.endings",
        "agent_demo_kit.urls", "agent_demo_kit.private_files", "agent_demo_kit.settings",
        "agent_demo_kit.environment", "agent_demo_kit.prompts", "agent_demo_kit.tools",
        "agent_demo_kit.lenient_json", "agent_demo_kit.actions", "agent_demo_kit.schemas",
        "agent_demo_kit.request_gate", "agent_demo_kit.endpoint_errors", "agent_demo_kit.replies",
        "agent_demo_kit.windows", "agent_demo_kit.client", "agent_demo_kit.conversation", "agent_demo_kit.watchdog",
        "agent_demo_kit.outcome", "agent_demo_kit.seam", "agent_demo_kit.events", "agent_demo_kit.redaction",
        "agent_demo_kit.terminal", "agent_demo_kit.screen_trace", "agent_demo_kit.setup", "agent_demo",
        "agent_demo_kit.aio"}
COMMAND_LINE = {"agent_demo_kit.commands", "agent_demo_kit.side_commands", "agent_demo_kit.cli"}  # on top
LAYERS = {
    "run log": {"agent_demo_kit.seals", "agent_demo_kit.trace_file", "agent_demo_kit.run_log", "agent_demo_kit.resume"},
    "checks": {"agent_demo_kit.checks", "agent_demo_kit.output_types"},
    "escalation": {"agent_demo_kit.escalation"},
    "approval": {"agent_demo_kit.approval"},
    "tool sources": {"agent_demo_kit.tools_worker", "agent_demo_kit.mcp_schemas", "agent_demo_kit.mcp_client"},
    "telemetry": {"agent_demo_kit.telemetry"},
    "results": {"agent_demo_kit.scoring", "agent_demo_kit.scorers", "agent_demo_kit.judge", "agent_demo_kit.metrics",
                "agent_demo_kit.comparison", "agent_demo_kit.result_tables", "agent_demo_kit.gate",
                "agent_demo_kit.trend",
                "agent_demo_kit.report_page"},
    "batch": {"agent_demo_kit.task_file", "agent_demo_kit.promptfoo", "agent_demo_kit.hf_datasets",
              "agent_demo_kit.batch_folder", "agent_demo_kit.batch_view",
              "agent_demo_kit.planning",
              "agent_demo_kit.batch"},
}
USES = {"results": {"run log"}, "batch": {"results", "run log", "checks"}}  # what a layer uses of another
ATTACH = {"agent_demo_kit.setup", *COMMAND_LINE}  # they attach the layers the settings choose, imported then
LAYER_OF = {module: layer for layer, modules in LAYERS.items() for module in modules}
MOST_PLAIN_RUN_LINES = 7_200  # a plain run of the command line loads 7,152 (0.7.3: 10,554); #44 aims at 4,000


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


ALL = {module_name(path) for path in MODULES}


def listed(section_start, section_end=None):
    """The modules the README's Layout lists between two of its headings, as module names."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    section = section.split(section_start, 1)[1]
    if section_end:
        section = section.split(section_end, 1)[0]
    return [module_name(ROOT / path) for path in re.findall(r"`([\w/]+\.py)`", section)]


def imported(module, lazy=True):
    """Every project module the file imports: at its top, and (lazy) inside a function too; not when it
    runs as a script (python agent_demo.py starts the command line)."""
    tree = ast.parse(source_of(module).read_text(encoding="utf-8"))
    tree.body = [node for node in tree.body if not (isinstance(node, ast.If) and "__main__" in ast.dump(node.test))]
    names = set()
    for node in ast.walk(tree) if lazy else tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return (names & ALL) - {module}


def test_every_module_is_core_a_layer_or_the_command_line_once():
    kinds = [CORE, COMMAND_LINE, *LAYERS.values()]
    assert sorted(module for kind in kinds for module in kind) == sorted(ALL)


def test_no_core_module_imports_a_layer_or_the_command_line():
    for module in CORE:
        top = imported(module, lazy=False)
        assert not top & (set(LAYER_OF) | COMMAND_LINE), f"{module} imports {sorted(top - CORE)}"
        if module not in ATTACH:  # setup.py attaches a layer the settings choose, importing it then
            assert imported(module) <= CORE, f"{module} imports {sorted(imported(module) - CORE)}"


def test_the_command_line_imports_a_layer_only_when_a_command_needs_it():
    for module in COMMAND_LINE:
        assert not imported(module, lazy=False) & set(LAYER_OF), module


def test_a_layer_imports_the_core_and_only_the_layers_it_uses():
    for module, layer in LAYER_OF.items():
        allowed = CORE | {each for name in (layer, *USES.get(layer, ())) for each in LAYERS[name]}
        assert imported(module) <= allowed, f"{module} ({layer}) imports {sorted(imported(module) - allowed)}"


def test_there_is_no_cycle_lazy_imports_included():
    graph = {module: imported(module) for module in ALL}
    done, path = set(), []

    def visit(module):
        if module in path:
            raise AssertionError("a cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if module not in done:
            path.append(module)
            for each in sorted(graph[module]):
                visit(each)
            path.pop()
            done.add(module)
    for module in sorted(graph):
        visit(module)


def test_a_cycle_would_be_found(monkeypatch):
    monkeypatch.setitem(globals(), "imported", lambda module, lazy=True: {"agent_demo"} if module ==
                        "agent_demo_kit.records" else {"agent_demo_kit.records"} if module == "agent_demo" else set())
    with pytest.raises(AssertionError, match="a cycle"):
        test_there_is_no_cycle_lazy_imports_included()


def test_the_readme_lists_every_module_once_the_core_apart_from_the_layers():
    core, layers = listed("### The core", "### The layers"), listed("### The layers")
    assert sorted(core + layers) == sorted(ALL) and len(core + layers) == len(set(core + layers))
    assert set(core) == CORE | COMMAND_LINE


def test_the_readme_is_short_enough_to_read_through():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md: {len(lines)} lines; the details belong in docs/"


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_module_says_its_one_job_first(path):
    assert ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))), f"{path.name} says nothing of its job first"


def test_the_loop_reads_in_one_file_of_at_most_400_lines_the_agent_first():
    text = (ROOT / "agent_demo.py").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    assert text.index("class Agent") < text.index("def run(task")


def loaded(serve, how, *arguments, env=None):
    """The project's modules a two-round run loads, with their lines."""
    serve(["{\"tool\": \"calculator\", \"args\": {\"expression\": \"2 + 3\"}}",
           "{\"tool\": \"finish\", \"args\": {\"result\": \"5\"}}"], key=None)
    done = subprocess.run([sys.executable, str(ROOT / "tests/loaded_modules.py"), how, *arguments],
                          capture_output=True, text=True, env=child_environment(env), timeout=60)
    assert done.returncode == 0 and done.stdout.split()[0] in ("5", "finished"), done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.processes
@pytest.mark.parametrize("how, arguments", [("cli", ("--no-log", "compute 2 + 3")), ("api", ("compute 2 + 3",))])
def test_a_plain_run_loads_the_core_and_no_layer(serve, how, arguments):
    modules = loaded(serve, how, *arguments)
    said = ", ".join(f"{name} {lines}" for name, lines in sorted(modules.items(), key=lambda item: -item[1]))
    assert not set(modules) & set(LAYER_OF), said
    assert sum(modules.values()) <= MOST_PLAIN_RUN_LINES, f"{sum(modules.values()):,} lines: {said}"


@pytest.mark.processes
def test_a_run_the_command_line_records_loads_only_the_run_log_besides_the_core(serve):
    modules = loaded(serve, "cli", "compute 2 + 3")
    assert {LAYER_OF[module] for module in modules if module in LAYER_OF} == {"run log"}, sorted(modules)


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
