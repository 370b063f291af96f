"""Settings: what a run needs to know, each defined once (its default, flag, variables, check and
help), loaded from what the caller gave (flags, or `agent_demo.run` keywords) and the environment
(environment.py), checked once, and never changed after. It imports endings, limits and urls."""
import copy
import difflib
import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from agent_demo_kit.endings import ConfigError
from agent_demo_kit.limits import MIN_RESULT_CHARS
from agent_demo_kit.urls import chat_completions_url, display_url, proxy_problem, url_problem

MODES = ("json", "schema", "tools")
# Hosted endpoints that always need a key: without one, fail before any request.
HOSTS_NEEDING_A_KEY = {"api.openai.com", "api.deepseek.com", "dashscope.aliyuncs.com",
                       "dashscope-intl.aliyuncs.com"}
MAX_TIMEOUT = 86_400.0  # a day; beyond that a socket cannot take it
HOSTED_PARALLEL = 4  # a batch's tasks at once against a hosted endpoint, unless --parallel says otherwise
DEFAULT_RETRY_ERRORS = 1  # a batch task that ended in an endpoint error is run again once (from its trace)
MATCHES = ("exact", "includes", "number", "regex")  # how a batch scores an answer, besides the default
MOST_TRIES = 1000  # --repeat at most


# --- the checks a flag and its variable go through ----------------------------------------------

def otlp_url(text: str) -> str:
    """An http(s) URL of an OpenTelemetry collector; ValueError otherwise."""
    if urlsplit(text.strip()).scheme not in ("http", "https") or not urlsplit(text.strip()).hostname:
        raise ValueError(f"must be an http(s) URL, got {display_url(text)!r}")
    return text.strip()


def seconds(text: str) -> float:
    """A finite number of seconds, more than 0; ValueError otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT):
        raise ValueError(f"must be a number of seconds more than 0 and at most {MAX_TIMEOUT:g}, got {text!r}")
    return value


def whole_number(least: int, most: Optional[int] = None) -> Callable[[str], int]:
    """A parser for a whole number of at least `least` (and at most `most`); ValueError otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be a whole number, got {text!r}") from None
        if value < least:
            raise ValueError(f"must be at least {least}, got {value}")
        if most is not None and value > most:
            raise ValueError(f"must be at most {most:,}, got {value}")
        return value
    parse.__name__ = f"whole number of at least {least}"  # what argparse names in its error
    return parse


def shard_of_n(text: str) -> Tuple[int, int]:
    """--shard I/N: the I-th (from 0) of N slices; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 0 <= int(match[1]) < int(match[2]):
        raise ValueError(f"must be I/N with 0 <= I < N (a Slurm array index or a Kubernetes completion index"
                         f" from 0), got {text!r}")
    return int(match[1]), int(match[2])


def pass_rate(text: str) -> float:
    """--pass-rate: a share of tasks from 0 to 1 (or a percentage such as 90%)."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise ValueError(f"must be a share from 0 to 1 (or a percentage, 90%), got {text!r}")
    return value


def significance(text: str) -> float:
    """--significance: a level between 0 and 1, both left out (0.05, or 5%)."""
    try:
        value = pass_rate(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise ValueError(f"must be a level between 0 and 1 (such as 0.05, or 5%), got {text!r}")
    return value


MOST_RETRIES = 1_000  # past about 1,024 the back-off requests' urllib3 works out is too large a float
MOST_A_PRICE = 1_000_000  # dollars per million tokens: more is a typo (1e308), and would make the cost infinite


def token_price(text: str) -> Tuple[float, float, Optional[float]]:
    """--price IN,OUT[,CACHED]: dollars per million input, output (and cached input) tokens."""
    parts = [part.strip() for part in text.split(",")]
    try:
        values = [float(part) for part in parts]
    except ValueError:
        values = []
    if len(values) not in (2, 3) or not all(0 <= value <= MOST_A_PRICE for value in values):
        raise ValueError(f"must be IN,OUT or IN,OUT,CACHED: dollars per million input, output and cached input"
                         f" tokens (each at most {MOST_A_PRICE:,}), such as 0.15,0.60; got {text!r}")
    return values[0], values[1], values[2] if len(values) == 3 else None


ESCALATION_TRIGGERS = ("format", "stuck", "check", "length", "endpoint")


def trigger_names(text: str) -> List[str]:
    """--escalate-on: a comma-separated list of triggers, or none; ValueError for an unknown one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"must name triggers among {','.join(ESCALATION_TRIGGERS)} (or none), got {text!r}")
    if names == ["none"]:
        return []
    unknown = [name for name in names if name not in ESCALATION_TRIGGERS]
    if unknown:
        raise ValueError(f"must name triggers among {','.join(ESCALATION_TRIGGERS)} (or none), got {unknown[0]!r}")
    return list(dict.fromkeys(names))


def mode_name(text: str) -> str:
    if text not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}, got {text!r}")
    return text


def setting(default: Any, help: str, flag: Optional[str] = None, variables: tuple = (),
            parse: Optional[Callable] = None, resume: bool = True, metavar: Optional[str] = None,
            shown: Optional[str] = None, short: Optional[str] = None, **options: Any) -> Any:
    """A Settings field and everything about it: its default, its flag (and short flag) and variables
    (the first set wins), the check both go through, its help, how its default is shown when it is
    not a value (`shown`), and whether a resume keeps the run's recorded value."""
    return field(default_factory=lambda: copy.copy(default), **options,
                 metadata={"flag": flag, "variables": variables, "parse": parse, "resume": resume, "help": help,
                           "metavar": metavar, "shown": shown, "short": short})


@dataclass(frozen=True)
class Settings:
    """Everything a run needs to know. A field marked resume is recorded in the trace's start
    record and restored by --resume unless given again."""

    url: str = setting("https://api.openai.com/v1/chat/completions",
                       "chat-completions URL or base URL ending in /v1", "--url", ("LLM_API_URL", "OPENAI_BASE_URL"),
                       metavar="URL")
    model: str = setting("gpt-4o-mini", "model name; with --batch, again for each model to compare", "--model", ("LLM_MODEL",), metavar="NAME", short="-m")
    api_key: Optional[str] = setting(None, "bearer key; optional for local servers (no Authorization header then)",
                                     variables=("LLM_API_KEY", "OPENAI_API_KEY"), resume=False, repr=False,
                                     shown="none")
    mode: str = setting("json", "how actions are asked for: json in the text, json constrained by a schema,"
                        " or native tool calls", "--mode", ("AGENT_MODE",), mode_name, metavar="{json,schema,tools}")
    max_rounds: int = setting(6, "model requests at most, across resumes", "--max-rounds", ("AGENT_MAX_ROUNDS",),
                              whole_number(1), metavar="N")
    max_tokens: Optional[int] = setting(None, "token budget of the whole run: stop before the next request once"
                                        " the run has used N tokens", "--max-tokens", ("AGENT_MAX_TOKENS",),
                                        whole_number(1), metavar="N", shown="no cap")
    max_reply_tokens: int = setting(4096, "cap on each reply, sent to the endpoint as max_tokens; 0 sends none",
                                    "--max-reply-tokens", ("AGENT_MAX_REPLY_TOKENS",), whole_number(0), metavar="N")
    max_context: Optional[int] = setting(None, "fold the oldest rounds into a digest to keep each request under"
                                         " CHARS", "--max-context", ("AGENT_MAX_CONTEXT",), whole_number(1),
                                         metavar="CHARS", shown="the model's window")
    max_result_chars: int = setting(4_000, f"a longer tool result is cut to head and tail; at least {MIN_RESULT_CHARS}",
                                    variables=("AGENT_MAX_RESULT_CHARS",), parse=whole_number(MIN_RESULT_CHARS))
    keep_recent: int = setting(4, "rounds kept verbatim when older ones are folded",
                               variables=("AGENT_KEEP_RECENT",), parse=whole_number(0))
    max_calls: int = setting(8, "actions run per reply at most", "--max-calls", ("AGENT_MAX_CALLS",),
                             whole_number(1), metavar="N")
    tool_names: Optional[List[str]] = setting(None, "expose only these tools (none: no tool, only the answer);"
                                              " finish, fail, recall and note always", "--tools", metavar="NAME,NAME", resume=False, shown="all")
    tools_files: List[str] = setting([], "make each public function in the Python file PATH a tool; repeatable",
                                     "--tools-file", metavar="PATH", shown="none")
    mcp_servers: List[str] = setting([], "add the tools of an MCP server: a command run over stdio, or an"
                                     " http(s):// URL; repeatable; needs pip install 'agent-demo[mcp]'",
                                     "--mcp", metavar="SERVER", shown="none")
    mcp_config: Optional[str] = setting(None, 'add the tools of each server in an {"mcpServers": {...}} JSON file',
                                        "--mcp-config", metavar="FILE", shown="none")
    tool_timeout: float = setting(60.0, "answer a tool call still running after SECONDS as an error",
                                  "--tool-timeout", ("AGENT_TOOL_TIMEOUT",), seconds, metavar="SECONDS")
    check: Optional[str] = setting(None, "accept a finish only when COMMAND exits 0, with the answer on its stdin"
                                   " and in AGENT_ANSWER, the task in AGENT_TASK; otherwise its output goes back"
                                   " to the model", "--check", ("AGENT_CHECK",), metavar="COMMAND", shown="none")
    check_attempts: int = setting(3, "end the run as failed after N answers --check rejected", "--check-attempts",
                                  ("AGENT_CHECK_ATTEMPTS",), whole_number(1), metavar="N")
    approve: bool = setting(False, "ask y/N/a on the terminal before each tool call (a: yes to that tool from"
                            " then on); a resume keeps it on", "--approve", shown="off")
    yes: bool = setting(False, "run every call without asking, even tools marked as having side effects",
                        "--yes", resume=False, shown="off")
    timeout: float = setting(30.0, "the longest silence from the endpoint: no byte at all, before the reply or"
                             " within it (a keep-alive is a byte: it keeps a reply alive, up to --reply-deadline)",
                             "--timeout", ("AGENT_TIMEOUT",), seconds, metavar="SECONDS")
    reply_deadline: float = setting(1800.0, "the longest one reply may take, from the request to its last piece,"
                                    " keep-alives and all: a local server reading a long prompt is waited for, an"
                                    " endless stream is not", "--reply-deadline", ("AGENT_REPLY_DEADLINE",), seconds,
                                    metavar="SECONDS")
    retries: int = setting(3, "retries on 429, 5xx, dropped connections and timeouts", "--retries",
                           ("AGENT_RETRIES",), whole_number(0, MOST_RETRIES), metavar="N")
    max_retry_wait: float = setting(30.0, "the longest wait before a retry, in seconds",
                                    variables=("AGENT_MAX_RETRY_WAIT",), parse=seconds)
    stream: bool = setting(True, "ask for the reply as server-sent events (an endpoint that refuses it is asked"
                           " without it)", "--stream", resume=False, shown="on")
    escalate: Optional[str] = setting(None, "a stronger model that takes over when the first is in trouble, on the"
                                      " same endpoint unless --escalate-url", "--escalate", ("LLM_ESCALATE_MODEL",),
                                      metavar="MODEL", shown="none")
    escalate_url: Optional[str] = setting(None, "the stronger model's endpoint (its key: LLM_ESCALATE_KEY)",
                                          "--escalate-url", ("LLM_ESCALATE_URL",), metavar="URL",
                                          shown="the first model's")
    escalate_key: Optional[str] = setting(None, "the stronger model's bearer key when --escalate-url is another"
                                          " endpoint (on the same one, the first model's key)",
                                          variables=("LLM_ESCALATE_KEY",), resume=False, repr=False, shown="none")
    escalate_on: List[str] = setting(list(ESCALATION_TRIGGERS), "what hands the run to the stronger model: format"
                                     " (no usable action 3 times in a row), stuck (a call repeated), check (--check"
                                     " rejected an answer), length (2 replies in a row cut at the cap), endpoint"
                                     " (the first model's endpoint failed); or none", "--escalate-on",
                                     ("AGENT_ESCALATE_ON",), trigger_names, metavar="LIST", shown="all")
    escalate_back: int = setting(3, "good rounds in a row after which the first model takes over again; 0: never",
                                 "--escalate-back", ("AGENT_ESCALATE_BACK",), whole_number(0), metavar="N")
    escalate_max: int = setting(2, "escalations in a run at most; after the last, the stronger model keeps the run",
                                "--escalate-max", ("AGENT_ESCALATE_MAX",), whole_number(1), metavar="N")
    price: Optional[Tuple[float, float, Optional[float]]] = setting(
        None, "dollars per million input and output tokens (and cached input tokens), for the cost in --json and"
        " batch results; no price is built in", "--price", ("AGENT_PRICE",), token_price, resume=False,
        metavar="IN,OUT[,CACHED]", shown="none")
    escalate_price: Optional[Tuple[float, float, Optional[float]]] = setting(
        None, "the --escalate model's price, as --price", "--escalate-price", ("LLM_ESCALATE_PRICE",), token_price,
        resume=False, metavar="IN,OUT[,CACHED]", shown="none")
    otel: Optional[str] = setting(
        None, "send each run's OpenTelemetry spans (the GenAI conventions) to this OTLP/HTTP collector, the base URL"
        " (/v1/traces is added); needs pip install 'agent-demo[otel]'", "--otel", ("OTEL_EXPORTER_OTLP_ENDPOINT",),
        otlp_url, resume=False, metavar="URL", shown="none")
    backoff_factor: float = setting(0.5, "waits 0, 1, 2, 4 ... seconds between retries", resume=False)
    sources: Dict[str, str] = setting({}, "where each setting came from, for messages", resume=False)

    @property
    def endpoint(self) -> str:
        """The chat-completions URL requests are sent to."""
        return chat_completions_url(self.url)

    def stronger(self) -> "Settings":
        """The settings the --escalate model is asked with: its model and endpoint, and the key for that
        endpoint: LLM_ESCALATE_KEY, else the first model's key when it is the first model's endpoint
        (never sent to another one)."""
        url = self.escalate_url or self.url
        same = chat_completions_url(url) == self.endpoint
        key = self.escalate_key or (self.api_key if same else None)

        def given(name: str) -> str:  # how the user gave it, for what an error tells them to check
            source = self.sources.get(name, "default")
            return flag_name(name) if source in ("default", "the resumed run") else source
        sources = {**self.sources, "model": given("escalate"),
                   "url": given("escalate_url") if self.escalate_url else self.sources.get("url", "default"),
                   "api_key": "LLM_ESCALATE_KEY" if self.escalate_key or not same else self.sources.get("api_key",
                                                                                                          "default")}
        return replace(self, model=(self.escalate or "").strip(), url=url, api_key=key, escalate=None, sources=sources,
                       price=self.escalate_price)

    def prices(self) -> Dict[str, Tuple[float, float, Optional[float]]]:
        """Each model's price (--price, --escalate-price), by model name."""
        prices = {self.model: self.price} if self.price else {}
        if self.escalate and self.escalate_price:
            prices[self.escalate.strip()] = self.escalate_price
        return prices

    def named(self, name: str) -> str:
        """How the user gave a setting, for a message about it: its flag, its keyword or its variable (its
        flag when it holds its default or the resumed run's value)."""
        source = self.sources.get(name, "default")
        return flag_name(name) if source in ("default", "the resumed run") else source


# What a trace never restores on its own, since it starts a process, loads a file or chooses where
# requests (and a key) go (--escalate sends the stronger model's): a resume takes them from its
# command line, or asks.
OBEYED_ONLY_WHEN_GIVEN = ("url", "check", "tools_files", "mcp_servers", "mcp_config", "escalate", "escalate_url")


def setting_fields() -> List[Any]:
    """The settings a caller may give, in order (not `sources`)."""
    return [item for item in fields(Settings) if item.name != "sources"]


def _field(name: str) -> Any:
    return next(item for item in fields(Settings) if item.name == name)


def shown_default(item: Any) -> str:
    """A setting's default as --help and the README show it."""
    if item.metadata["shown"] is not None:
        return item.metadata["shown"]
    default = item.default_factory()
    return f"{default:g}" if isinstance(default, float) else str(default)


def flag_name(name: str) -> str:
    """How the command line names a setting: its flag, else its first variable."""
    meta = _field(name).metadata
    return meta["flag"] or meta["variables"][0]


# run()'s keywords besides the settings, and arun()'s parallel=: a mistyped one is matched against them too.
CALLER_KEYWORDS = ("tools", "approve", "trace", "on_round", "on_event", "output_type", "material", "parallel")


def keyword_name(name: str) -> str:
    """How a Python caller names a setting: its keyword."""
    return name


# --- loading -------------------------------------------------------------------------------------


def load_settings(given: Dict[str, Any], environment: Dict[str, str], recorded: Optional[dict] = None,
                  named: Callable[[str], str] = flag_name, check_endpoint: bool = True) -> Settings:
    """Settings from what the caller gave (by name; None: not given), the environment and .env, or ConfigError.
    recorded: a resumed run's start record (its values hold where nothing is given again); named: how the
    caller names a setting, for messages (its flag, or its keyword)."""
    known = {item.name: item for item in setting_fields()}
    unknown = sorted(set(given) - set(known))
    if unknown:  # a near one first (max_round=: did you mean max_rounds?), then all of them
        near = "".join(f" (did you mean {match}?)" for match in difflib.get_close_matches(unknown[0], [
            name for name in [*known, *(CALLER_KEYWORDS if named is keyword_name else ())] if name != unknown[0]], 1, 0.7))
        raise ConfigError(f"unknown setting {unknown[0]!r}{near}; the settings are {', '.join(known)}")
    values: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    for name, item in known.items():
        meta = item.metadata
        value, sources[name] = item.default_factory(), "default"
        if recorded and meta["resume"] and _restorable(item, recorded.get(name)):
            value, sources[name] = recorded[name], "the resumed run"
        variable = next((variable for variable in meta["variables"] if environment.get(variable)), None)
        if variable:
            value, sources[name] = _parsed(item, environment[variable].strip(), variable), variable
        if given.get(name) is not None:
            value, sources[name] = _checked(item, given[name], named(name)), named(name)
        values[name] = value
    if recorded and recorded.get("approve") is True:
        values["approve"] = True  # only --yes lifts it on resume
    values["tools_files"] = [os.path.abspath(path) for path in values["tools_files"]]
    values["mcp_config"] = values["mcp_config"] and os.path.abspath(values["mcp_config"])
    settings = Settings(**values, sources=sources)
    if check_endpoint:
        check_endpoint_settings(settings)
    return settings


def _parsed(item: Any, text: str, source: str) -> Any:
    """A variable's text through the setting's check; ConfigError naming the variable."""
    parse = item.metadata["parse"]
    if item.name in ("api_key", "escalate_key"):
        return text or None  # the \r of a CRLF .env is no key
    try:
        return parse(text) if parse else text
    except ValueError as error:
        raise ConfigError(f"{source} {error}") from None


def _checked(item: Any, value: Any, source: str) -> Any:
    """A value given as a flag or a keyword, through the same check as its variable."""
    default, parse = item.default_factory(), item.metadata["parse"]
    if isinstance(default, list) and parse is not None and isinstance(value, (list, tuple)):
        if not all(isinstance(entry, str) for entry in value):
            raise ConfigError(f"{source} must be a list of strings, got {value!r}")
        value = ",".join(value) if value else "none"  # a list, checked as its flag would be ([]: none)
    if parse is token_price and isinstance(value, (list, tuple)):  # price=(0.15, 0.6) from Python
        value = ",".join("x" if isinstance(part, bool) or not isinstance(part, (int, float)) else repr(part)
                         for part in value if part is not None)
    if parse is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{source} must be a number, got {value!r}")
        try:
            return parse(str(value))
        except ValueError as error:
            raise ConfigError(f"{source} {error}") from None
    if item.name == "tool_names" and isinstance(value, str):
        value = [name.strip() for name in value.split(",") if name.strip()]
        if "none" in value and len(value) > 1:
            raise ConfigError(f"{source}: none goes alone (no tool, only the answer), got {', '.join(value)}")
        value = [] if value == ["none"] else value
    if isinstance(default, list) or item.name == "tool_names":
        if isinstance(value, str) or not all(isinstance(entry, str) for entry in value):
            raise ConfigError(f"{source} must be a list of strings, got {value!r}")
        return list(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{source} must be True or False, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{source} must be a string, got {value!r}")
    return value


def check_endpoint_settings(settings: Settings, key_named: str = "LLM_API_KEY (or OPENAI_API_KEY)",
                            escalation: bool = True) -> None:
    """ConfigError for a URL that is not http(s), a key that cannot go in a header, or a hosted endpoint
    without a key (the variable to set: key_named); and for --escalate settings that cannot work."""
    source = settings.sources["url"] if settings.sources["url"] != "default" else "LLM_API_URL"
    try:
        host, scheme = urlsplit(settings.endpoint).hostname, urlsplit(settings.url).scheme
    except ValueError:  # a bracket left open
        host, scheme = None, None
    if not host or scheme not in ("http", "https"):
        raise ConfigError(f"{source} must be an http(s) URL, got {display_url(settings.url)!r}")
    problem = url_problem(settings.url, basic_auth=not settings.api_key)  # a key is sent instead of a login
    if problem:  # what requests could not send, or would send elsewhere than shown
        raise ConfigError(f"{source} {problem}")
    problem = proxy_problem(settings.endpoint)
    if problem:
        raise ConfigError(problem)
    for name in ("model", "escalate"):
        if not is_text(getattr(settings, name) or ""):
            raise ConfigError(f"{settings.named(name)} holds a byte that is not UTF-8 text: no endpoint knows such"
                              " a model")
    key = settings.api_key or ""
    if key and not re.fullmatch(r"[\x21-\x7e]+", key) or re.search(r"[\"'\\]", key):
        raise ConfigError(f"{settings.sources['api_key']} holds spaces or characters that cannot go in an HTTP"
                          " header; check for a stray quote, zero-width space or non-ASCII character")
    if not key and host in HOSTS_NEEDING_A_KEY:
        example = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".env.example")
        raise ConfigError(f"{key_named} is not set, and {host} needs one (" + ("see .env.example" if os.path.isfile(
            example) else "set it in the shell, in ./.env or in ~/.config/agent-demo/.env") + ")")  # a wheel has none
    if escalation:
        check_escalation(settings)


def is_text(value: str) -> bool:
    """Can the text be written as UTF-8 (no lone surrogate: the environment's bytes that are not UTF-8)?"""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_escalation(settings: Settings) -> None:
    """ConfigError for --escalate settings that cannot work: an empty model name, the model the run
    starts with, a stronger model's endpoint that fails the first's checks, or --escalate-url and the
    like given without --escalate (they would do nothing)."""
    if settings.escalate is None:
        given = [settings.named(name) for name in ("escalate_url", "escalate_on", "escalate_back", "escalate_max")
                 if settings.sources.get(name, "default") not in ("default", "the resumed run",
                                                                  *_field(name).metadata["variables"])]
        if given:
            raise ConfigError(f"{given[0]} goes with {settings.named('escalate')}, which names no model")
        return
    if not settings.escalate.strip():
        raise ConfigError(f"{settings.named('escalate')} must name a model")
    problem = url_problem(settings.escalate_url, basic_auth=False) if settings.escalate_url else None
    if problem:  # one that cannot even be read is said so before its endpoint is worked out
        raise ConfigError(f"{settings.named('escalate_url')} {problem}")
    stronger = settings.stronger()
    if stronger.model == settings.model and stronger.endpoint == settings.endpoint:
        raise ConfigError(f"{settings.named('escalate')} names the model the run starts with; name a stronger one,"
                          " or another endpoint with --escalate-url")
    check_endpoint_settings(stronger, key_named="LLM_ESCALATE_KEY", escalation=False)


def _restorable(item: Any, value: Any) -> bool:
    """Is a recorded value one this setting's check would take (an old or damaged record may hold anything)?"""
    default, parse = item.default_factory(), item.metadata["parse"]
    if isinstance(default, list) and parse is not None:
        try:
            return isinstance(value, list) and parse(",".join(value) or "none") == value
        except (TypeError, ValueError):
            return False
    if parse is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return False
        try:
            return parse(str(value)) == value
        except ValueError:
            return False
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(entry, str) for entry in value)
    if isinstance(default, bool):
        return False  # approve is or-ed in, never taken as it stands
    return isinstance(value, str) and value != "" and "***" not in value


def recorded_differences(recorded: dict, settings: Settings) -> Dict[str, Any]:
    """The settings in OBEYED_ONLY_WHEN_GIVEN that a trace recorded, where these settings give none of
    their own (a flag or a variable given wins, and nothing is asked), as recorded: what a resume
    would start, load or send the key to, if the user agreed."""
    fields_by_name = {item.name: item for item in setting_fields()}
    differ = {}
    for name in OBEYED_ONLY_WHEN_GIVEN:
        value, now = recorded.get(name), getattr(settings, name)
        if value in (None, "", []) or not _restorable(fields_by_name[name], value) \
                or settings.sources.get(name) != "default":
            continue
        if name == "url":
            same = display_url(chat_completions_url(value)) == display_url(settings.endpoint)
        elif name in ("tools_files", "mcp_config"):
            same = (sorted(map(os.path.abspath, value)) == sorted(now) if name == "tools_files"
                    else os.path.abspath(value) == now)
        else:
            same = value == now
        if not same:
            differ[name] = value
    return differ


def recorded_settings(settings: Settings) -> dict:
    """What the start record keeps of the settings, for --resume."""
    kept = {item.name: getattr(settings, item.name) for item in setting_fields() if item.metadata["resume"]
            and not (item.name.startswith("escalate") and settings.escalate is None)}  # as before, without it
    if kept.get("escalate_url"):  # recorded as shown: without a password
        kept["escalate_url"] = display_url(kept["escalate_url"])
    return kept


