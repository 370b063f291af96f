"""agent-demo: a minimal agent loop over an OpenAI-compatible chat-completions endpoint.

Read top to bottom: settings, the reasons a run stops, the HTTP client, the
action parser, the run log, the loop, the command line.
"""
import argparse
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TextIO
from urllib.parse import urlsplit

import requests
from dotenv import dotenv_values
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

import prompts
from tools import CONTROL_ACTIONS, FAIL, FINISH, REGISTRY, Tool, call_tool, check_args, failure

DEFAULT_URL = "https://api.openai.com/v1/chat/completions"
DEFAULT_MODEL = "gpt-4o-mini"
# Hosted endpoints that always need a key: without one, fail before any request.
HOSTS_NEEDING_A_KEY = {"api.openai.com", "api.deepseek.com", "dashscope.aliyuncs.com",
                       "dashscope-intl.aliyuncs.com"}


# --- settings ------------------------------------------------------------------

@dataclass
class Settings:
    """Everything a run needs to know, from flags, the environment and .env."""

    url: str = DEFAULT_URL
    model: str = DEFAULT_MODEL
    api_key: Optional[str] = field(default=None, repr=False)  # never printed
    max_rounds: int = 6
    timeout: float = 30.0
    retries: int = 3
    backoff_factor: float = 0.5  # waits 0, 1, 2, 4 ... seconds between retries
    retry_after_cap: float = 30.0  # a server asking for longer is not waited for that long


def chat_completions_url(url: str) -> str:
    """Accept a full chat-completions URL or a base URL such as https://host/v1."""
    url = url.strip().rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


# --- the reasons a run stops early ------------------------------------------------

class AgentStop(Exception):
    """Ends the run: the model cannot fix this. Carries the run status and exit code."""

    status = "error"
    exit_code = 3


class ConfigError(AgentStop):
    """The command line or the settings are wrong; nothing was sent."""

    exit_code = 2


class EndpointError(AgentStop):
    """The endpoint refused, failed or answered with something unusable."""

    exit_code = 3


# --- the HTTP client -------------------------------------------------------------

RETRY_STATUSES = (429, 500, 502, 503, 504)


class CappedRetry(Retry):
    """urllib3's Retry, but a Retry-After longer than the cap is shortened to it."""

    retry_after_cap = 30.0

    def get_retry_after(self, response):
        seconds = super().get_retry_after(response)
        return None if seconds is None else min(seconds, self.retry_after_cap)


@dataclass
class Reply:
    """What the model said in one round."""

    content: str
    tool_calls: List[dict] = field(default_factory=list)
    usage: Optional[dict] = None
    latency_ms: int = 0


class ModelClient:
    """Sends the conversation to the endpoint over one session, with retries."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.url = chat_completions_url(settings.url)
        retry_class = type("Retry", (CappedRetry,), {"retry_after_cap": settings.retry_after_cap})
        retry = retry_class(total=settings.retries, backoff_factor=settings.backoff_factor,
                            backoff_max=settings.retry_after_cap, status_forcelist=RETRY_STATUSES,
                            allowed_methods=None, raise_on_status=False)
        self.session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if settings.api_key:
            self.session.headers["Authorization"] = f"Bearer {settings.api_key}"

    def ask(self, messages: List[dict], **extra: Any) -> Reply:
        """Send one chat-completions request and return the reply, or raise EndpointError."""
        body = {"model": self.settings.model, "messages": messages, **extra}
        started = time.monotonic()
        try:
            response = self.session.post(self.url, json=body,
                                         timeout=(min(10.0, self.settings.timeout), self.settings.timeout))
        except requests.RequestException as error:
            raise EndpointError(f"cannot reach {self.url}: {describe_network_error(error, self.settings)}"
                                f" (after {self.settings.retries} retries)") from None
        latency_ms = int((time.monotonic() - started) * 1000)
        if response.status_code >= 400:
            raise EndpointError(describe_http_error(response, self.settings))
        reply = read_reply(response)
        reply.latency_ms = latency_ms
        return reply

    def close(self) -> None:
        self.session.close()


def redact(text: str, secret: Optional[str]) -> str:
    """Remove the API key from anything about to leave the process."""
    return text.replace(secret, "[redacted]") if secret else text


def describe_network_error(error: Exception, settings: Settings) -> str:
    """One readable phrase for a connection failure, without urllib3's object reprs."""
    text = str(error)
    if isinstance(error, requests.Timeout) or "Read timed out" in text:
        return f"no reply within {settings.timeout:g} s"
    if "Connection refused" in text:
        return "connection refused"
    if "Name or service not known" in text or "NameResolution" in text or "nodename nor servname" in text:
        return "host name not found"
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return "the server closed the connection without replying"
    return re.sub(r"<[^>]*>:?\s*", "", text)[:200]


def server_message(response: requests.Response) -> str:
    """The endpoint's own words about an error, however it shapes them."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body.get("message", body.get("detail")))
        if isinstance(error, dict):
            error = error.get("message") or error
        if error:
            return error if isinstance(error, str) else prompts.to_json(error)
    return " ".join(response.text.split())[:300] or "(empty body)"


def describe_http_error(response: requests.Response, settings: Settings) -> str:
    """Name the failed status, what the user can do, and what the server said."""
    status, message = response.status_code, redact(server_message(response), settings.api_key)
    if status in (401, 403):
        return f"authentication failed (HTTP {status}): {message} - check LLM_API_KEY"
    if status == 404:
        return f"not found (HTTP 404): {message} - check LLM_MODEL ({settings.model}) and LLM_API_URL"
    if status in RETRY_STATUSES:
        return f"HTTP {status} after {settings.retries} retries: {message}"
    return f"request rejected (HTTP {status}): {message}"


def read_reply(response: requests.Response) -> Reply:
    """Pull the message out of a chat-completions body, or say why it is unusable."""
    try:
        body = response.json()
    except ValueError:
        snippet = " ".join(response.text.split())[:200]
        raise EndpointError(f"the endpoint's reply is not JSON: {snippet or '(empty body)'}") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        detail = f": {server_message(response)}" if isinstance(body, dict) and "error" in body else ""
        raise EndpointError(f"the endpoint's reply has no choices{detail}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise EndpointError("the endpoint's reply has no message in its first choice")
    content = message.get("content")
    if isinstance(content, list):  # some servers send content as a list of parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    content = content if isinstance(content, str) else ""
    tool_calls = [call for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    if not content.strip() and not tool_calls:
        raise EndpointError("the endpoint's reply has no content and no tool calls"
                            f" (finish_reason: {choices[0].get('finish_reason')})")
    usage = body.get("usage")
    return Reply(content=content, tool_calls=tool_calls, usage=usage if isinstance(usage, dict) else None)


# --- parsing the action -----------------------------------------------------------

_THINK_BLOCK = re.compile(r"<(think|thinking)>.*?</\1>", re.S | re.I)
_JSON_START = re.compile(r"[\[{]")


def strip_think(text: str) -> str:
    """Drop reasoning blocks, including an unclosed one and a lone closing tag."""
    text = _THINK_BLOCK.sub("", text)
    text = re.split(r"</think(?:ing)?>", text, flags=re.I)[-1]  # opening tag eaten by the server
    return re.split(r"<think(?:ing)?>", text, flags=re.I)[0]  # cut off mid-thought


def json_values(text: str):
    """Yield each top-level JSON object or array in text, left to right."""
    decoder = json.JSONDecoder()
    position = 0
    while True:
        match = _JSON_START.search(text, position)
        if not match:
            return
        try:
            value, position = decoder.raw_decode(text, match.start())
            yield value
        except json.JSONDecodeError:
            position = match.start() + 1


def is_action(value: Any) -> bool:
    """An action is an object with a string "tool"."""
    return isinstance(value, dict) and isinstance(value.get("tool"), str)


@dataclass
class Parsed:
    """The actions found in a reply, or the problem to tell the model."""

    actions: List[dict]
    problem: Optional[str] = None


def parse_actions(text: str) -> Parsed:
    """Find the actions in a model's text: objects with a string "tool", or arrays of them."""
    actions, saw_json = [], False
    for value in json_values(strip_think(text)):
        saw_json = True
        if is_action(value):
            actions.append(value)
        elif isinstance(value, list) and value and all(is_action(item) for item in value):
            actions.extend(value)
    if not actions:
        return Parsed([], "found JSON, but no action object with a string \"tool\"" if saw_json
                      else "no JSON object found")
    for action in actions:
        action.setdefault("args", {})
        if not isinstance(action["args"], dict):
            return Parsed([], f"\"args\" of {action['tool']} must be a JSON object")
    return Parsed(actions)


def parse_tool_calls(tool_calls: List[dict]) -> Parsed:
    """Read native tool_calls as actions; their arguments arrive as a JSON string."""
    actions = []
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            return Parsed([], f"the arguments of tool call {function.get('name')!r} are not valid JSON")
        if not isinstance(function.get("name"), str) or not isinstance(args, dict):
            return Parsed([], "a tool call needs a function name and an arguments object")
        actions.append({"tool": function["name"], "args": args})
    return Parsed(actions)


def parse_reply(reply: Reply) -> Parsed:
    """The actions of a reply: from its text, or from native tool calls when the text is empty."""
    if reply.content.strip() or not reply.tool_calls:
        return parse_actions(reply.content)
    return parse_tool_calls(reply.tool_calls)


# --- the run log: the trace people read and the JSON Lines file ------------------------

def display(value: Any) -> str:
    """A result as people read it: text as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


class RunLog:
    """Writes each event to the human trace (a stream or nothing) and the trace file."""

    def __init__(self, human: Optional[TextIO] = None, trace_path: Optional[str] = None,
                 secret: Optional[str] = None):
        self.human, self.secret = human, secret
        self.trace_file = open(trace_path, "a", encoding="utf-8") if trace_path else None

    def say(self, text: str) -> None:
        if self.human:
            print(redact(text, self.secret), file=self.human, flush=True)

    def record(self, event: str, **fields: Any) -> None:
        if self.trace_file:
            line = json.dumps({"event": event, **fields}, ensure_ascii=False, default=str)
            self.trace_file.write(redact(line, self.secret) + "\n")
            self.trace_file.flush()  # a crash loses at most the round in flight

    def start(self, task: str, settings: Settings) -> None:
        self.say(f"task: {task}\nmodel: {settings.model} at {chat_completions_url(settings.url)}")
        self.record("start", task=task, model=settings.model, url=chat_completions_url(settings.url),
                    max_rounds=settings.max_rounds, ts=time.time())

    def round(self, number: int, max_rounds: int, reply: Reply, action: Optional[dict],
              result: dict) -> None:
        self.say(f"\n--- round {number}/{max_rounds} ---")
        self.say("model: " + (reply.content.strip() or prompts.to_json(reply.tool_calls)))
        if action:
            self.say(f"action: {action['tool']} {prompts.to_json(action['args'])}")
        if not (action and action["tool"] in CONTROL_ACTIONS):
            self.say(f"result: {prompts.to_json(result)}")
        self.record("round", round=number, model_output=reply.content, action=action, result=result,
                    latency_ms=reply.latency_ms, usage=reply.usage)

    def end(self, outcome: "RunResult") -> None:
        self.say(f"\n=== {outcome.summary()} ===")
        self.record("end", status=outcome.status, result=outcome.result, rounds=outcome.rounds,
                    usage=outcome.usage, **({"error": outcome.error} if outcome.error else {}))

    def close(self) -> None:
        if self.trace_file:
            self.trace_file.close()


# --- the loop --------------------------------------------------------------------------

EXIT_CODES = {"finished": 0, "failed": 1, "max_rounds": 1, "interrupted": 130}


@dataclass
class RunResult:
    """How a run ended; the command line only formats this."""

    status: str  # finished, failed, max_rounds, error, interrupted
    result: Any = None
    rounds: int = 0
    usage: Dict[str, int] = field(default_factory=dict)
    error: Optional[str] = None
    exception: Optional[BaseException] = field(default=None, repr=False)

    @property
    def exit_code(self) -> int:
        if isinstance(self.exception, AgentStop):
            return self.exception.exit_code
        return EXIT_CODES[self.status]

    def summary(self) -> str:
        """One line on how the run ended, for people."""
        tokens = f", {self.usage['total_tokens']} tokens" if "total_tokens" in self.usage else ""
        return {
            "finished": f"finished after {self.rounds} round(s){tokens}",
            "failed": f"not completed: the model gave up after {self.rounds} round(s): {self.result}",
            "max_rounds": f"not completed: round limit reached after {self.rounds} round(s)",
            "interrupted": f"interrupted after {self.rounds} completed round(s)",
        }.get(self.status, f"error after {self.rounds} round(s): {self.error}")

    def to_json(self) -> dict:
        extra = {"error": self.error} if self.error else {}
        return {"status": self.status, "result": self.result, "rounds": self.rounds,
                "usage": self.usage, **extra}


@dataclass
class Outcome:
    """What executing one reply produced: the result to feed back, or the end of the run."""

    action: Optional[dict]
    result: dict
    ends_run: Optional[str] = None  # "finished" or "failed"
    note: Optional[str] = None


def execute(parsed: Parsed, registry: Dict[str, Tool]) -> Outcome:
    """Run the reply's first action; finish and fail end the run, anything else is a tool call."""
    names = [*registry, *CONTROL_ACTIONS]
    if parsed.problem:
        return Outcome(None, failure("format error: " + parsed.problem),
                       note=prompts.render_format_error(parsed.problem, names))
    action = parsed.actions[0]
    note = prompts.ONE_ACTION_AT_A_TIME.format(count=len(parsed.actions)) if len(parsed.actions) > 1 else None
    control = CONTROL_ACTIONS.get(action["tool"])
    if control:
        problem = check_args(control, action["args"])
        if problem:
            return Outcome(action, failure(f"bad arguments for {control.name}: {problem}",
                                           example=control.example()), note=note)
        value = action["args"]["result" if control is FINISH else "reason"]
        return Outcome(action, {"ok": True, "data": value}, ends_run="finished" if control is FINISH else "failed")
    return Outcome(action, call_tool(action["tool"], action["args"], registry), note=note)


def feed_back(reply: Reply, outcome: Outcome) -> List[dict]:
    """The messages that carry this round into the next request."""
    said = reply.content if reply.content.strip() else prompts.to_json(outcome.action)
    if outcome.action is None:
        answer = outcome.note
    else:
        answer = prompts.render_result(outcome.action, outcome.result)
        if outcome.note:
            answer += "\n" + outcome.note
    return [{"role": "assistant", "content": said}, {"role": "user", "content": answer}]


def add_usage(total: Dict[str, int], usage: Optional[dict]) -> None:
    """Add the endpoint's token counts for one request to the run's totals."""
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = (usage or {}).get(key)
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value


def run(task: str, settings: Settings, ask_model: Callable[[List[dict]], Reply],
        registry: Dict[str, Tool] = REGISTRY, log: Optional[RunLog] = None) -> RunResult:
    """Ask, parse, execute, feed back, until finish, fail, the round limit or a stop."""
    log = log or RunLog()
    messages = [{"role": "system", "content": prompts.render_system_prompt(registry)},
                {"role": "user", "content": prompts.render_task(task)}]
    outcome = RunResult("max_rounds")
    log.start(task, settings)
    try:
        for number in range(1, settings.max_rounds + 1):
            reply = ask_model(messages)
            add_usage(outcome.usage, reply.usage)
            executed = execute(parse_reply(reply), registry)
            outcome.rounds = number
            log.round(number, settings.max_rounds, reply, executed.action, executed.result)
            if executed.ends_run:
                outcome.status, outcome.result = executed.ends_run, executed.result["data"]
                break
            messages += feed_back(reply, executed)
    except AgentStop as stop:
        outcome.status, outcome.error, outcome.exception = stop.status, str(stop), stop
    except KeyboardInterrupt:
        outcome.status = "interrupted"
    log.end(outcome)
    return outcome


# --- the command line ------------------------------------------------------------------

ENVIRONMENT_HELP = f"""environment (also read from ./.env; the real environment wins):
  LLM_API_KEY        bearer key; optional for local servers (no Authorization header then)
  LLM_API_URL        chat-completions URL or base URL ending in /v1 (default {DEFAULT_URL})
  LLM_MODEL          model name (default {DEFAULT_MODEL})
  AGENT_MAX_ROUNDS   default for --max-rounds (6)
  AGENT_RETRIES      default for --retries (3)
  AGENT_DEBUG=1      same as --debug

exit codes: 0 finished, 1 not completed (gave up or round limit), 2 usage or
configuration error, 3 endpoint failed, 130 interrupted"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-demo", description="Run a task with a tool-calling LLM agent loop.",
        epilog=ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", nargs="*", help='what to do, e.g. "compute (12 + 500) * 3"')
    parser.add_argument("--max-rounds", type=int, metavar="N", help="model requests at most (default 6)")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="per model request (default 30)")
    parser.add_argument("--retries", type=int, metavar="N",
                        help="retries on 429, 5xx, dropped connections and timeouts (default 3)")
    parser.add_argument("--trace", metavar="FILE", help="append a JSON Lines record of the run to FILE")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with status, result, rounds, usage; trace to stderr")
    parser.add_argument("--quiet", action="store_true", help="no round-by-round trace; only the result")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def env_int(environment: Dict[str, str], name: str, default: int) -> int:
    value = environment.get(name)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {value!r}") from None


def load_settings(args: argparse.Namespace, environment: Dict[str, str]) -> Settings:
    """Combine flags, the environment and .env into Settings, or raise ConfigError."""
    settings = Settings(
        url=environment.get("LLM_API_URL") or DEFAULT_URL,
        model=environment.get("LLM_MODEL") or DEFAULT_MODEL,
        api_key=environment.get("LLM_API_KEY") or None,
        max_rounds=args.max_rounds if args.max_rounds is not None else env_int(environment, "AGENT_MAX_ROUNDS", 6),
        timeout=args.timeout,
        retries=args.retries if args.retries is not None else env_int(environment, "AGENT_RETRIES", 3),
    )
    if settings.max_rounds < 1:
        raise ConfigError("--max-rounds must be at least 1")
    if settings.timeout <= 0:
        raise ConfigError("--timeout must be more than 0 seconds")
    if settings.retries < 0:
        raise ConfigError("--retries must be 0 or more")
    host = urlsplit(chat_completions_url(settings.url)).hostname
    if not host or urlsplit(settings.url).scheme not in ("http", "https"):
        raise ConfigError(f"LLM_API_URL must be an http(s) URL, got {settings.url!r}")
    if not settings.api_key and host in HOSTS_NEEDING_A_KEY:
        raise ConfigError(f"LLM_API_KEY is not set, and {host} needs one (see .env.example)")
    return settings


def read_environment() -> Dict[str, str]:
    """The environment over ./.env: a variable set in the shell wins."""
    dotenv_file = Path.cwd() / ".env"
    from_file = {k: v for k, v in dotenv_values(dotenv_file).items() if v is not None} if dotenv_file.is_file() else {}
    return {**from_file, **os.environ}


def open_log(human: Optional[TextIO], trace_path: Optional[str], secret: Optional[str]) -> RunLog:
    try:
        return RunLog(human, trace_path, secret)
    except OSError as error:
        raise ConfigError(f"cannot open the trace file: {error}") from None


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    task = " ".join(args.task).strip()
    if not task:
        parser.error("the task is empty: say what the agent should do")
    environment = read_environment()
    debug = args.debug or environment.get("AGENT_DEBUG", "") not in ("", "0")
    human = None if args.quiet else (sys.stderr if args.json else sys.stdout)
    secret = environment.get("LLM_API_KEY") or None
    try:
        settings = load_settings(args, environment)
        log = open_log(human, args.trace, secret)
    except ConfigError as error:
        outcome = RunResult("error", error=str(error), exception=error)
    else:
        client = ModelClient(settings)
        try:
            outcome = run(task, settings, client.ask, log=log)
        finally:
            client.close()
            log.close()
    if debug and outcome.exception and str(outcome.exception):
        traceback.print_exception(type(outcome.exception), outcome.exception, outcome.exception.__traceback__)
    return report(outcome, args, secret)


def report(outcome: RunResult, args: argparse.Namespace, secret: Optional[str]) -> int:
    """Print the outcome the way the flags ask for and return its exit code."""
    if args.json:
        print(redact(json.dumps(outcome.to_json(), ensure_ascii=False), secret))
    elif outcome.status == "finished":
        print(redact(display(outcome.result), secret))
    if outcome.status == "error":
        print(redact(f"agent-demo: error: {outcome.error}", secret), file=sys.stderr)
    elif outcome.status != "finished" and (args.quiet or args.json):
        print(redact(f"agent-demo: {outcome.summary()}", secret), file=sys.stderr)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
