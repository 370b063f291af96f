"""Taking a recorded run up again (--resume, --continue): its trace file locked and read, the settings
it goes on with, and what the user must confirm first, since a trace is data: a run this user's
agent-demo did not seal, a URL that held a password, a recorded command or file not given again.

It imports trace_file, the settings and prompts.
"""
import contextlib
import os
import shlex
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple

from agent_demo_kit import prompts, trace_file
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.limits import VALUE_SHOWN_CHARS
from agent_demo_kit.settings import (OBEYED_ONLY_WHEN_GIVEN, Settings, check_endpoint_settings, flag_name,
                                     load_settings, recorded_differences)
from agent_demo_kit.urls import display_url


def take_up(path: str, continuing: bool, given: Dict[str, Any], environment: Any, named: Callable[[str], str],
            redactor: Any, confirm: Optional[Callable[[str], bool]], screen: Any, written: Optional[List[dict]],
            closing: contextlib.ExitStack) -> Tuple[Any, trace_file.RecordedRun, Settings]:
    """The trace file's listener (its file locked, closed with `closing`), the run it holds, and the
    settings it goes on with (continuing: a follow-up); what is said of it goes to `screen`.
    ConfigError if it cannot go on, or the user did not confirm what they were asked."""
    log = closing.enter_context(contextlib.closing(trace_file.TraceFile(path, redactor, written=written)))
    recorded = trace_file.read_run(log, path, continuing=continuing)
    start = recorded.start
    if not recorded.sealed:
        take_up_unsealed(path, start, confirm, screen)
    if "***" in str(start.get("url")) and not any(
            (given.get("url"), environment.get("LLM_API_URL"), environment.get("OPENAI_BASE_URL"))):
        raise ConfigError("the run's URL held a password, which is not recorded: give it again with --url"
                          " or LLM_API_URL")
    settings = load_settings(given, environment, own_settings(start, continuing), named, check_endpoint=False)
    screen.say(f"{'following up on' if continuing else 'resuming'} {path}\n  requests go to"
               f" {display_url(settings.endpoint)}\n  tools files: {', '.join(settings.tools_files) or 'none'}"
               + (f"\n  a stronger model on trouble (--escalate): {settings.escalate} at"
                  f" {display_url(settings.stronger().endpoint)}" if settings.escalate else ""))
    settings = settle_differences(settings, start, confirm, screen)
    check_endpoint_settings(settings)
    return log, recorded, settings


def take_up_unsealed(path: str, start: dict, confirm: Optional[Callable[[str], bool]], log: Any) -> None:
    """A run whose records agent-demo did not seal as this user (appended by someone else, copied from
    elsewhere, changed, or written before seals) goes on only when the user says so on the terminal;
    with nobody to ask, ConfigError."""
    why = (f"{path}: its run was not set up by agent-demo as you (a record that sets it up carries no seal"
           " of yours: written elsewhere, changed, or by a version before 0.6)")
    if confirm is None:
        raise ConfigError(f"{why}; a trace decides nothing on its own: resume it on a terminal to be asked, or"
                          " run the task again")
    log.say(f"  {why}\n  its task: {prompts.clip(str(start.get('task')), VALUE_SHOWN_CHARS * 3)}")
    if not confirm("take it up anyway, its task and settings as written there? [y/N] "):
        raise ConfigError(f"{path}: not taken up")


def own_settings(start: dict, continuing: bool) -> dict:
    """The recorded settings a run takes up again: all but what starts a process, loads a file or
    chooses where requests go (asked about apart), and a follow-up's limits, which are its own."""
    return {name: value for name, value in start.items() if name not in OBEYED_ONLY_WHEN_GIVEN
            and not (continuing and name in ("max_rounds", "max_tokens"))}


def settle_differences(settings: Settings, start: dict, confirm: Optional[Callable[[str], bool]], log: Any) -> Settings:
    """The settings a resumed run goes on with. What the trace recorded that starts a process, loads a
    file or chooses where requests go is used only when this command line gives the same, or the user
    says so on the terminal (default no); with nobody to ask, ConfigError naming the flags to give."""
    differ = recorded_differences(start, settings)
    if not differ:
        return settings
    flags = " ".join(f"{flag_name(name)} {shlex.quote(value)}" for name, values in differ.items()
                     for value in (values if isinstance(values, list) else [values]))
    if confirm is None:
        raise ConfigError(f"the run was recorded with {flags}, which is not given now: a trace decides no such"
                          " thing on its own; give them again to use them, or others")
    log.say(f"  the trace also names {flags}")
    if not confirm(f"use {flags} as the trace names them? [y/N] "):
        log.say("  not used: the run goes on with this command line's")
        return settings
    sources = {**settings.sources, **dict.fromkeys(differ, "the resumed run")}
    return replace(settings, **{name: os.path.abspath(value) if name == "mcp_config" else
                                [os.path.abspath(path) for path in value] if name == "tools_files" else value
                                for name, value in differ.items()}, sources=sources)
