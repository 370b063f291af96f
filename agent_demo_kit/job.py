"""A run made ready before it starts: its settings, its tools (built in, from --tools-file, from MCP
servers), its task (with what was piped in), and its trace, open and locked. A new run, or a
recorded run taken up again, appending to its own trace file: --resume goes on where it stopped;
--continue gives it the user's follow-up after its last round. Also the command that continues a
run cut short."""
import argparse
import json
import contextlib
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import prompts
from agent_demo_kit import log_folder
from agent_demo_kit.endings import ConfigError, RunResult
from agent_demo_kit.settings import Settings, chat_completions_url, display_url, given, load_settings
from agent_demo_kit.terminal import Redactor, on_terminal
from agent_demo_kit.trace import Call, Round, RunLog, add_follow_up, load_trace
from tools import CONTROL_ACTIONS, REGISTRY, Tool, ToolError, describe, tool


def run_path(args: argparse.Namespace, environment: Dict[str, str]) -> str:
    """The trace file --resume or --continue is about; ConfigError if there is none to take up."""
    continuing = args.continue_run is not None
    flag = "--continue" if continuing else "--resume"
    if args.task and not continuing:
        raise ConfigError("--resume continues the task recorded in the trace; give no task with it")
    named = (args.continue_run if continuing else args.resume) or args.trace  # the run in --trace FILE
    path = log_folder.pick_run(named or "", environment, flag)
    if args.trace and os.path.abspath(args.trace) != os.path.abspath(path) or continuing and args.no_log:
        raise ConfigError(f"{flag} appends to the run's own trace file; --trace cannot name another one,"
                          " nor --no-log keep none")
    if not os.path.lexists(path):
        raise ConfigError(f"cannot read the trace file {path}: no such file")
    return path


def read_run(args: argparse.Namespace, environment: Dict[str, str], recorded: bytes,
             path: str) -> Tuple[dict, List[Round], List[Call]]:
    """What the trace (read through the file this run locked) brings back: its start record (with what
    later records changed), its completed rounds, and the side-effecting calls started after them;
    ConfigError if it cannot go on."""
    continuing = args.continue_run is not None
    try:
        start, rounds, unfinished = load_trace(recorded, path, ended_too=continuing)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if continuing and not rounds:
        raise ConfigError(f"--continue: {path} holds no round to follow up on; run the task again")
    if "***" in str(start.get("url")) and not given("url", args, environment):
        raise ConfigError("the run's URL held a password, which is not recorded: give it again with --url"
                          " or LLM_API_URL")
    return start, rounds, unfinished


def own_settings(start: dict, continuing: bool) -> dict:
    """The recorded settings a run takes up again: all of them, but a follow-up's limits are its own."""
    return {name: value for name, value in start.items()
            if not (continuing and name in ("max_rounds", "max_tokens"))}


def follow_up(settings: Settings, rounds: List[Round], text: str) -> None:
    """--continue: the follow-up becomes the user's next turn after the last round, and the run gets
    --max-rounds more rounds (and --max-tokens more tokens) from where it stands."""
    from agent_demo import total_usage
    settings.max_rounds += len(rounds)
    if settings.max_tokens is not None:
        settings.max_tokens += total_usage(rounds).get("total_tokens", 0)
    add_follow_up(rounds[-1], text)


def resumed_form(settings: Settings, start: dict, rounds: List[Round]) -> Any:
    """The request form a resumed run starts from: what the endpoint took before, for the mode in force."""
    from agent_demo_kit.client import RequestForm
    form = RequestForm(mode=settings.mode, stream=settings.stream and start.get("stream") is not False)
    if settings.mode == start.get("mode") and start.get("schema_variant") in prompts.SCHEMA_VARIANTS:
        form.schema_variant = start["schema_variant"]
    if start.get("reply_cap_field") in ("max_tokens", "max_completion_tokens"):
        form.reply_cap_field = start["reply_cap_field"]
    form.mode_worked = any(record.mode == form.mode for record in rounds)
    return form


def continue_command(trace_path: str, outcome: RunResult, settings: Optional[Settings],
                     args: argparse.Namespace) -> str:
    """The exact command that continues a run cut short: the model and URL given as flags are
    given again (the environment would win over the record), and a limit it reached is doubled,
    or the command would stop again at once."""
    program = sys.argv[0] or ""
    command = "agent-demo"
    if program.endswith(".py"):  # started as python agent_demo.py
        command = f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(program))}"
    command += f" --resume {shlex.quote(os.path.abspath(trace_path))}"
    if settings and args.model:
        command += f" -m {shlex.quote(settings.model)}"
    if settings and args.url and "***" not in display_url(settings.url):
        command += f" --url {shlex.quote(settings.url)}"
    if args.yes:  # never assumed on resume: said again, in the open
        command += " --yes"
    if settings and outcome.status == "max_rounds":
        command += f" --max-rounds {settings.max_rounds * 2}"
    if settings and outcome.status == "budget" and settings.max_tokens:
        command += f" --max-tokens {settings.max_tokens * 2}"
    return command


@dataclass
class Job:
    """A run ready to start: its settings, tools and task, and the rounds already done if it resumes."""

    settings: Settings = field(default_factory=Settings)
    registry: Dict[str, Tool] = field(default_factory=dict)
    task: str = ""
    history: List[Round] = field(default_factory=list)
    trace_path: Optional[str] = None
    form: Any = None  # what the endpoint took when the run was cut short (a resume starts there)
    follow_up: Optional[str] = None  # --continue: the user's next turn after the run's last round
    log: Optional[RunLog] = None  # the screen and the trace file, open (and locked) from the start
    unfinished: List[Call] = field(default_factory=list)  # side-effecting calls started before a crash
    recorded: Optional[dict] = None  # a resumed run's start record
    start_fields: Dict[str, Any] = field(default_factory=dict)  # recorded with the start (the MCP servers)
    notes: List[str] = field(default_factory=list)  # said once the trace is open
    closing: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # the trace, the tools worker, MCP


def build_registry(settings: Settings, names: Optional[str], job: "Job", secrets: List[str]) -> Dict[str, Tool]:
    """The built-in tools, those of each --tools-file (run by a worker process) and of each MCP
    server, cut down to --tools NAME,NAME; ConfigError if a file gives no usable tools, a name
    clashes, a server does not start, or --tools names a tool that does not exist. What they start
    is stopped when the job closes."""
    from agent_demo_kit.tools_file import load_tools_files
    registry = {**REGISTRY, **load_tools_files(settings, secrets, job.closing)}
    if settings.mcp_servers or settings.mcp_config:
        registry.update(start_mcp_servers(settings, registry, job))
    if names is None:
        return registry
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in registry and name not in CONTROL_ACTIONS]
    if unknown:
        raise ConfigError(f"--tools: unknown tool {', '.join(unknown)} (available: {', '.join(registry)})")
    return {name: tool for name, tool in registry.items() if name in wanted}


def start_mcp_servers(settings: Settings, registry: Dict[str, Tool], job: "Job") -> Dict[str, Tool]:
    """The tools of the MCP servers named; they are stopped when the job closes."""
    from agent_demo_kit.mcp_servers import McpTools
    from agent_demo_kit.mcp_tools import McpError, parse_server_specs
    servers = job.closing.enter_context(McpTools())
    try:
        specs = parse_server_specs(settings.mcp_servers, settings.mcp_config)
        found = servers.start(specs, settings.tool_timeout, taken_names=[*registry, *CONTROL_ACTIONS],
                              stderr=sys.stderr)
    except McpError as error:
        raise ConfigError(str(error)) from None
    job.start_fields["mcp"] = servers.describe()
    job.notes += servers.notes
    if job.recorded is not None:
        job.notes += servers.changes_since(job.recorded.get("mcp"))
    return found


def prepare(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor) -> Job:
    """prepare_job, closing what it opened or started (the trace, the tools worker, MCP servers) if it fails."""
    job = Job()
    try:
        return prepare_job(args, environment, job, redactor)
    except BaseException:
        job.closing.close()
        raise


def prepare_job(args: argparse.Namespace, environment: Dict[str, str], job: Job, redactor: Redactor) -> Job:
    """Settings, the tools, the task, the rounds already done and the open trace, or ConfigError."""
    if args.resume is None and args.continue_run is None:
        job.settings = load_settings(args, environment)
        job.settings.stream = wants_stream(args)
        job.registry = build_registry(job.settings, args.tools, job, redactor.secrets)
        job.task = with_material(job, args.task, args.material)
        job.trace_path = args.trace or (None if args.no_log else log_folder.new_log_file(environment))
        job.log = open_log(args, job.trace_path, redactor, environment, job)
        return job
    # The trace is locked before it is read, and shown before its tools files are imported: one
    # resumer at a time, and the user sees where the run goes on.
    job.trace_path = path = run_path(args, environment)
    job.log = open_log(args, path, redactor, environment, job)
    start, rounds, job.unfinished = read_run(args, environment, job.log.recorded(), path)
    job.recorded = start
    continuing = args.continue_run is not None
    # the run's own settings, unless given again
    job.settings = settings = load_settings(args, environment, recorded=own_settings(start, continuing))
    settings.stream = wants_stream(args)
    job.log.say(f"{'following up on' if continuing else 'resuming'} {path}\n  requests go to"
                f" {display_url(chat_completions_url(settings.url))}\n  tools files:"
                f" {', '.join(settings.tools_files) or 'none'}")
    job.registry = build_registry(settings, args.tools, job, redactor.secrets)
    if args.tools is None and isinstance(start.get("tools"), list):
        job.registry = {name: tool for name, tool in job.registry.items() if name in start["tools"]}
    job.task, job.history = start["task"], rounds
    if isinstance(start.get("material"), str):  # read a page at a time, as when the run started
        job.registry["read_material"] = material_reader(start["material"], settings.max_result_chars - 200)
    job.form = resumed_form(settings, start, rounds)
    if continuing:
        follow_up(settings, rounds, args.task)
        job.follow_up = args.task
    return job


MATERIAL_SHOWN = 1_500  # characters of large piped material shown with the task (on the wire)


def with_material(job: Job, task: str, material: str) -> str:
    """The task with the material piped in: whole when it takes at most a quarter of --max-context,
    else its first MATERIAL_SHOWN characters, with read_material among the tools to read the rest
    (and the material recorded for a resume). Material of any size never makes a request too big;
    what is shown does not grow with --max-context, so the budget check's advice holds."""
    settings = job.settings
    if prompts.wire_size(material) <= settings.max_context // 4:
        return prompts.render_task_with_material(task, material)
    job.registry["read_material"] = material_reader(material, settings.max_result_chars - 200)
    job.start_fields["material"] = material
    return prompts.render_task_with_material(task, material, shown_chars=MATERIAL_SHOWN)


def open_log(args: argparse.Namespace, trace_path: Optional[str], redactor: Redactor,
             environment: Dict[str, str], job: Job) -> RunLog:
    """The run log: the human trace on stderr (none under --quiet), so stdout holds only the answer;
    on a terminal it is live and in colour (never with NO_COLOR set)."""
    human = None if args.quiet else sys.stderr
    terminal = on_terminal(human) and environment.get("TERM") != "dumb"  # a dumb terminal takes no escape codes
    try:
        log = RunLog(human, trace_path, redactor, colour=terminal and not environment.get("NO_COLOR"),
                     live=terminal)
    except OSError as error:
        raise ConfigError(f"cannot open the trace file: {error}") from None
    job.closing.callback(log.close)
    if trace_path and not args.trace and args.resume is None and args.continue_run is None:  # a new run
        log_folder.prune(Path(trace_path).parent)
    return log


def wants_stream(args: argparse.Namespace) -> bool:
    """--stream, --no-stream, or on: a streamed reply shows progress, so --timeout can measure silence
    (an endpoint that refuses streaming is asked without it, once)."""
    return args.stream if args.stream is not None else True


# --- material piped in with the task, a page at a time -------------------------------------

def material_reader(material: str, page_chars: int) -> Tool:
    """The read_material tool over this text: a page of at most page_chars characters (as JSON) a call."""
    line_count = material.count("\n") + 1

    @tool(example={"offset": 0}, constraints={"offset": {"minimum": 0}})
    def read_material(offset: int) -> dict:
        """Read the material piped in with the task, one page at a time.

        Args:
            offset: the character to start at (0 for the beginning); each page says where the next one starts
        """
        if offset >= len(material):
            raise ToolError(f"offset {offset} is past the end: the material has {len(material):,} characters")
        page = min(page_chars, len(material) - offset)
        while True:  # escapes (a newline is \n in JSON) make a page longer than its text: shrink until it fits
            text = material[offset:offset + page]
            newline = text.rfind("\n", page // 2)
            if offset + page < len(material) and newline != -1:
                text = text[:newline + 1]  # end the page at a line's end when one is near
            end = offset + len(text)
            first = material.count("\n", 0, offset) + 1
            data = {"offset": offset, "next_offset": end if end < len(material) else None,
                    "total_chars": len(material),
                    "lines": f"{first}-{first + text.count(chr(10), 0, max(0, len(text) - 1))} of {line_count}",
                    "text": text}
            size = len(json.dumps(data, ensure_ascii=False))
            if size <= page_chars or page <= 200:
                return data
            page = max(200, page * page_chars // size - 50)
    return describe(read_material)
