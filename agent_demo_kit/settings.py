"""Settings: what a run needs to know, from flags, the environment and ./.env, checked once."""
import copy
import io
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

from dotenv import dotenv_values
from dotenv.parser import parse_stream

from agent_demo_kit.endings import ConfigError

DEFAULT_URL = "https://api.openai.com/v1/chat/completions"
DEFAULT_MODEL = "gpt-4o-mini"
MODES = ("json", "schema", "tools")
# Hosted endpoints that always need a key: without one, fail before any request.
HOSTS_NEEDING_A_KEY = {"api.openai.com", "api.deepseek.com", "dashscope.aliyuncs.com",
                       "dashscope-intl.aliyuncs.com"}


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


def mode_name(text: str) -> str:
    if text not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}, got {text!r}")
    return text


def setting(default: Any, flag: Optional[str] = None, variables: tuple = (), parse: Optional[Callable] = None,
            resume: bool = True, **options: Any) -> Any:
    """A Settings field with where it comes from: its flag, its variables (the first set wins),
    the check both go through, and whether a resume keeps the run's recorded value."""
    return field(default_factory=lambda: copy.copy(default), **options,
                 metadata={"flag": flag, "variables": variables, "parse": parse, "resume": resume})


@dataclass
class Settings:
    """Everything a run needs to know, from flags, the environment and .env. A field marked
    resume is recorded in the trace's start record and restored by --resume unless given again."""

    url: str = setting(DEFAULT_URL, "--url", ("LLM_API_URL", "OPENAI_BASE_URL"))
    model: str = setting(DEFAULT_MODEL, "--model", ("LLM_MODEL",))
    api_key: Optional[str] = setting(None, variables=("LLM_API_KEY", "OPENAI_API_KEY"), resume=False, repr=False)
    mode: str = setting("json", "--mode", ("AGENT_MODE",), mode_name)  # json, schema or tools
    max_rounds: int = setting(6, "--max-rounds", ("AGENT_MAX_ROUNDS",), whole_number(1))
    max_tokens: Optional[int] = setting(None, "--max-tokens", ("AGENT_MAX_TOKENS",), whole_number(1))  # the run's budget
    max_reply_tokens: int = setting(4096, "--max-reply-tokens", ("AGENT_MAX_REPLY_TOKENS",), whole_number(0))
    max_context: int = setting(24_000, "--max-context", ("AGENT_MAX_CONTEXT",), whole_number(1))  # characters
    max_result_chars: int = setting(4_000, None, ("AGENT_MAX_RESULT_CHARS",), whole_number(200))
    keep_recent: int = setting(4, None, ("AGENT_KEEP_RECENT",), whole_number(0))  # rounds kept verbatim
    max_calls: int = setting(8, "--max-calls", ("AGENT_MAX_CALLS",), whole_number(1))  # actions run per reply
    timeout: float = setting(30.0, "--timeout", ("AGENT_TIMEOUT",), seconds)
    retries: int = setting(3, "--retries", ("AGENT_RETRIES",), whole_number(0))
    tool_timeout: float = setting(60.0, "--tool-timeout", ("AGENT_TOOL_TIMEOUT",), seconds)
    check: Optional[str] = setting(None, "--check", ("AGENT_CHECK",))  # a command that must accept the answer
    check_attempts: int = setting(3, "--check-attempts", ("AGENT_CHECK_ATTEMPTS",), whole_number(1))  # answers
    tools_files: List[str] = setting([], "--tools-file")  # kept for --resume
    mcp_servers: List[str] = setting([], "--mcp")  # commands or URLs of MCP servers, kept for --resume
    mcp_config: Optional[str] = setting(None, "--mcp-config")  # an mcpServers JSON file
    approve: bool = setting(False, "--approve")  # ask before every tool call; a resume keeps it on
    yes: bool = setting(False, "--yes", resume=False)  # never ask, even for tools with side effects
    stream: bool = setting(False, "--stream", resume=False)  # ask for server-sent events
    backoff_factor: float = setting(0.5, resume=False)  # waits 0, 1, 2, 4 ... seconds between retries
    max_retry_wait: float = setting(30.0, None, ("AGENT_MAX_RETRY_WAIT",), seconds)  # Retry-After or backoff, at most
    sources: Dict[str, str] = setting({}, resume=False)  # where each setting came from, for messages


def _fields() -> Dict[str, Any]:
    return {item.name: item for item in fields(Settings)}


def flag_parser(name: str) -> Callable[[str], Any]:
    """The check a setting's flag goes through: the same as its variable's."""
    return _fields()[name].metadata["parse"]


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_").replace("tools_files", "tools_file")


def given(name: str, args: Any, environment: Dict[str, str]) -> Optional[str]:
    """Where the user gave this setting (its flag or the variable set), or None."""
    meta = _fields()[name].metadata
    value = getattr(args, _dest(meta["flag"]), None) if meta["flag"] else None
    if value is not None and value is not False and value != []:  # 0 is given, False (no --approve) is not
        return meta["flag"]
    return next((variable for variable in meta["variables"] if environment.get(variable)), None)


def _from(name: str, args: Any, environment: Dict[str, str], default: Any) -> Any:
    meta = _fields()[name].metadata
    source = given(name, args, environment)
    if source is None:
        return default
    if source == meta["flag"]:
        return getattr(args, _dest(source))  # argparse already checked it with the same parser
    text = environment[source].strip()
    try:
        return meta["parse"](text) if meta["parse"] else text
    except ValueError as error:
        raise ConfigError(f"{source} {error}") from None


def api_key(environment: Dict[str, str]) -> Optional[str]:
    """LLM_API_KEY, else OPENAI_API_KEY (what every OpenAI-compatible tool reads), else None."""
    return (environment.get("LLM_API_KEY") or environment.get("OPENAI_API_KEY") or "").strip() or None  # \r of CRLF


def endpoint_url(args: Any, environment: Dict[str, str]) -> str:
    """--url, else LLM_API_URL, else OPENAI_BASE_URL, else OpenAI's own."""
    return (getattr(args, "url", None) or environment.get("LLM_API_URL") or environment.get("OPENAI_BASE_URL")
            or DEFAULT_URL)


def load_settings(args: Any, environment: Dict[str, str], recorded: Optional[dict] = None) -> Settings:
    """Combine flags (an argparse namespace), the environment and .env into Settings, or raise
    ConfigError. recorded: a resumed run's start record, whose values hold where nothing is given again."""
    settings = Settings()
    for name, item in _fields().items():
        default, settings.sources[name] = getattr(settings, name), "default"
        if recorded and item.metadata["resume"] and _restorable(item, recorded.get(name)):
            default, settings.sources[name] = recorded[name], "the resumed run"
        setattr(settings, name, _from(name, args, environment, default))
        settings.sources[name] = given(name, args, environment) or settings.sources[name]
    settings.api_key = api_key(environment)
    settings.sources["api_key"] = "LLM_API_KEY" if (environment.get("LLM_API_KEY") or "").strip() else "OPENAI_API_KEY"
    if recorded and recorded.get("approve") is True:
        settings.approve = True  # only --yes lifts it on resume
    settings.tools_files = [os.path.abspath(path) for path in settings.tools_files]
    settings.mcp_config = settings.mcp_config and os.path.abspath(settings.mcp_config)
    try:
        host = urlsplit(chat_completions_url(settings.url)).hostname
    except ValueError:  # a port that is not a number, a bracket left open
        host = None
    if not host or urlsplit(settings.url).scheme not in ("http", "https"):
        source = given("url", args, environment) or "LLM_API_URL"
        raise ConfigError(f"{source} must be an http(s) URL, got {display_url(settings.url)!r}")
    if settings.api_key and not re.fullmatch(r"[\x21-\x7e]+", settings.api_key) or re.search(r"[\"'\\]",
                                                                                          settings.api_key or ""):
        raise ConfigError(f"{settings.sources['api_key']} holds spaces or characters that cannot go in an HTTP header;"
                          " check for a stray quote, zero-width space or non-ASCII character")
    if not settings.api_key and host in HOSTS_NEEDING_A_KEY:
        raise ConfigError(f"LLM_API_KEY (or OPENAI_API_KEY) is not set, and {host} needs one (see .env.example)")
    return settings


def _restorable(item: Any, value: Any) -> bool:
    """Is a recorded value one this setting's check would take (an old or damaged record may hold anything)?"""
    default, parse = item.default_factory(), item.metadata["parse"]
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


def recorded_settings(settings: Settings) -> dict:
    """What the start record keeps of the settings, for --resume."""
    return {item.name: getattr(settings, item.name) for item in fields(Settings) if item.metadata["resume"]}
