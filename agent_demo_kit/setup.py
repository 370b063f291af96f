"""Setting a run up: from what a caller gave (settings by name, tool functions, the task and what was
piped in, or the trace of a run to take up again), the parts the loop runs with: settings, the
model client (and the stronger model's, with --escalate), the tools, the trace, who approves
calls, the checks; made once, whole, and handed to `agent_demo.Agent`. What it opened or started
is closed with the Job.

It imports prompts, tools, records, endings, the seam, settings, environment, urls, the client, the
conversation and the screen's trace; each layer the settings choose only then: the run log (a trace
file, a resume), checks and output types, escalation, the tool sources, telemetry, events.
"""
import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from agent_demo_kit import prompts
from agent_demo_kit.conversation import Conversation
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.environment import Environment, read_environment
from agent_demo_kit.records import Call, Round
from agent_demo_kit.screen_trace import ScreenTrace
from agent_demo_kit.seam import Approver, EachRound, Hooks, Job, the_callers, told
from agent_demo_kit.settings import Settings, keyword_name, load_settings
from agent_demo_kit.limits import MATERIAL_SHOWN_CHARS, PAGE_MARGIN_CHARS
from agent_demo_kit.urls import display_url, mcp_urls, secrets_of
from agent_demo_kit.tools import REGISTRY, Tool, ToolDefinitionError, clash_message, describe, in_use, material_reader


def prepare(task: str = "", *, given: Dict[str, Any], environment: Dict[str, str],
            named: Callable[[str], str] = keyword_name, functions: Sequence[Callable] = (), material: str = "",
            trace: Union[str, "os.PathLike[str]", bool, None] = None, resume: Optional[str] = None,
            follow_up: Optional[str] = None, screen: Any = None, redactor: Any = None,
            approver: Optional[Approver] = None, confirm: Optional[Callable[[str], bool]] = None,
            session: Any = None, task_check: Optional[Tuple[str, str]] = None, gate: Any = None,
            written: Optional[List[dict]] = None, on_event: Optional[Callable[[Any], None]] = None,
            on_round: Optional[Callable[[Round], None]] = None, output: Any = None, expected: Optional[str] = None,
            settings: Optional[Settings] = None) -> Job:
    """A run made ready from what a caller gave: settings by name (`given`, named for messages by
    `named`), tool functions, the task and its material, where to record it (a path, True for the
    run log folder, None), or the trace of a run to take up again (`resume`, with the user's
    `follow_up` for --continue); the screen that shows it, the redactor every output goes through,
    and who confirms using what only the trace names (`confirm`, a y/N question; None: nobody can);
    the requests.Session to send on (a batch worker reuses its own; None: one of the run's own);
    a task line's own check (its command and how to name it), which the user said to run beside
    --check; a shared limit on requests in flight (`gate`: a batch's, or a function of the settings
    that gives arun()'s for the endpoint), a list to keep each record written in (`written`), and
    who is told each event as well as the trace (`on_event`) and each round (`on_round`); the type a
    result must fit (`output`, an output_types.OutputType) and a batch task's answer for the checks
    (`expected`); `settings`: what `given` and `environment` make, when the caller made them already
    (a batch, once for all its new tasks). Each layer is imported only when the settings choose it.
    ConfigError if it cannot start; what it opened is closed then."""
    from agent_demo_kit.client import ModelClient, RequestForm  # not on import: --version starts without requests
    from agent_demo_kit.redaction import Redactor
    closing = contextlib.ExitStack()
    try:
        redactor = redactor or Redactor(*secrets_of(environment, given.get("url")))
        start: Optional[dict] = None
        recorded: Optional[Any] = None
        history: List[Round] = []
        unfinished: List[Call] = []
        screen_trace = ScreenTrace(screen)
        log: Any = None  # the trace file's listener
        if resume is not None:  # the run log layer: locked before it is read, shown before its tools files are imported
            from agent_demo_kit.resume import take_up
            log, recorded, settings = take_up(resume, follow_up is not None, given, environment, named, redactor, confirm,
                                              screen_trace, written, closing)
            start, history, unfinished, task = recorded.start, recorded.rounds, recorded.unfinished, recorded.start["task"]
            if start.get("answer_only") is True and settings.tool_names is None:  # --tools none holds, as tools do
                settings = dataclasses.replace(settings, tool_names=[])
        else:
            settings = settings or load_settings(given, environment, named=named)
        gate_for = gate if callable(gate) else lambda settings: gate  # arun()'s: the one for each endpoint
        gate = gate_for(settings)
        redactor.add(*secrets_of({"LLM_API_KEY": settings.api_key or "", "LLM_ESCALATE_KEY": settings.escalate_key
                                  or ""}, settings.url, settings.escalate_url))  # a key= given too, before any child
        # Whole, before it is shown a page at a time: a page's edge must not split a key into parts too short to catch.
        material = redactor(material, placeholders=False) if material else material
        # An MCP server's URL may hold a password or a token: what is said of it is redacted from now on.
        redactor.add(*secrets_of({}, *mcp_urls(settings.mcp_servers)))
        registry, start_fields, notes = tool_registry(settings, functions, redactor, closing, start)
        form = RequestForm.resumed(settings, start, any(record.mode == settings.mode for record in history)) \
            if start is not None else RequestForm.asked_for(settings)
        client = closing.enter_context(contextlib.closing(ModelClient(settings, form=form, session=session,
                                                                      gate=gate)))
        url_note = environment.where_requests_go(settings) if isinstance(environment, Environment) else ""
        screen_trace = ScreenTrace(screen, url_note, header_said=resume is None)
        if resume is None:  # said before any request: a local server's window is asked before the start is recorded
            ScreenTrace(screen, url_note).header(redactor(task, placeholders=False), settings.model,
                                                 display_url(settings.endpoint), form.mode)
        escalation = None
        if settings.escalate:  # the stronger model: its own endpoint and key, or the first model's
            stronger = settings.stronger()  # checked with the first model's endpoint settings
            redactor.add(*secrets_of({"LLM_ESCALATE_KEY": stronger.api_key or ""}, stronger.url))
            second = closing.enter_context(contextlib.closing(ModelClient(stronger, gate=gate_for(stronger))))
            from agent_demo_kit.escalation import Escalation
            escalation = Escalation(settings, client, second)
            if recorded is not None:
                escalation.restore(recorded.escalations, history)
        piped = start.get("material") if start is not None and isinstance(start.get("material"), str) else None
        if piped is not None:  # read a page at a time, as before
            registry["read_material"] = material_reader(piped, settings.max_result_chars - PAGE_MARGIN_CHARS)
        if material and follow_up is not None:  # piped beside a follow-up: what the follow-up is about
            follow_up = with_material(follow_up, material, registry, start_fields, settings, lambda text: Conversation(
                f"{task}\n\n{text}", settings, registry, client).fits())
            piped = start_fields.get("material", piped)
        elif material and resume is None:
            task = with_material(task, material, registry, start_fields, settings,
                                 lambda text: Conversation(text, settings, registry, client).fits())
            piped = start_fields.get("material")
        Conversation(task, settings, registry, client).check_fits()  # before a new run's trace is made:
        judge = None
        if settings.check is not None or task_check or output is not None:
            from agent_demo_kit.checks import Judge, checks_for
            judge = Judge(settings, checks_for(settings.check, settings.named("check"), task_check), output, expected)
        if resume is None and trace:  # the run log layer, when the run is recorded
            from agent_demo_kit import run_log, trace_file
            path = run_log.new_log_file(environment) if trace is True else os.fspath(trace)
            log = closing.enter_context(contextlib.closing(trace_file.TraceFile(path, redactor, written=written)))
            if trace is True:
                run_log.prune(Path(path).parent)
        if log is not None:
            log.recording(start_fields)
        listeners = [*([screen_trace] if screen else []), *([log] if log else []),  # none that shows nothing
                     *with_telemetry(settings, environment, registry, redactor)]
        if on_event:
            from agent_demo_kit.events import EventStream
            listeners.append(EventStream(on_event, redactor))
        if on_round:
            listeners.append(EachRound(on_round))
        hooks = Hooks(listeners, redactor)
        for each in escalation.clients.values() if escalation else [client]:
            each.record_to(hooks)
        round_limit = None
        if resume is not None and recorded.status == "max_rounds" and given.get("max_rounds") is None:
            more = recorded.first_limit or settings.max_rounds  # the run's own --max-rounds, not the total so far
            round_limit = len(history) + more  # a bare --resume: another --max-rounds of rounds
        shown = start_fields.get("material_shown", (start or {}).get("material_shown", 0))
        return Job(settings, client, registry, hooks, task, approver, judge, escalation, output, history, unfinished,
                   follow_up, resumed=resume is not None, round_limit=round_limit,
                   material=(piped, shown) if piped is not None else None,  # paged: the outcome says how much was read
                   task_notices=list(recorded.task_notices) if recorded is not None and escalation else [],
                   notes=notes, trace_path=log and log.path, closing=closing)
    except BaseException:
        closing.close()
        raise


def prepare_for_caller(task: str, given: Dict[str, Any], gate: Any = None, emit: Any = None) -> Job:
    """prepare() for a Python caller: given holds run()'s keywords (tools=, approve=, trace=, on_round=,
    on_event=, output_type=, material=) and the settings by name; emit is told each event after on_event."""
    settings = dict(given)
    tools, approve, trace, on_round, on_event, output_type, material = (settings.pop(name, None) for name in (
        "tools", "approve", "trace", "on_round", "on_event", "output_type", "material"))
    if approve is not None and not callable(approve):
        raise ConfigError(f"approve must be a function that decides each call, got {approve!r}")
    output = None
    if output_type is not None:
        from agent_demo_kit.output_types import output_type_of
        output = output_type_of(output_type)  # ConfigError if it cannot be
    if approve is not None:  # it decides about every call, as --approve asks about every call
        settings["approve"] = True
    environment = read_environment()
    for note in environment.notes:  # a ./.env passed by: said, as the command line says it
        print(f"agent-demo: {note}", file=sys.stderr)
    return prepare(task, given=settings, environment=environment, named=keyword_name, functions=tools or (),
                   material=material or "", trace=None if trace is False else trace, gate=gate,
                   approver=approve and the_callers("approve", approve),
                   on_event=told(on_event and the_callers("on_event", on_event), emit),
                   on_round=on_round and the_callers("on_round", on_round), output=output)


def with_telemetry(settings: Settings, environment: Any, tools: Any, redactor: Any) -> List[Any]:
    """The listener that makes the run into OpenTelemetry spans, when --otel or OTEL_EXPORTER_OTLP_ENDPOINT
    says so and the otel extra is installed (without it, the variable alone changes nothing; --otel is an error)."""
    if not settings.otel:
        return []
    try:
        from agent_demo_kit.telemetry import traced
    except ImportError:
        if settings.sources.get("otel") != "OTEL_EXPORTER_OTLP_ENDPOINT":  # asked for by name
            raise ConfigError(f"{settings.named('otel')} needs the OpenTelemetry SDK: pip install 'agent-demo[otel]'") \
                from None
        return []
    return [traced(settings, environment, tools, redactor)]


def notes_before_the_first_round(settings: Settings, registry: Dict[str, Tool], approver: Optional[Approver],
                                 client: Any, escalation: Any, following_up: bool) -> List[str]:
    """What a run says once, before its first round: which model goes on (with --escalate), calls that
    will be refused with nobody to ask, a --max-context the model's window does not hold."""
    notes = []
    if escalation and escalation.in_charge == "second":
        goes_to = "the follow-up goes to" if following_up else "the run goes on with"
        notes.append(f"{goes_to} {client.settings.model} (--escalate), which had taken the run over")
    side_effects = [name for name, tool in registry.items() if tool.side_effects]
    if approver is None and not settings.yes and (settings.approve or side_effects):
        refused = "every tool call" if settings.approve else f"every call to {', '.join(side_effects)}"
        notes.append(f"{'--approve: ' if settings.approve else ''}there is no terminal to ask, so {refused}"
                     " will be refused; --yes runs them")
    return notes + list(getattr(client, "window_notes", list)())


def tool_registry(settings: Settings, functions: Sequence[Callable], redactor: Any,
                  closing: contextlib.ExitStack, start: Optional[dict]) -> Tuple[Dict[str, Tool], dict, List[str]]:
    """The tools a run offers besides finish, fail, recall and note: the built-in ones, the caller's
    functions, each --tools-file's (run by a worker process) and each MCP server's, cut down to
    --tools (or, on a resume, to the tools the run had); with what the start record keeps of them
    and the notes to say once it is written. ConfigError if a function or a file gives no usable
    tool, a name clashes, a server does not start, or --tools names a tool that does not exist.
    What they start is stopped when `closing` closes."""
    if settings.tool_names == [] and (settings.tools_files or settings.mcp_servers or settings.mcp_config):
        adding = settings.named("tools_files") if settings.tools_files else settings.named(
            "mcp_servers" if settings.mcp_servers else "mcp_config")
        raise ConfigError(f"{settings.named('tool_names')} none offers no tool: {adding} would add none")
    registry = dict(REGISTRY)
    for function in functions:
        try:
            described = describe(function)
        except ToolDefinitionError as error:
            raise ConfigError(f"tools: {error}") from None
        if described.name in in_use(registry):
            raise ConfigError(f"tools: {clash_message(described.name)}")
        registry[described.name] = described
    start_fields: dict = {}
    notes: List[str] = []
    if settings.tools_files:
        from agent_demo_kit.tools_worker import load_tools_files
        registry.update(load_tools_files(settings.tools_files, settings.tool_timeout, redactor.secrets,
                                         in_use(registry), closing, settings.named("tools_files")))
    if settings.mcp_servers or settings.mcp_config:
        from agent_demo_kit.mcp_client import McpTools
        from agent_demo_kit.mcp_schemas import McpError, parse_server_specs
        servers = closing.enter_context(McpTools())
        try:
            specs = parse_server_specs(settings.mcp_servers, settings.mcp_config, settings.named("mcp_servers"),
                                       settings.named("mcp_config"))
            redactor.add(*secrets_of({}, *(spec.url for spec in specs)))  # a password or token in a server's URL
            registry.update(servers.start(specs, settings.tool_timeout, taken_names=in_use(registry),
                                          stderr=sys.stderr))
        except McpError as error:
            raise ConfigError(str(error)) from None
        start_fields["mcp"] = servers.describe()
        notes += servers.notes + (servers.changes_since(start.get("mcp")) if start is not None else [])
    if settings.tool_names is not None:
        unknown = [name for name in settings.tool_names if name not in in_use(registry)]
        if unknown:
            raise ConfigError(f"{settings.named('tool_names')}: unknown tool {', '.join(unknown)}"
                              f" (available: {', '.join(in_use(registry))})")
        registry = {name: tool for name, tool in registry.items() if name in settings.tool_names}
    elif start is not None and isinstance(start.get("tools"), list):
        registry = {name: tool for name, tool in registry.items() if name in start["tools"]}
    return registry, start_fields, notes


def with_material(task: str, material: str, registry: Dict[str, Tool], start_fields: dict, settings: Settings,
                  fits: Callable[[str], bool]) -> str:
    """The task with the material piped in: whole when the requests it starts still leave room for
    rounds (`fits`), else its first MATERIAL_SHOWN_CHARS, with read_material among the tools to read
    the rest (and the material, and how much was shown, recorded for a resume). Material of any size
    never makes a request too big; what is shown does not grow with the budget, so the budget check's
    advice holds."""
    whole = prompts.render_task_with_material(task, material)
    if fits(whole):
        return whole
    registry["read_material"] = material_reader(material, settings.max_result_chars - PAGE_MARGIN_CHARS)
    start_fields["material"], start_fields["material_shown"] = material, prompts.material_shown(
        material, MATERIAL_SHOWN_CHARS)
    return prompts.render_task_with_material(task, material, shown_chars=MATERIAL_SHOWN_CHARS)
