"""What the command line runs for a task (a new run, a resume, a follow-up) and its printed outcome
with how to go on, through the same entrance as a Python caller (setup.prepare, agent_demo.run_job).
What it does besides (--batch, --runs, --show, --summary, --report, --config) is in side_commands.py.

It imports agent_demo, setup, the seam, the terminal and the settings; the run log (a resume, a run's
name) and output types (--output-schema) when used.
"""
import argparse
import contextlib
import os
import shlex
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from agent_demo_kit import prompts
from agent_demo import Agent, run_job
from agent_demo_kit.seam import Job
from agent_demo_kit.setup import prepare
from agent_demo_kit.endings import ConfigError, Interrupted, RunResult, SigTerm, Terminated
from agent_demo_kit.redaction import Redactor
from agent_demo_kit.settings import flag_name, setting_fields
from agent_demo_kit.terminal import CONTROLLING_TERMINAL, SafeStream, Screen, is_terminal, stray_prints_to_stderr
from agent_demo_kit.urls import display_url


def start(args: argparse.Namespace, environment: Dict[str, str],
          redactor: Redactor) -> Tuple[RunResult, Optional[Agent]]:
    """Prepare the run (or the resume, or the follow-up) and run it; the outcome, and the agent
    that ran it once it started."""
    with ending_on_sigterm():
        try:
            job = prepare_job(args, environment, redactor, output_schema(args.output_schema))
        except ConfigError as error:
            return RunResult(error), None
        except KeyboardInterrupt:
            return RunResult(Interrupted()), None
        except SigTerm:
            return RunResult(Terminated("terminated by SIGTERM")), None
        with job, stray_prints_to_stderr():  # closed whatever happens: the trace, the tools worker, MCP
            return run_job(job)


def output_schema(path: Optional[str]) -> Any:
    """The type --output-schema FILE gives the result (a file the user named: trusted), or None."""
    if path is None:
        return None
    from agent_demo_kit.output_types import output_type_of, schema_file
    try:
        with open(path, encoding="utf-8") as file:
            return output_type_of(schema_file(file.read(1 << 20), f"--output-schema {path}"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read --output-schema {path}: {getattr(error, 'strerror', None) or error}") from None
    except ValueError as error:  # not a JSON Schema: it says why
        raise ConfigError(str(error)) from None


def prepare_job(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor,
                output: Optional[Any] = None) -> Job:
    """The run the flags ask for, made ready: a new one, or one taken up again from its trace
    (output: the type --output-schema gives the result)."""
    given = given_settings(args)
    follow_up = args.task if args.continue_run is not None else None
    resume = run_path(args, environment) if args.resume is not None or follow_up is not None else None
    return prepare(args.task, given=given, environment=environment, named=flag_name, material=args.material,
                   trace=args.trace or (None if args.no_log else True), resume=resume, follow_up=follow_up,
                   screen=screen(args, environment, redactor), redactor=redactor,
                   approver=asked_on_the_terminal(redactor), output=output,
                   confirm=resume and asked_on_the_terminal(redactor, confirming=True))


def asked_on_the_terminal(redactor: Redactor, confirming: bool = False) -> Optional[Callable[[Any], bool]]:
    """Who approves a call (or, confirming: says y/N to a question): the question on the controlling
    terminal, made the first time one is asked (approval.py); None when the process has no terminal."""
    try:
        os.close(os.open(CONTROLLING_TERMINAL, os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return None
    asker: List[Any] = []

    def ask(question: Any) -> bool:
        if not asker:
            from agent_demo_kit.approval import TerminalApprover, confirming as y_or_n
            approver = TerminalApprover(redactor)  # a terminal gone since is an OSError, as it always was
            asker.append(y_or_n(approver) if confirming else approver)
        return asker[0](question)
    return ask


def given_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The settings the flags give, by name (None: not given)."""
    return {item.name: getattr(args, item.name) for item in setting_fields() if item.metadata["flag"]}


def screen(args: argparse.Namespace, environment: Dict[str, str], redactor: Redactor) -> Optional[Screen]:
    """The human trace on stderr (none under --quiet), so stdout holds only the answer; on a terminal
    it is live and in colour (never with NO_COLOR set, nor on a dumb terminal, which takes no codes)."""
    if args.quiet:
        return None
    terminal = is_terminal(sys.stderr) and environment.get("TERM") != "dumb"
    return Screen(sys.stderr, colour=terminal and not environment.get("NO_COLOR"), live=terminal,
                  redactor=redactor)


def run_path(args: argparse.Namespace, environment: Dict[str, str]) -> str:
    """The trace file --resume or --continue is about; ConfigError if there is none to take up."""
    from agent_demo_kit import run_log  # the run log layer
    continuing = args.continue_run is not None
    flag = "--continue" if continuing else "--resume"
    if args.task and not continuing:
        raise ConfigError("--resume continues the task recorded in the trace; give no task with it")
    named = (args.continue_run if continuing else args.resume) or args.trace  # the run in --trace FILE
    path = run_log.pick_run(named or "", environment, flag)
    if args.trace and os.path.abspath(args.trace) != os.path.abspath(path) or continuing and args.no_log:
        raise ConfigError(f"{flag} appends to the run's own trace file; --trace cannot name another one,"
                          " nor --no-log keep none")
    if not os.path.lexists(path):
        raise ConfigError(f"cannot read the trace file {path}: no such file")
    return path


@contextlib.contextmanager
def ending_on_sigterm() -> Iterator[None]:
    """While the run lasts, SIGTERM ends it like Ctrl-C does: the end record is written, exit 143."""
    def terminate(signum: int, frame: Any) -> None:
        raise SigTerm()
    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def show_traceback(outcome: RunResult) -> None:
    """For --debug: the traceback of the error that ended the run, through the redacting stderr."""
    error = outcome.ending
    if outcome.status == "error" and str(error):
        print("".join(traceback.format_exception(type(error), error, error.__traceback__)), file=sys.stderr, end="")


def print_answer(outcome: RunResult, args: argparse.Namespace, answer: SafeStream) -> None:
    """A finished run's answer on stdout: text as it is, anything else (or with --output-schema) as JSON."""
    if outcome.status != "finished":
        return
    if args.output_schema:  # JSON, whatever its type
        answer.write_json(outcome.result)
    elif isinstance(outcome.result, str):
        print(outcome.result, file=answer)
    else:
        answer.write_json(outcome.result, indent=2)


def report(outcome: RunResult, args: argparse.Namespace, answer: SafeStream, agent: Optional[Agent] = None) -> int:
    """Print the outcome the way the flags ask for (the answer, or the --json object, on `answer`;
    the rest on stderr, with how to continue a run cut short); returns the exit code."""
    if args.json:
        answer.write_json(json_object(outcome))
    else:
        print_answer(outcome, args, answer)
    say_material(outcome)
    refused = sum(call["result"].get("error") == prompts.NO_TERMINAL for call in outcome.calls)
    if refused:  # even under --quiet: the run may have "finished" without doing what was asked
        print(f"agent-demo: {refused} tool call(s) refused: they need approval and there was no terminal"
              " to ask; --yes runs them", file=sys.stderr)
    if outcome.status == "error":
        print(f"agent-demo: error: {outcome.error}", file=sys.stderr)
    elif outcome.status != "finished" and args.quiet:  # otherwise the trace ended with it
        lines = [f"agent-demo: {outcome.summary()}", *(f"  {line}" for line in outcome.progress)]
        print("\n".join(lines), file=sys.stderr)
    if outcome.trace and outcome.resumable:
        print(f"agent-demo: to continue: {continue_hint(outcome, agent, args)}", file=sys.stderr)
    return outcome.exit_code


def say_material(outcome: RunResult) -> None:
    """Even under --quiet: an answer about part of the material piped in says how much the model read."""
    read = outcome.material
    if read:
        print(f"agent-demo: {prompts.render_material_read(read['read_chars'], read['chars'], read['bytes'])}",
              file=sys.stderr)


def json_object(outcome: RunResult) -> dict:
    """The --json object: the outcome, and the run's id and trace file (null when nothing was recorded)."""
    from agent_demo_kit import run_log  # the run log layer
    path = outcome.trace
    return {**outcome.to_json(), "run_id": run_log.run_id(Path(path)) if path else None,
            "trace": os.path.abspath(path) if path else None}


def continue_hint(outcome: RunResult, agent: Optional[Agent], args: argparse.Namespace) -> str:
    """How to go on with a run cut short: agent-demo --resume and the run's id, with only the flags that
    matter. The model given as a flag is given again (the environment would win over the record), and
    the URL given anywhere (a trace decides no URL on its own: LLM_API_URL=... agent-demo "task" would
    otherwise leave the resume without one), unless they caused the error: then the hint says what to
    fix first. After a round limit a bare --resume gives another --max-rounds of rounds; after the
    token budget, the budget doubles."""
    command = f"agent-demo --resume {run_name(outcome.trace, args)}"
    ending, settings = outcome.ending, agent and agent.settings
    stronger = bool(agent and agent.escalation and agent.escalation.in_charge == "second")  # its endpoint failed
    failing = agent.client.settings if agent else None
    http_status = getattr(ending, "http_status", None)
    model_wrong, url_wrong = http_status == 404, http_status == 404 or getattr(ending, "unreachable", False)
    if settings and args.model and not (model_wrong and not stronger):
        command += f" -m {shlex.quote(settings.model)}"
    if settings and settings.escalate and settings.sources.get("escalate", "").startswith(("-", "the resumed run")) \
            and not (model_wrong and stronger):
        command += f" --escalate {shlex.quote(settings.escalate)}"
    url_named = args.url or settings and settings.sources.get("url") not in (None, "default", "the resumed run")
    if settings and url_named and not (url_wrong and not stronger) and "***" not in display_url(settings.url):
        command += f" --url {shlex.quote(settings.url)}"
    for name in ("tools_files", "mcp_servers", "mcp_config", "check", "escalate_url"):  # named, never decided
        if name == "escalate_url" and "***" in display_url(settings.escalate_url or ""):
            continue  # a password that was not recorded: the user gives it again
        values = getattr(settings, name) if settings else None
        if values and settings.sources.get(name, "").startswith("-"):
            command += "".join(f" {flag_name(name)} {shlex.quote(value)}"
                               for value in (values if isinstance(values, list) else [values]))
    if args.yes:  # never assumed on resume: said again, in the open
        command += " --yes"
    if agent and outcome.status == "budget" and agent.token_limit:
        command += f" --max-tokens {agent.token_limit * 2}"
    if http_status in (401, 403):
        return f"check {key_source(failing)}, then: {command}"
    model_flag, url_flag = ("--escalate", "--escalate-url") if stronger else ("-m", "--url")
    if model_wrong:
        return f"give a model the endpoint has ({model_flag} NAME) or its right URL ({url_flag}), then: {command}"
    if url_wrong:
        return f"once {display_url(failing.endpoint) if failing else 'the endpoint'} answers (or with the right" \
               f" {url_flag}): {command}"
    return command


def key_source(settings: Any) -> str:
    """The variable the key came from, to say which to check."""
    source = settings.sources.get("api_key", "default") if settings else "default"
    return "LLM_API_KEY" if source in ("default", "the resumed run") else source


def run_name(path: str, args: argparse.Namespace) -> str:
    """How --resume names a run: as the user named it (--trace FILE, --resume RUN), else by its short
    id in the run log folder."""
    from agent_demo_kit import run_log  # the run log layer
    named = args.trace or args.resume or args.continue_run
    if named:
        return shlex.quote(named)
    folder = Path(path).parent
    return run_log.short_ids([run_log.RunSummary(Path(path), 0, "", 0, None, "")],
                               run_log.run_files(folder)).get(Path(path), run_log.run_id(Path(path)))
