"""Taking a recorded run up again, appending to its own trace file: --resume goes on where it
stopped; --continue gives it the user's follow-up after its last round. Which run, what it brings
back (its settings, its rounds, the request form the endpoint took), and the command that
continues a run cut short."""
import argparse
import os
import shlex
import sys
from typing import Any, Dict, List, Optional, Tuple

import prompts
from agent_demo_kit import log_folder
from agent_demo_kit.endings import ConfigError, RunResult
from agent_demo_kit.settings import Settings, display_url, given
from agent_demo_kit.trace import Call, Round, add_follow_up, load_trace


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
