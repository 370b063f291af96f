"""Settings: what a run needs to know, from flags, the environment and ./.env, checked once."""
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional
from urllib.parse import urlsplit

from dotenv import dotenv_values

from endings import ConfigError

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
    schema_variant: str = "json_schema"  # the response_format schema mode tries first (resume: what worked)
    max_calls: int = 8  # actions run per reply at most
    approve: bool = False  # ask before every tool call
    yes: bool = False  # never ask, even for tools with side effects


def chat_completions_url(url: str) -> str:
    """Accept a full chat-completions URL or a base URL such as https://host/v1."""
    url = url.strip().rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def read_environment() -> Dict[str, str]:
    """The environment over ./.env: a variable set in the shell wins."""
    dotenv_file = Path.cwd() / ".env"
    try:
        values = dotenv_values(dotenv_file) if dotenv_file.is_file() else {}
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {dotenv_file}: {error}") from None
    return {**{k: v for k, v in values.items() if v is not None}, **os.environ}


def _whole_number(flag: Optional[int], environment: Dict[str, str], name: str, default: Optional[int]) -> Optional[int]:
    """A whole-number setting: the flag, else the environment variable, else the default."""
    if flag is not None:
        return flag
    value = environment.get(name)
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {value!r}") from None


def load_settings(args: Any, environment: Dict[str, str]) -> Settings:
    """Combine flags (an argparse namespace), the environment and .env into Settings, or raise ConfigError."""
    default = Settings()
    settings = Settings(
        url=environment.get("LLM_API_URL") or DEFAULT_URL,
        model=environment.get("LLM_MODEL") or DEFAULT_MODEL,
        api_key=(environment.get("LLM_API_KEY") or "").strip() or None,  # a CRLF .env leaves a \r
        max_rounds=_whole_number(args.max_rounds, environment, "AGENT_MAX_ROUNDS", default.max_rounds),
        timeout=args.timeout,
        retries=_whole_number(args.retries, environment, "AGENT_RETRIES", default.retries),
        max_tokens=_whole_number(args.max_tokens, environment, "AGENT_MAX_TOKENS", default.max_tokens),
        max_reply_tokens=_whole_number(args.max_reply_tokens, environment, "AGENT_MAX_REPLY_TOKENS",
                                       default.max_reply_tokens),
        max_context=_whole_number(args.max_context, environment, "AGENT_MAX_CONTEXT", default.max_context),
        max_result_chars=_whole_number(None, environment, "AGENT_MAX_RESULT_CHARS", default.max_result_chars),
        keep_recent=_whole_number(None, environment, "AGENT_KEEP_RECENT", default.keep_recent),
        mode=args.mode or environment.get("AGENT_MODE") or "json",
        max_calls=_whole_number(args.max_calls, environment, "AGENT_MAX_CALLS", default.max_calls),
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
    if settings.max_reply_tokens < 0:
        raise ConfigError("--max-reply-tokens (AGENT_MAX_REPLY_TOKENS) must be 0 or more")
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
