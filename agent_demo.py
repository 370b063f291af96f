"""agent-demo: a minimal agent loop over an OpenAI-compatible chat-completions endpoint.

Read top to bottom: settings, the reasons a run stops, the HTTP client, the
action parser, the loop (with its watchdog), the command line. What is re-sent
each round lives in context.py, the trace and --resume in runlog.py.
"""
import argparse
import json
import math
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, TextIO, Tuple
from urllib.parse import urlsplit

import requests
from dotenv import dotenv_values
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

import prompts
from context import build_messages, digest_line, request_size, shorten_args, strip_think, truncate_result
from runlog import RunLog, TraceWriteError, load_trace, redact
from tools import CONTROL_ACTIONS, FINISH, REGISTRY, Tool, call_tool, check_args, failure

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
    max_tokens: Optional[int] = None  # the run's token budget; None for no cap
    max_context: int = 24_000  # characters a request may carry
    max_result_chars: int = 4_000  # a longer tool result is cut to head and tail
    keep_recent: int = 4  # rounds that stay verbatim when older ones are folded
    mode: str = "json"  # json, schema or tools: how actions are asked for
    max_calls: int = 8  # actions run per reply at most
    approve: bool = False  # ask before every tool call
    yes: bool = False  # never ask, even for tools with side effects


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
    """The endpoint refused, failed or answered with something unusable (exit 3)."""

    def __init__(self, message: str, http_status: Optional[int] = None, server_said: str = ""):
        super().__init__(message)
        self.http_status, self.server_said = http_status, server_said

    def rejects_request_options(self, mode_worked_before: bool) -> bool:
        """Did the endpoint refuse response_format or tools (as opposed to failing for another reason)?"""
        names_them = any(f in self.server_said for f in ("response_format", "json_schema", "tools", "tool_choice"))
        if self.http_status in (400, 422):  # a first request refused, or one that says why
            return names_them or not mode_worked_before
        return bool(self.http_status and self.http_status >= 500 and names_them)


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
                            status_forcelist=RETRY_STATUSES, allowed_methods=None, raise_on_status=False)
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
            response = self.session.post(self.url, json=body, stream=True,
                                         timeout=(min(10.0, self.settings.timeout), self.settings.timeout))
            text = read_body(response, self.settings.timeout)
        except (requests.ConnectionError, requests.Timeout) as error:
            raise EndpointError(f"cannot reach {self.url}: {describe_network_error(error, self.settings)}"
                                f" (after {self.settings.retries} retries)") from None
        except requests.RequestException as error:
            raise EndpointError(f"request to {self.url} failed: {type(error).__name__}") from None
        latency_ms = int((time.monotonic() - started) * 1000)
        if response.status_code >= 400:
            raise EndpointError(describe_http_error(response.status_code, text, self.settings),
                                response.status_code, redact(server_message(text), self.settings.api_key))
        reply = read_reply(text)
        reply.latency_ms = latency_ms
        return reply

    def close(self) -> None:
        self.session.close()


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


def read_body(response: requests.Response, seconds: float) -> str:
    """The whole body, unless it takes longer than `seconds` from sending the request (a trickling server)."""
    deadline = time.monotonic() - response.elapsed.total_seconds() + seconds
    read_some = getattr(response.raw, "read1", None)  # what has arrived, without waiting for a full buffer
    pieces = (iter(lambda: read_some(65536, decode_content=True), b"") if read_some
              else response.iter_content(1024))  # urllib3 1.x has no read1
    chunks = []
    try:
        for chunk in pieces:
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise EndpointError(f"no complete reply within {seconds:g} s (the server is sending too slowly)")
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
        response.close()
        raise EndpointError(f"the connection broke while reading the reply: {type(error).__name__}") from None
    except EndpointError:
        response.close()
        raise
    response.raw.release_conn()  # the whole body is read: the connection goes back to the pool
    return b"".join(chunks).decode(response.encoding or "utf-8", errors="replace")


def parse_body(text: str) -> Any:
    """A body's JSON, made safe to print and to send back: NaN and Infinity become null, and
    lone surrogates (from \\ud800-style escapes) become "?". ValueError if it is not JSON."""
    try:
        body = json.loads(text, parse_constant=lambda name: None,
                          parse_float=lambda number: float(number) if math.isfinite(float(number)) else None)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return json.loads(json.dumps(body, ensure_ascii=False).encode("utf-8", "replace").decode("utf-8"))


def server_message(text: str) -> str:
    """The endpoint's own words about an error, however it shapes them."""
    try:
        body = parse_body(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body.get("message", body.get("detail")))
        if isinstance(error, dict):
            error = error.get("message") or error
        if error:
            text = error if isinstance(error, str) else prompts.to_json(error)
            return _one_line(text)
    return _one_line(text) or "(empty body)"


def _one_line(text: str, limit: int = 300) -> str:
    """A server's words fit for a one-line error: whitespace folded, long text cut."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def describe_http_error(status: int, text: str, settings: Settings) -> str:
    """Name the failed status, what the user can do, and what the server said."""
    message = redact(server_message(text), settings.api_key)
    if status in (401, 403):
        return f"authentication failed (HTTP {status}): {message} - check LLM_API_KEY"
    if status == 404:
        return f"not found (HTTP 404): {message} - check LLM_MODEL ({settings.model}) and LLM_API_URL"
    if status in RETRY_STATUSES:
        return f"HTTP {status} after {settings.retries} retries: {message}"
    return f"request rejected (HTTP {status}): {message}"


def read_reply(text: str) -> Reply:
    """Pull the message out of a chat-completions body, or say why it is unusable."""
    try:
        body = parse_body(text)
    except ValueError:
        snippet = " ".join(text.split())[:200]
        raise EndpointError(f"the endpoint's reply is not JSON: {snippet or '(empty body)'}") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        detail = f": {server_message(text)}" if isinstance(body, dict) and "error" in body else ""
        raise EndpointError(f"the endpoint's reply has no choices{detail}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise EndpointError("the endpoint's reply has no message in its first choice")
    content = message.get("content")
    if isinstance(content, list):  # some servers send content as a list of parts
        content = "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    content = content if isinstance(content, str) else ""
    raw_calls = message.get("tool_calls")
    tool_calls = [call for call in raw_calls if isinstance(call, dict)] if isinstance(raw_calls, list) else []
    if not content.strip() and not tool_calls:
        raise EndpointError("the endpoint's reply has no content and no tool calls"
                            f" (finish_reason: {choices[0].get('finish_reason')})")
    usage = body.get("usage")
    return Reply(content=content, tool_calls=tool_calls, usage=usage if isinstance(usage, dict) else None)


# --- parsing the action -----------------------------------------------------------

# Where an object or an array of objects may start; "{{{{" and "[[[[" in prose are not tried.
_JSON_START = re.compile(r"\{\s*[\"}]|\[\s*\{")
MAX_PARSED_CHARS = 100_000  # an action further into a reply than this is not looked for


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range")
    return value


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


# strict=False: models (and constrained decoders) put raw newlines inside strings.
_DECODER = json.JSONDecoder(strict=False, parse_float=_finite_float, parse_constant=_no_constants)


def json_values(text: str):
    """Yield each top-level JSON object or array in text, left to right."""
    text = text[:MAX_PARSED_CHARS]
    position = 0
    while True:
        match = _JSON_START.search(text, position)
        if not match:
            return
        try:
            value, position = _DECODER.raw_decode(text, match.start())
            yield value
        except (ValueError, RecursionError):  # not JSON, too deep, NaN, or a 5,000-digit number
            position = match.start() + 1


def is_action(value: Any) -> bool:
    """An action is an object with a string "tool"."""
    return isinstance(value, dict) and isinstance(value.get("tool"), str)


@dataclass
class Parsed:
    """The actions found in a reply, or the problem to tell the model."""

    actions: List[dict]
    problem: Optional[str] = None
    native: bool = False  # the actions came from the reply's tool_calls

    def answers_by_id(self, mode: str) -> bool:
        """In tools mode, native calls are answered one role-tool message per tool_call id."""
        return self.native and mode == "tools"


def parse_actions(text: str) -> Parsed:
    """Find the actions in a model's text: action objects, arrays of them, or {"actions": [...]}."""
    actions, saw_json = [], False
    for value in json_values(strip_think(text)):
        saw_json = True
        if isinstance(value, dict) and isinstance(value.get("actions"), list):
            value = value["actions"]  # schema mode's envelope
        if is_action(value):
            actions.append(value)
        elif isinstance(value, list) and value and all(is_action(item) for item in value):
            actions.extend(value)
    if not actions:
        return Parsed([], "found JSON, but no action object with a string \"tool\"" if saw_json
                      else "no JSON object found")
    unique = {}  # a model that writes its action twice (in prose, then in a fence) means it once
    for action in actions:
        unique.setdefault(json.dumps(action, sort_keys=True), {"tool": action["tool"], "args": action.get("args", {})})
    actions = list(unique.values())
    if not isinstance(actions[0]["args"], dict):
        return Parsed([], f"\"args\" of {actions[0]['tool']} must be a JSON object")
    return Parsed(actions)


def parse_tool_calls(tool_calls: List[dict]) -> Parsed:
    """Read native tool_calls as actions; arguments arrive as a JSON string, ids are kept."""
    actions = []
    for number, call in enumerate(tool_calls, 1):
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments") or "{}"
        action = {"tool": str(function.get("name") or ""), "args": {},
                  "id": str(call.get("id") or f"call_{number}"), "arguments": arguments}
        try:
            action["args"] = _DECODER.decode(arguments) if isinstance(arguments, str) else arguments
        except (ValueError, RecursionError):
            action["problem"] = f"the arguments of {action['tool']} are not valid JSON"
        actions.append(action)
    return Parsed(actions, native=True)


def parse_reply(reply: Reply, mode: str = "json") -> Parsed:
    """The actions of a reply: native tool calls first in tools mode, else the text, else its tool calls."""
    if reply.tool_calls and mode == "tools":
        return parse_tool_calls(reply.tool_calls)
    parsed = parse_actions(reply.content)
    if parsed.actions or not reply.tool_calls:
        return parsed
    return parse_tool_calls(reply.tool_calls)


# --- the loop --------------------------------------------------------------------------

EXIT_CODES = {"finished": 0, "failed": 1, "max_rounds": 1, "budget": 1, "stuck": 1, "interrupted": 130}
FORMAT_ERRORS_BEFORE_STUCK = 3
MODES = ("json", "schema", "tools")


@dataclass
class RunResult:
    """How a run ended; the command line only formats this."""

    status: str  # finished, failed, max_rounds, budget, stuck, error, interrupted
    result: Any = None
    rounds: int = 0
    usage: Dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None
    exception: Optional[BaseException] = field(default=None, repr=False)
    calls: List[dict] = field(default_factory=list)  # every call of the run, with its round and result
    progress: List[str] = field(default_factory=list)  # one line per round: its calls and results

    @property
    def exit_code(self) -> int:
        if isinstance(self.exception, AgentStop):
            return self.exception.exit_code
        return EXIT_CODES[self.status]

    def summary(self) -> str:
        """One line on how the run ended, for people."""
        tokens = f", {self.usage['total_tokens']} tokens" if "total_tokens" in self.usage else ""
        if self.usage.get("estimated"):
            tokens += " (partly estimated)"
        return {
            "finished": f"finished after {self.rounds} round(s){tokens}",
            "failed": f"not completed: the model gave up after {self.rounds} round(s): {self.result}",
            "max_rounds": f"not completed: round limit reached after {self.rounds} round(s){tokens}",
            "budget": f"not completed: token budget spent after {self.rounds} round(s){tokens}",
            "stuck": f"not completed: the model is stuck, repeating a call or sending no usable action"
                     f" (round {self.rounds})",
            "interrupted": f"interrupted after {self.rounds} completed round(s)",
        }.get(self.status, f"error after {self.rounds} round(s): {self.error}")

    def to_json(self) -> dict:
        extra = {"error": self.error} if self.error else {}
        return {"status": self.status, "result": self.result, "rounds": self.rounds,
                "usage": self.usage, **extra, "calls": self.calls}


class Watchdog:
    """Notices a model going in circles: the same call again and again, or no action at all."""

    def __init__(self) -> None:
        self.calls: Dict[str, dict] = {}  # canonical call -> {"rounds": [...], "result": first result}
        self.format_errors_in_a_row = 0

    @staticmethod
    def key(action: dict) -> str:
        return json.dumps([action["tool"], action["args"]], sort_keys=True, ensure_ascii=False)

    def earlier(self, action: dict) -> Optional[dict]:
        """What this run already knows about an identical call, or None."""
        return self.calls.get(self.key(action))

    def remember(self, number: int, call: dict) -> None:
        """Count the call; keep its first real result (a cancelled one can be redone)."""
        known = self.calls.setdefault(self.key(call), {"rounds": [], "result": call["result"]})
        known["rounds"].append(number)
        if known["result"].get("cancelled") and not call["result"].get("cancelled"):
            known["result"] = call["result"]

    def count_reply(self, calls: List[dict]) -> None:
        """A reply with no usable call (no action, or only calls with broken arguments) adds to the streak."""
        usable = any(not call.get("format_error") for call in calls)
        self.format_errors_in_a_row = 0 if usable else self.format_errors_in_a_row + 1

    def replay(self, records: List[dict]) -> "Watchdog":
        """Rebuild the state of a resumed run from its round records, as live execution left it."""
        for record in records:
            self.count_reply(record["calls"])
            for call in record["calls"]:
                if call.get("watched"):
                    self.remember(record["round"], call)
        return self


Approver = Callable[[dict], bool]  # asks the user about one call; True runs it


def execute_call(action: dict, registry: Dict[str, Tool], watchdog: Watchdog, number: int,
                 approve: Optional[Approver], settings: Settings) -> dict:
    """Run one action: finish and fail end the run; a repeated call is cached, refused, then stuck."""
    call = {"tool": action["tool"], "args": action["args"]}
    if action.get("problem") or not isinstance(action["args"], dict):
        problem = action.get("problem") or f"\"args\" of {action['tool']} must be a JSON object"
        return {**call, "result": failure(problem), "format_error": True}
    if action["tool"] not in registry and action["tool"] not in CONTROL_ACTIONS:
        return {**call, "result": call_tool(action["tool"], action["args"], registry)}  # unknown tool
    control = CONTROL_ACTIONS.get(action["tool"])
    if control:
        problem = check_args(control, action["args"])
        if problem:
            return {**call, "result": failure(f"bad arguments for {control.name}: {problem}",
                                              example=control.example())}
        value = action["args"]["result" if control is FINISH else "reason"]
        return {**call, "result": {"ok": True, "data": value},
                "ends_run": "finished" if control is FINISH else "failed"}
    earlier = watchdog.earlier(action)
    times = len(earlier["rounds"]) if earlier else 0
    call["watched"] = True
    if times == 0 or times == 1 and earlier["result"].get("cancelled"):  # the user may say yes this time
        call["result"] = run_tool(call, registry, approve, settings)
    elif times == 1:
        call.update(result=earlier["result"], watchdog="cached",
                    note=prompts.render_cached_note(earlier["rounds"][0]))
    elif times == 2:
        call.update(result=failure(prompts.render_refusal(earlier["rounds"])), watchdog="refused")
    else:
        call.update(result=failure(f"stuck: this exact call was already made {times} times"),
                    watchdog="stuck", ends_run="stuck")
    watchdog.remember(number, call)
    return call


def run_tool(call: dict, registry: Dict[str, Tool], approve: Optional[Approver], settings: Settings) -> dict:
    """Call the tool, first asking the user when --approve or the tool's side effects say so."""
    tool = registry.get(call["tool"])
    if tool and (settings.approve or tool.side_effects) and not settings.yes:
        if approve is None:
            return failure(prompts.NO_TERMINAL, cancelled=True)
        if not approve({"tool": call["tool"], "args": call["args"]}):
            return failure(prompts.CANCELLED, cancelled=True)
    return call_tool(call["tool"], call["args"], registry)


def execute(parsed: Parsed, registry: Dict[str, Tool], watchdog: Watchdog, number: int,
            approve: Optional[Approver], settings: Settings) -> List[dict]:
    """Run a reply's actions in order; finish or fail count only last and after calls that all succeeded."""
    calls: List[dict] = []
    this_reply: Dict[str, dict] = {}  # the same call twice in one reply is answered once, not a loop
    for index, action in enumerate(parsed.actions):
        ids = {"id": action["id"]} if "id" in action else {}
        failed = [(n, done["tool"]) for n, done in enumerate(calls, 1) if not done["result"].get("ok")]
        repeat = this_reply.get(Watchdog.key(action)) if isinstance(action["args"], dict) else None
        if repeat:
            calls.append({"tool": action["tool"], "args": action["args"], **ids, "result": repeat["result"],
                          "watchdog": "cached", "note": prompts.SAME_REPLY})
        elif index >= settings.max_calls:
            calls.append({"tool": action["tool"], "args": action["args"], **ids,
                          "result": failure(prompts.OVER_CAP.format(cap=settings.max_calls))})
        elif action["tool"] in CONTROL_ACTIONS and index < len(parsed.actions) - 1:
            calls.append({"tool": action["tool"], "args": action["args"], **ids,
                          "result": failure(prompts.NOT_LAST.format(tool=action["tool"]))})
        elif action["tool"] in CONTROL_ACTIONS and failed:
            calls.append({"tool": action["tool"], "args": action["args"], **ids,
                          "result": failure(prompts.render_after_failure(failed))})
        else:
            calls.append({**execute_call(action, registry, watchdog, number, approve, settings), **ids})
            if isinstance(action["args"], dict):
                this_reply.setdefault(Watchdog.key(action), calls[-1])
    watchdog.count_reply(calls)
    return calls  # one per action: in tools mode every tool_call id gets its answer


def feed_back(parsed: Parsed, calls: List[dict], registry: Dict[str, Tool], settings: Settings,
              mode: str) -> List[dict]:
    """The messages that answer this round: each result, cut to size, labelled with its call."""
    if parsed.problem:
        names = [*registry, *CONTROL_ACTIONS]
        return [{"role": "user", "content": prompts.render_format_error(parsed.problem, names, mode)}]
    lines = [prompts.render_call_result(n, {**call, "args": shorten_args(call["args"])},
                                        truncate_result(call["result"], settings.max_result_chars))
             for n, call in enumerate(calls, 1)]
    if parsed.answers_by_id(mode):  # every tool_call id gets its own answer
        return [{"role": "tool", "tool_call_id": call["id"], "content": line} for call, line in zip(calls, lines)]
    return [{"role": "user", "content": prompts.render_results(lines)}]


def count_usage(reply: Reply, messages: List[dict]) -> Tuple[dict, bool]:
    """The round's token counts: the endpoint's, or an estimate (about 4 characters a token)."""
    usage = reply.usage or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(usage.get("total_tokens"), int):
        return usage, False
    if isinstance(prompt, int) and isinstance(completion, int):
        return {**usage, "total_tokens": prompt + completion}, False
    prompt = request_size(messages) // 4
    completion = (len(reply.content) + (len(prompts.to_json(reply.tool_calls)) if reply.tool_calls else 0)) // 4
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}, True


def add_usage(total: Dict[str, Any], record: dict) -> None:
    """Add one round's token counts to the run's totals."""
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = (record.get("usage") or {}).get(key)
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value
    if record.get("usage_estimated"):
        total["estimated"] = True


@dataclass
class Conversation:
    """What every request is built from: the pinned goal, the mode, the rounds so far."""

    task: str
    registry: Dict[str, Tool]
    settings: Settings
    mode: str = "json"
    mode_worked: bool = False  # the endpoint has answered a request in this mode

    def messages(self, records: List[dict]) -> List[dict]:
        """The messages for the next request; with the rest of the body they fit --max-context."""
        pinned = [{"role": "system", "content": prompts.render_system_prompt(
                      self.registry, self.mode, self.settings.max_calls)},
                  {"role": "user", "content": prompts.render_task(self.task)}]
        return build_messages(pinned, records, self.settings.max_context - self.body_size([]),
                              self.settings.keep_recent, self.settings.max_result_chars,
                              native_tools=self.mode == "tools")

    def body_size(self, messages: List[dict]) -> int:
        """Characters of the whole request body as it goes on the wire."""
        return len(json.dumps({"model": self.settings.model, "messages": messages, **self.options()}))

    def options(self) -> dict:
        return prompts.request_options(self.mode, self.registry, self.settings.max_calls)


def ask(ask_model: Callable[..., Reply], conversation: Conversation, records: List[dict],
        log: RunLog) -> Tuple[Reply, List[dict]]:
    """Send the conversation; if the endpoint rejects this mode's schema or tools, fall back to json once."""
    messages = conversation.messages(records)
    try:
        reply = ask_model(messages, **conversation.options())
        conversation.mode_worked = True
        return reply, messages
    except EndpointError as error:
        if conversation.mode == "json" or not error.rejects_request_options(conversation.mode_worked):
            raise
        log.fallback(conversation.mode, "json", str(error))
        conversation.mode = "json"
        messages = conversation.messages(records)
        return ask_model(messages), messages


def run(task: str, settings: Settings, ask_model: Callable[..., Reply],
        registry: Dict[str, Tool] = REGISTRY, log: Optional[RunLog] = None,
        history: List[dict] = (), approve: Optional[Approver] = None) -> RunResult:
    """Ask, parse, execute, feed back, until finish, fail, a limit or a stop; history resumes a run."""
    log = log or RunLog()
    conversation = Conversation(task, registry, settings, settings.mode,
                                mode_worked=any(record.get("mode") == settings.mode for record in history))
    records, watchdog = list(history), Watchdog().replay(history)
    outcome = RunResult("max_rounds", rounds=len(records))
    for record in records:
        add_usage(outcome.usage, record)
    url = chat_completions_url(settings.url)
    limits = {"max_rounds": settings.max_rounds, "max_tokens": settings.max_tokens, "mode": settings.mode,
              "max_calls": settings.max_calls, "tools": list(registry), "approve": settings.approve}
    try:
        if history:
            log.resume(task, settings.model, url, len(records), limits)
        else:
            log.start(task, settings.model, url, limits)
        if settings.approve and not settings.yes and approve is None:
            log.note("--approve: there is no terminal to ask, so every tool call will be refused")
        bare = conversation.body_size(conversation.messages([]))
        if bare > settings.max_context // 2:
            raise ConfigError(f"--max-context {settings.max_context} is too small: the system prompt,"
                              f" task and tool schemas alone take {bare} characters")
        for number in range(len(records) + 1, settings.max_rounds + 1):
            if settings.max_tokens is not None and outcome.usage.get("total_tokens", 0) >= settings.max_tokens:
                outcome.status = "budget"
                break
            reply, messages = ask(ask_model, conversation, records, log)
            log.reply(number, settings.max_rounds, reply)
            parsed = parse_reply(reply, conversation.mode)
            calls = execute(parsed, registry, watchdog, number, approve, settings)
            record = make_record(number, reply, messages, parsed, calls,
                                 feed_back(parsed, calls, registry, settings, conversation.mode), conversation.mode)
            records.append(record)
            outcome.rounds = number
            add_usage(outcome.usage, record)
            log.round(record)
            ending = next((call for call in calls if call.get("ends_run")), None)
            if watchdog.format_errors_in_a_row >= FORMAT_ERRORS_BEFORE_STUCK or (ending and ending["ends_run"] == "stuck"):
                outcome.status = "stuck"
                break
            if ending:
                outcome.status, outcome.result = ending["ends_run"], ending["result"]["data"]
                break
    except TraceWriteError as error:  # the user asked for a record the run can no longer keep
        stop = ConfigError(str(error))
        outcome.status, outcome.error, outcome.exception = stop.status, str(stop), stop
    except AgentStop as stop:
        outcome.status, outcome.error, outcome.exception = stop.status, str(stop), stop
    except KeyboardInterrupt:
        outcome.status = "interrupted"
    outcome.calls = [{"round": record["round"], "tool": call["tool"], "args": call["args"], "result": call["result"]}
                     for record in records for call in record["calls"]]
    if outcome.status not in ("finished", "failed"):  # what was done, for a run cut short
        outcome.progress = [digest_line(record, 200) for record in records]
    log.end(outcome)
    return outcome


def make_record(number: int, reply: Reply, messages: List[dict], parsed: Parsed, calls: List[dict],
                feedback: List[dict], mode: str) -> dict:
    """One round as the trace file keeps it: enough to show it, and to rebuild the conversation."""
    usage, estimated = count_usage(reply, messages)
    record = {"round": number, "model_output": reply.content,
              "action": {"tool": calls[0]["tool"], "args": calls[0]["args"]} if calls else None,
              "result": calls[0]["result"] if calls else failure("format error: " + parsed.problem),
              "calls": calls, "feedback": feedback, "mode": mode,
              "latency_ms": reply.latency_ms, "usage": usage, "usage_estimated": estimated}
    if parsed.answers_by_id(mode):  # re-sent as the model wrote them, broken arguments too
        record["tool_calls"] = [{"id": action["id"], "type": "function", "function": {
            "name": action["tool"], "arguments": action["arguments"] if isinstance(action["arguments"], str)
            else prompts.to_json(action["arguments"])}} for action in parsed.actions]
    return record


# --- the command line ------------------------------------------------------------------

ENVIRONMENT_HELP = f"""environment (also read from ./.env; the real environment wins):
  LLM_API_KEY             bearer key; optional for local servers (no Authorization header then)
  LLM_API_URL             chat-completions URL or base URL ending in /v1 (default {DEFAULT_URL})
  LLM_MODEL               model name (default {DEFAULT_MODEL})
  AGENT_MAX_ROUNDS        default for --max-rounds (6)
  AGENT_MAX_TOKENS        default for --max-tokens (no cap)
  AGENT_MAX_CONTEXT       default for --max-context (24000)
  AGENT_MAX_RESULT_CHARS  a longer tool result is cut to head and tail (4000)
  AGENT_KEEP_RECENT       rounds kept verbatim when older ones are folded (4)
  AGENT_MODE              default for --mode (json)
  AGENT_MAX_CALLS         default for --max-calls (8)
  AGENT_RETRIES           default for --retries (3)
  AGENT_DEBUG=1           same as --debug

exit codes: 0 finished; 1 not completed (gave up, round limit, token budget,
stuck); 2 usage or configuration error; 3 endpoint failed; 130 interrupted"""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error under --json still prints the one JSON object on stdout."""

    json_output = False

    def error(self, message: str):
        if self.json_output:
            print(json.dumps(RunResult("error", error=f"usage: {message}").to_json()))
        super().error(message)  # usage and the message on stderr, exit 2


def build_parser() -> Parser:
    parser = Parser(
        prog="agent-demo", description="Run a task with a tool-calling LLM agent loop.",
        epilog=ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", nargs="*", help='what to do, e.g. "compute (12 + 500) * 3"')
    parser.add_argument("--max-rounds", type=int, metavar="N",
                        help="model requests at most, across resumes (default 6)")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help="stop before the next request once the run has used N tokens (default: no cap)")
    parser.add_argument("--max-context", type=int, metavar="CHARS",
                        help="fold the oldest rounds into a digest to keep each request under CHARS (default 24000)")
    parser.add_argument("--mode", choices=MODES,
                        help="how actions are asked for: json in the text, json constrained by a schema,"
                             " or native tool calls (default json)")
    parser.add_argument("--max-calls", type=int, metavar="N", help="actions run per reply at most (default 8)")
    parser.add_argument("--tools", metavar="NAME,NAME",
                        help=f"expose only these tools (available: {', '.join(REGISTRY)}); finish and fail always")
    parser.add_argument("--approve", action="store_true", help="ask y/N on the terminal before each tool call")
    parser.add_argument("--yes", action="store_true",
                        help="run every call without asking, even tools marked as having side effects")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="per model request (default 30)")
    parser.add_argument("--retries", type=int, metavar="N",
                        help="retries on 429, 5xx, dropped connections and timeouts (default 3)")
    parser.add_argument("--trace", metavar="FILE", help="append a JSON Lines record of the run to FILE")
    parser.add_argument("--resume", metavar="TRACE",
                        help="continue the unfinished run recorded in TRACE, appending to it")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object with status, result, rounds, usage, calls (and error);"
                             " the trace goes to stderr")
    parser.add_argument("--quiet", action="store_true", help="no round-by-round trace; only the result")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def setting(flag: Optional[int], environment: Dict[str, str], name: str, default: Optional[int]) -> Optional[int]:
    """A whole-number setting: the flag, else the environment variable, else the default."""
    if flag is not None:
        return flag
    value = environment.get(name)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {value!r}") from None


def load_settings(args: argparse.Namespace, environment: Dict[str, str]) -> Settings:
    """Combine flags, the environment and .env into Settings, or raise ConfigError."""
    default = Settings()
    settings = Settings(
        url=environment.get("LLM_API_URL") or DEFAULT_URL,
        model=environment.get("LLM_MODEL") or DEFAULT_MODEL,
        api_key=(environment.get("LLM_API_KEY") or "").strip() or None,  # a CRLF .env leaves a \r
        max_rounds=setting(args.max_rounds, environment, "AGENT_MAX_ROUNDS", default.max_rounds),
        timeout=args.timeout,
        retries=setting(args.retries, environment, "AGENT_RETRIES", default.retries),
        max_tokens=setting(args.max_tokens, environment, "AGENT_MAX_TOKENS", default.max_tokens),
        max_context=setting(args.max_context, environment, "AGENT_MAX_CONTEXT", default.max_context),
        max_result_chars=setting(None, environment, "AGENT_MAX_RESULT_CHARS", default.max_result_chars),
        keep_recent=setting(None, environment, "AGENT_KEEP_RECENT", default.keep_recent),
        mode=args.mode or environment.get("AGENT_MODE") or "json",
        max_calls=setting(args.max_calls, environment, "AGENT_MAX_CALLS", default.max_calls),
        approve=args.approve, yes=args.yes,
    )
    if settings.mode not in MODES:
        raise ConfigError(f"AGENT_MODE must be one of {', '.join(MODES)}, got {settings.mode!r}")
    if settings.max_calls < 1:
        raise ConfigError("--max-calls must be at least 1")
    if settings.max_rounds < 1:
        raise ConfigError("--max-rounds (AGENT_MAX_ROUNDS) must be at least 1")
    if settings.timeout <= 0:
        raise ConfigError("--timeout must be more than 0 seconds")
    if settings.retries < 0:
        raise ConfigError("--retries must be 0 or more")
    if settings.max_tokens is not None and settings.max_tokens < 1:
        raise ConfigError("--max-tokens must be at least 1")
    if settings.max_result_chars < 200:
        raise ConfigError("AGENT_MAX_RESULT_CHARS must be at least 200")
    if settings.keep_recent < 0:
        raise ConfigError("AGENT_KEEP_RECENT must be 0 or more")
    host = urlsplit(chat_completions_url(settings.url)).hostname
    if not host or urlsplit(settings.url).scheme not in ("http", "https"):
        raise ConfigError(f"LLM_API_URL must be an http(s) URL, got {settings.url!r}")
    if settings.api_key and not re.fullmatch(r"[\x21-\x7e]+", settings.api_key):
        raise ConfigError("LLM_API_KEY holds spaces or characters that cannot go in an HTTP header;"
                          " check for a stray quote, zero-width space or non-ASCII character")
    if not settings.api_key and host in HOSTS_NEEDING_A_KEY:
        raise ConfigError(f"LLM_API_KEY is not set, and {host} needs one (see .env.example)")
    return settings


def read_environment() -> Dict[str, str]:
    """The environment over ./.env: a variable set in the shell wins."""
    dotenv_file = Path.cwd() / ".env"
    try:
        values = dotenv_values(dotenv_file) if dotenv_file.is_file() else {}
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {dotenv_file}: {error}") from None
    return {**{k: v for k, v in values.items() if v is not None}, **os.environ}


def allowed_tools(names: Optional[str]) -> Dict[str, Tool]:
    """The registry cut down to --tools NAME,NAME; an unknown name is a usage error."""
    if names is None:
        return REGISTRY
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in REGISTRY and name not in CONTROL_ACTIONS]
    if unknown:
        raise ConfigError(f"--tools: unknown tool {', '.join(unknown)} (available: {', '.join(REGISTRY)})")
    return {name: tool for name, tool in REGISTRY.items() if name in wanted}


def terminal_approver(secret: Optional[str]) -> Optional[Approver]:
    """Ask y/N about each call on the terminal the user types into; None when stdin is no terminal."""
    if sys.stdin is None or not sys.stdin.isatty():
        return None

    def approve(call: dict) -> bool:
        try:  # the terminal itself, so the question shows even with stdout and stderr redirected
            terminal = open(os.ttyname(sys.stdin.fileno()), "w", encoding="utf-8")
        except OSError:
            terminal = sys.stderr
        terminal.write(redact(f"approve {call['tool']} {prompts.to_json(call['args'])}? [y/N] ", secret))
        terminal.flush()
        answer = sys.stdin.readline()
        if not answer:  # Ctrl-D: end the line the question left open
            terminal.write("\n")
        if terminal is not sys.stderr:
            terminal.close()
        return answer.strip().lower() in ("y", "yes")
    return approve


def prepare(args: argparse.Namespace, task: str,
            environment: Dict[str, str]) -> Tuple[Settings, Dict[str, Tool], str, List[dict], str]:
    """Settings, the tools, the task, the rounds already done and the trace path, or ConfigError."""
    settings, registry = load_settings(args, environment), allowed_tools(args.tools)
    if not args.resume:
        return settings, registry, task, [], args.trace
    if task:
        raise ConfigError("--resume continues the task recorded in the trace; give no task with it")
    if args.trace and os.path.abspath(args.trace) != os.path.abspath(args.resume):
        raise ConfigError("--resume appends to its own trace file; --trace cannot name another one")
    try:
        start, rounds = load_trace(args.resume)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    # The run's own settings hold across resumes unless the user gives them again.
    def recorded(flag: Any, variable: str, key: str, valid: Callable[[Any], bool]) -> bool:
        return flag is None and not environment.get(variable) and valid(start.get(key))
    whole = lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 1  # noqa: E731
    for key, flag, variable in [("max_rounds", args.max_rounds, "AGENT_MAX_ROUNDS"),
                                ("max_tokens", args.max_tokens, "AGENT_MAX_TOKENS"),
                                ("max_calls", args.max_calls, "AGENT_MAX_CALLS")]:
        if recorded(flag, variable, key, whole):
            setattr(settings, key, start[key])
    if recorded(args.mode, "AGENT_MODE", "mode", lambda mode: mode in MODES):
        settings.mode = start["mode"]
    if recorded(args.tools, "", "tools", lambda names: isinstance(names, list)):
        registry = {name: tool for name, tool in REGISTRY.items() if name in start["tools"]}
    settings.approve = settings.approve or start.get("approve") is True  # only --yes lifts it on resume
    return settings, registry, start["task"], rounds, args.resume


def open_log(human: Optional[TextIO], trace_path: Optional[str], secret: Optional[str]) -> RunLog:
    try:
        return RunLog(human, trace_path, secret)
    except OSError as error:
        raise ConfigError(f"cannot open the trace file: {error}") from None


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    parser.json_output = "--json" in (sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    task = " ".join(args.task).strip()
    if not task and not args.resume:
        parser.error("the task is empty: say what the agent should do")
    try:
        environment = read_environment()
    except ConfigError as error:
        return report(RunResult("error", error=str(error), exception=error), args, None)
    debug = args.debug or environment.get("AGENT_DEBUG", "") not in ("", "0")
    human = None if args.quiet else (sys.stderr if args.json else sys.stdout)
    secret = (environment.get("LLM_API_KEY") or "").strip() or None
    try:
        settings, registry, task, history, trace_path = prepare(args, task, environment)
        log = open_log(human, trace_path, secret)
    except ConfigError as error:
        outcome = RunResult("error", error=str(error), exception=error)
    else:
        client = ModelClient(settings)
        approve = terminal_approver(secret)
        try:
            outcome = run(task, settings, client.ask, registry=registry, log=log, history=history,
                          approve=approve)
        finally:
            client.close()
            log.close()
    if debug and outcome.exception and str(outcome.exception):
        error = outcome.exception
        print(redact("".join(traceback.format_exception(type(error), error, error.__traceback__)), secret),
              file=sys.stderr, end="")
    return report(outcome, args, secret)


def report(outcome: RunResult, args: argparse.Namespace, secret: Optional[str]) -> int:
    """Print the outcome the way the flags ask for and return its exit code."""
    if args.json:
        print(redact(json.dumps(outcome.to_json(), ensure_ascii=False), secret))
    elif outcome.status == "finished":
        print(redact(display(outcome.result), secret))
    if outcome.status == "error":
        print(redact(f"agent-demo: error: {outcome.error}", secret), file=sys.stderr)
    elif outcome.status != "finished" and args.quiet:  # otherwise the trace ended with it
        lines = [f"agent-demo: {outcome.summary()}", *(f"  {line}" for line in outcome.progress)]
        print(redact("\n".join(lines), secret), file=sys.stderr)
    return outcome.exit_code


def display(value: Any) -> str:
    """A result as people read it: text as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


if __name__ == "__main__":
    sys.exit(main())
