"""Settings: what a run needs to know, from flags, the environment and ./.env, checked once."""
import io
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

from dotenv import dotenv_values
from dotenv.parser import parse_stream

from endings import ConfigError

# What a streamed request carries besides a plain one: the client sends it, the budget counts it.
STREAM_FIELDS = {"stream": True, "stream_options": {"include_usage": True}}
DEFAULT_URL = "https://api.openai.com/v1/chat/completions"
DEFAULT_MODEL = "gpt-4o-mini"
MODES = ("json", "schema", "tools")
# Hosted endpoints that always need a key: without one, fail before any request.
HOSTS_NEEDING_A_KEY = {"api.openai.com", "api.deepseek.com", "dashscope.aliyuncs.com",
                       "dashscope-intl.aliyuncs.com"}


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
    max_reply_tokens: int = 4096  # a cap on each reply, sent as max_tokens; 0 sends none
    max_context: int = 24_000  # characters a request may carry
    max_result_chars: int = 4_000  # a longer tool result is cut to head and tail
    keep_recent: int = 4  # rounds that stay verbatim when older ones are folded
    mode: str = "json"  # json, schema or tools: how actions are asked for
    reply_cap_field: str = "max_tokens"  # max_completion_tokens once the endpoint asks for that
    schema_variant: str = "json_schema"  # the response_format schema mode tries first (resume: what worked)
    max_calls: int = 8  # actions run per reply at most
    approve: bool = False  # ask before every tool call
    yes: bool = False  # never ask, even for tools with side effects
    tool_timeout: float = 60.0  # a tool call still running after this is answered as an error
    tools_files: List[str] = field(default_factory=list)  # --tools-file, kept for --resume
    stream: bool = False  # ask for server-sent events (--stream); the budget counts their fields


def chat_completions_url(url: str) -> str:
    """Accept a full chat-completions URL or a base URL such as https://host/v1; the query is kept."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urlunsplit(parts._replace(path=path))


def display_url(url: str) -> str:
    """The URL as it may be shown and recorded: a password in it becomes ***."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not even a URL: hide whatever stands before an @
        return re.sub(r"(://[^/@]*:)[^/@]*@", r"\1***@", url)
    if password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def secrets_of(environment: Dict[str, str], *urls: Optional[str]) -> List[str]:
    """What must never be shown: both keys, and each URL's password as written and as sent."""
    found = [(environment.get(name) or "").strip() for name in ("LLM_API_KEY", "OPENAI_API_KEY")]
    for url in (*urls, environment.get("LLM_API_URL"), environment.get("OPENAI_BASE_URL")):
        try:
            password = urlsplit((url or "").strip()).password
        except ValueError:
            password = None
        if password:
            found += [password, unquote(password)]
    return [secret for secret in found if secret]


def read_environment() -> Dict[str, str]:
    """The environment over ./.env: a variable set in the shell wins. A .env that cannot be parsed is
    a ConfigError naming the line (and not its text, which may hold a key)."""
    dotenv_file = Path.cwd() / ".env"
    if not dotenv_file.is_file():
        return dict(os.environ)
    try:
        text = dotenv_file.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is not a name
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {dotenv_file}: {error}") from None
    broken = next((binding for binding in parse_stream(io.StringIO(text)) if binding.error), None)
    if broken:
        raise ConfigError(f"cannot parse {dotenv_file.name} line {broken.original.line}:"
                          " check for an unbalanced quote")
    values = dotenv_values(stream=io.StringIO(text))
    return {**{k: v for k, v in values.items() if v is not None}, **os.environ}


# --- numbers: one check for a flag and for its variable ---------------------------------

MAX_TIMEOUT = 86_400.0  # a day; beyond that a socket cannot take it


def seconds(text: str) -> float:
    """A finite number of seconds, more than 0; ValueError otherwise."""
    value = float(text)
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT):
        raise ValueError(f"must be a number of seconds more than 0 and at most {MAX_TIMEOUT:g}, got {text!r}")
    return value


def whole_number(least: int) -> Callable[[str], int]:
    """A parser for a whole number of at least `least`; ValueError otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be a whole number, got {text!r}") from None
        if value < least:
            raise ValueError(f"must be at least {least}, got {value}")
        return value
    parse.__name__ = f"whole number of at least {least}"  # what argparse names in its error
    return parse


# field: (flag, variable, parser); a flag given wins over the variable, the variable over the default.
NUMBERS = {
    "max_rounds": ("--max-rounds", "AGENT_MAX_ROUNDS", whole_number(1)),
    "max_tokens": ("--max-tokens", "AGENT_MAX_TOKENS", whole_number(1)),
    "max_reply_tokens": ("--max-reply-tokens", "AGENT_MAX_REPLY_TOKENS", whole_number(0)),
    "max_context": ("--max-context", "AGENT_MAX_CONTEXT", whole_number(1)),
    "max_calls": ("--max-calls", "AGENT_MAX_CALLS", whole_number(1)),
    "retries": ("--retries", "AGENT_RETRIES", whole_number(0)),
    "timeout": ("--timeout", "AGENT_TIMEOUT", seconds),
    "tool_timeout": ("--tool-timeout", "AGENT_TOOL_TIMEOUT", seconds),
    "max_result_chars": (None, "AGENT_MAX_RESULT_CHARS", whole_number(200)),
    "keep_recent": (None, "AGENT_KEEP_RECENT", whole_number(0)),
}


def _number(args: Any, environment: Dict[str, str], name: str, default: Any) -> Any:
    flag, variable, parse = NUMBERS[name]
    given = getattr(args, name, None) if flag else None
    if given is not None:
        return given  # argparse already checked it with the same parser
    text = environment.get(variable)
    if text in (None, ""):
        return default
    try:
        return parse(text.strip())
    except ValueError as error:
        raise ConfigError(f"{variable} {error}") from None


def api_key(environment: Dict[str, str]) -> Optional[str]:
    """LLM_API_KEY, else OPENAI_API_KEY (what every OpenAI-compatible tool reads), else None."""
    return (environment.get("LLM_API_KEY") or environment.get("OPENAI_API_KEY") or "").strip() or None  # \r of CRLF


def endpoint_url(args: Any, environment: Dict[str, str]) -> str:
    """--url, else LLM_API_URL, else OPENAI_BASE_URL, else OpenAI's own."""
    return (getattr(args, "url", None) or environment.get("LLM_API_URL") or environment.get("OPENAI_BASE_URL")
            or DEFAULT_URL)


def load_settings(args: Any, environment: Dict[str, str]) -> Settings:
    """Combine flags (an argparse namespace), the environment and .env into Settings, or raise ConfigError."""
    default = Settings()
    settings = Settings(
        url=endpoint_url(args, environment),
        model=getattr(args, "model", None) or environment.get("LLM_MODEL") or DEFAULT_MODEL,
        api_key=api_key(environment),
        mode=args.mode or environment.get("AGENT_MODE") or "json",
        approve=args.approve, yes=args.yes,
        **{name: _number(args, environment, name, getattr(default, name)) for name in NUMBERS},
    )
    if settings.mode not in MODES:
        raise ConfigError(f"AGENT_MODE must be one of {', '.join(MODES)}, got {settings.mode!r}")
    try:
        host = urlsplit(chat_completions_url(settings.url)).hostname
    except ValueError:  # a port that is not a number, a bracket left open
        host = None
    if not host or urlsplit(settings.url).scheme not in ("http", "https"):
        raise ConfigError(f"LLM_API_URL must be an http(s) URL, got {display_url(settings.url)!r}")
    if settings.api_key and not re.fullmatch(r"[\x21-\x7e]+", settings.api_key) or re.search(r"[\"'\\]",
                                                                                          settings.api_key or ""):
        raise ConfigError("LLM_API_KEY holds spaces or characters that cannot go in an HTTP header;"
                          " check for a stray quote, zero-width space or non-ASCII character")
    if not settings.api_key and host in HOSTS_NEEDING_A_KEY:
        raise ConfigError(f"LLM_API_KEY (or OPENAI_API_KEY) is not set, and {host} needs one (see .env.example)")
    return settings
