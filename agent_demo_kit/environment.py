"""Where settings are read from besides the caller: the shell's variables, ./.env when it is yours
alone, and your own settings file, which may hold a key for every folder and so must be yours,
and readable and writable by nobody else; which of them each variable came from.

It imports endings, and private_files when there is a file to read.
"""
import io
import os
import stat
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from agent_demo_kit.endings import ConfigError


class Environment(dict):
    """The variables a run reads, each from where it was found first: the shell, ./.env, or the
    user's own file (`origins`: variable -> "the shell", "./.env" or the user file's path); `notes`:
    what was not read, and why (a ./.env someone else could have written); `read`: the files read."""

    def __init__(self, values: Dict[str, str], origins: Dict[str, str], notes: Optional[List[str]] = None,
                 read: Optional[List[Path]] = None):
        super().__init__(values)
        self.origins = origins
        self.notes = notes or []
        self.read = read or []

    def origin(self, variable: str) -> str:
        return self.origins.get(variable, "the shell")

    def where_requests_go(self, settings: Any) -> str:
        """Said on the header line when a setting that decides where the key goes came from ./.env while
        the key came from elsewhere ("" otherwise)."""
        sources = settings.sources
        chosen = [name for name in ("url", "escalate_url") if self.origin(sources.get(name, "")) == "./.env"]
        key_from = self.origin(sources.get("api_key", "")) if sources.get("api_key", "default") != "default" else None
        if not chosen or key_from in (None, "./.env"):
            return ""
        return f" ({' and '.join(sources[name] for name in chosen)} from ./.env, the key from {key_from})"


def user_config_file(environment: Optional[Dict[str, str]] = None) -> Path:
    """The user's own settings: $XDG_CONFIG_HOME/agent-demo/.env, else the platform's config folder
    (~/.config on Linux, ~/Library/Application Support on macOS, %APPDATA% on Windows)."""
    environment = os.environ if environment is None else environment
    if environment.get("XDG_CONFIG_HOME"):
        folder = Path(environment["XDG_CONFIG_HOME"])
    elif sys.platform == "darwin":
        folder = Path.home() / "Library" / "Application Support"
    elif os.name == "nt" and environment.get("APPDATA"):
        folder = Path(environment["APPDATA"])
    else:
        folder = Path.home() / ".config"
    return folder / "agent-demo" / ".env"


def read_environment() -> Environment:
    """The shell's variables over ./.env over the user's own file (user_config_file): the first that
    sets a variable wins. The user's file, which may hold a key for every folder, must be theirs,
    writable by nobody else and readable by nobody else, as ssh asks of a private key (ConfigError
    otherwise); ./.env is read only when it and its folder are the user's and writable by nobody
    else (otherwise it is passed by, and `notes` says why). A file that cannot be parsed is a
    ConfigError naming its line (and not its text, which may hold a key)."""
    values: Dict[str, str] = {}
    origins: Dict[str, str] = {}
    notes: List[str] = []
    read: List[Path] = []
    user_file = user_config_file()
    local = Path.cwd() / ".env"
    if not (os.path.lexists(user_file) or os.path.lexists(local)):
        return Environment(dict(os.environ), {})
    from agent_demo_kit.private_files import CHECKED, not_yours, require_ours, resolve  # a file to check first
    if os.path.lexists(user_file):
        try:
            require_ours(os.stat(resolve(str(user_file.parent), "the settings folder")), str(user_file.parent),
                         "the settings folder")
            info = os.stat(resolve(str(user_file), "the settings file"))
        except OSError as error:  # a link to nothing, a loop of links
            raise ConfigError(f"the settings file {user_file} cannot be read: {error.strerror or error}") from None
        require_ours(info, str(user_file), "the settings file")
        if CHECKED and stat.S_ISREG(info.st_mode) and info.st_mode & 0o044:
            raise ConfigError(f"the settings file {user_file} can be read by {'others' if info.st_mode & 0o004 else 'its group'}"
                              f" (mode {stat.S_IMODE(info.st_mode):o}): it may hold your key: chmod 600 {user_file}")
    why_not = not_yours(local) if os.path.lexists(local) else None
    if why_not:
        notes.append(f"./.env not read: {why_not}; whoever can write it could choose where your key goes and"
                     " what runs as you")
    for path, origin in ((user_file, str(user_file)), (local, "./.env")):
        if os.path.isfile(path) and not (path == local and why_not):  # False for a name too long too
            found = _dotenv_values(path)
            read.append(path)
            values.update(found)
            origins.update(dict.fromkeys(found, origin))
    for name in os.environ:
        origins.pop(name, None)
    return Environment({**values, **os.environ}, origins, notes, read)


def _dotenv_values(path: Path) -> Dict[str, str]:
    """The variables a .env file sets; ConfigError naming the line python-dotenv cannot parse."""
    from dotenv import dotenv_values  # only when there is a .env to read
    from dotenv.parser import parse_stream
    try:
        text = path.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is not a name
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    broken = next((binding for binding in parse_stream(io.StringIO(text)) if binding.error), None)
    if broken:
        shown = path.name if path.parent == Path.cwd() else str(path)
        raise ConfigError(f"cannot parse {shown} line {broken.original.line}: check for an unbalanced quote")
    return {name: value for name, value in dotenv_values(stream=io.StringIO(text)).items() if value is not None}


KEY_VARIABLES = ("LLM_API_KEY", "OPENAI_API_KEY", "LLM_ESCALATE_KEY", "LLM_JUDGE_KEY")  # every key the project knows


def without_secrets(environment: Any, secrets: Iterable[str] = ()) -> Dict[str, str]:
    """The environment a child process of the user's (the check, the tools worker) gets: without any
    key the project knows, in whatever variable it stands (LLM_API_KEY, OPENAI_API_KEY,
    LLM_ESCALATE_KEY, LLM_JUDGE_KEY, or one holding its value or a secret given)."""
    keys = [value.strip() for value in (*(environment.get(name) for name in KEY_VARIABLES), *secrets)
            if value and value.strip()]
    return {name: value for name, value in environment.items() if name not in KEY_VARIABLES
            and not any(key in value for key in keys)}


def child_environment(environment: Any, secrets: Iterable[str] = ()) -> Dict[str, str]:
    """What every child the user named (a check, the tools worker, an MCP server) starts with: no key,
    and PYTHONSAFEPATH=1, so a Python it runs (`python -c`, `python -m`, a script) does not put the
    folder it runs in (or the script's) first on sys.path: a json.py that someone left beside a task
    file, or in a team folder, is not imported. PYTHONPATH still says where to look, when that is wanted."""
    return {**without_secrets(environment, secrets), "PYTHONSAFEPATH": "1"}
