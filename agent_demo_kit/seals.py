"""Who set a run up: the records that start a run, resume it or follow up on it carry a seal, a keyed
hash (HMAC-SHA256) of the record as written, made with a key only this user can read. A resume goes
on with a run whose records are sealed; one whose are not (appended by someone else, copied from
another machine, or written before seals) decides nothing without the user's say, and a batch does
not count a trace it did not write.

The key lives beside the run log, in $XDG_STATE_HOME/agent-demo/seal.key (else
~/.local/state/agent-demo/seal.key), made 0600 in a 0700 folder and checked like ~/.ssh. It imports
private_files and endings.
"""
import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
from pathlib import Path
from typing import Dict, Optional

from agent_demo_kit.endings import ConfigError
from agent_demo_kit.private_files import check_parents, require_ours, resolve

_KEYS: Dict[str, bytes] = {}
_LOCK = threading.Lock()


def _state_folder(environment: Dict[str, str]) -> str:
    return environment.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")


def key_path(environment: Optional[Dict[str, str]] = None) -> Path:
    return Path(_state_folder(os.environ if environment is None else environment)) / "agent-demo" / "seal.key"


def seal_key() -> bytes:
    """This user's sealing key, made on first use; ConfigError when its file or folder is not theirs
    alone."""
    state = _state_folder(os.environ)  # a record's seal asks for it: no Path made once it is known
    with _LOCK:
        if state not in _KEYS:
            _KEYS[state] = _read_or_make(key_path())
        return _KEYS[state]


def _read_or_make(path: Path) -> bytes:
    what = "the seal key"
    folder = Path(resolve(str(path.parent), what))
    check_parents(str(folder), str(path.parent), what)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    require_ours(os.stat(folder), str(path.parent), what)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(folder / path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as made:
            made.write(secrets.token_hex(32))
    except FileExistsError:
        pass
    try:
        fd = os.open(folder / path.name, flags)
    except OSError as error:
        raise ConfigError(f"{what} {path} cannot be read: {error.strerror or error}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        require_ours(info, str(path), what)
        if hasattr(os, "getuid") and info.st_mode & 0o077:
            raise ConfigError(f"{what} {path} can be read by others (mode {stat.S_IMODE(info.st_mode):o}):"
                              f" chmod 600 {path}")
        key = file.read(256).strip()
    if len(key) < 32:
        raise ConfigError(f"{what} {path} is damaged: remove it, and a new one is made")
    return key


def _digest(record: dict, key: bytes) -> str:
    body = {name: value for name, value in record.items() if name != "seal"}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def sealed(record: dict) -> dict:
    """The record with its seal (trace_file.py seals the records that set a run up)."""
    return {**record, "seal": seal_of(record)}


def seal_of(record: dict) -> str:
    """The seal of a record as it stands (its own "seal" left out)."""
    return _digest(record, seal_key())


def is_sealed(record: dict) -> bool:
    """Was this record written, as it is, by agent-demo as this user?"""
    seal = record.get("seal")
    return isinstance(seal, str) and hmac.compare_digest(seal, _digest(record, seal_key()))
