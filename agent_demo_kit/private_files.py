"""Folders and files that are the user's alone (the run log folder, trace files), checked the way
ssh checks ~/.ssh: owned by the user (or root), not writable by group or others, and not reached
through a symlink that someone else owns. A check that fails is a ConfigError of one line that
says which path, why, and the command that fixes it."""
import os
import stat
from pathlib import Path
from typing import Optional

from agent_demo_kit.endings import ConfigError

_CHECKED = hasattr(os, "getuid")  # ownership and modes mean nothing on Windows
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_MAX_LINKS = 40  # what the kernel follows before it gives up (ELOOP)


def _trusted(uid: int) -> bool:
    return uid in (os.getuid(), 0)


def _owner(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _me() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def resolve(path: str, what: str) -> str:
    """The path with every symlink on the way followed, each one checked to be the user's or root's."""
    if not _CHECKED:
        return os.path.abspath(path)
    pending = list(Path(os.path.join(os.getcwd(), path)).parts[1:])
    real, hops = os.sep, 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            real = os.path.dirname(real)
            continue
        candidate = os.path.join(real, part)
        try:
            info = os.lstat(candidate)
        except OSError:  # not there (yet): the rest is made by us, or fails when opened
            return os.path.join(candidate, *pending)
        if not stat.S_ISLNK(info.st_mode):
            real = candidate
            continue
        if not _trusted(info.st_uid):
            raise ConfigError(f"{what} {path} is reached through {candidate}, a symlink owned by"
                              f" {_owner(info.st_uid)}, not by you: chown -h {_me()} {candidate}, or remove it")
        hops += 1
        if hops > _MAX_LINKS:
            raise ConfigError(f"{what} {path}: too many levels of symlinks")
        target = Path(os.readlink(candidate))
        if target.is_absolute():
            real = os.sep
        pending[:0] = list(target.parts[1:] if target.is_absolute() else target.parts)
    return real


def check(info: os.stat_result, path: str, what: str) -> None:
    """A folder or a regular file must be ours (or root's) and writable by nobody else; devices
    such as /dev/null are let through (nobody can plant a record in them)."""
    if not _CHECKED or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return
    if not _trusted(info.st_uid):
        raise ConfigError(f"{what} {path} belongs to {_owner(info.st_uid)}, not to you:"
                          f" chown {_me()} {path}, or use another one")
    if info.st_mode & 0o022:
        private = "700" if stat.S_ISDIR(info.st_mode) else "600"
        raise ConfigError(f"{what} {path} is writable by {'others' if info.st_mode & 0o002 else 'its group'}"
                          f" (mode {stat.S_IMODE(info.st_mode):o}): chmod {private} {path}")


def private_folder(folder: Path, what: str = "the run log folder") -> Path:
    """The folder, made 0700 with every missing parent (whatever the umask) and checked."""
    real = Path(resolve(str(folder), what))
    missing = []
    while not os.path.lexists(real) and real != real.parent:
        missing.append(real)
        real = real.parent
    for part in reversed(missing):
        try:
            os.mkdir(part, 0o700)
        except FileExistsError:  # another run made it meanwhile: checked below like any other
            continue
        os.chmod(part, 0o700)  # a umask of 0o277 or so would leave it unusable
    target = real if not missing else missing[0]
    info = os.stat(target)
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{what} {folder} is not a folder")
    check(info, str(folder), what)
    return target


def checked_folder(folder: Path, what: str = "the run log folder") -> Optional[Path]:
    """The folder, checked, if it exists; None if it does not."""
    real = resolve(str(folder), what)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return None
    check(info, str(folder), what)
    return Path(real)


def open_private(path: str, what: str = "the trace file") -> int:
    """A file descriptor to read and append: a new file is created 0600 (never through a symlink);
    an existing one is opened without following a symlink and checked once open."""
    real = resolve(path, what)
    flags = os.O_RDWR | os.O_APPEND | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = os.open(real, flags)
    try:
        check(os.fstat(fd), path, what)
    except ConfigError:
        os.close(fd)
        raise
    return fd
