"""Files and folders that are yours alone, checked the way ssh checks ~/.ssh: yours (or root's),
writable by nobody else, reached through no one else's symlink, inside folders nobody else can
change. One set of checks for the settings file, ./.env, the run log, the seal key and a batch's
output folder.

It imports endings.
"""
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Callable, Iterable, Optional, Set

try:
    import fcntl
except ImportError:  # Windows: files are not locked
    fcntl = None  # type: ignore

from agent_demo_kit.endings import ConfigError


CHECKED = hasattr(os, "getuid")  # ownership and modes mean nothing on Windows


_MAX_LINKS = 40  # what the kernel follows before it gives up (ELOOP)
_group_readable: Set[str] = set()  # folders whose new files and subfolders their group may read (never write)


def readable_by_group(folder: Path, ours: Callable[[str], bool]) -> None:
    """What a batch makes in this folder and its traces/ from now on, and what of it is there now
    (`ours`, by its name: the results, summaries, page and traces), its group may read, never write
    (--group-readable: a shared volume, a summary job under another uid of the group). Nothing else
    in the folder changes, nor anything that is not the user's own."""
    real = os.path.realpath(folder)
    _group_readable.update({real, os.path.join(real, "traces")})
    for top in (real, os.path.join(real, "traces")):
        try:
            names = [top, *(os.path.join(top, name) for name in os.listdir(top)
                           if ours(os.path.relpath(os.path.join(top, name), real)))]
        except OSError:
            continue
        for name in names:
            info = os.lstat(name)
            if info.st_uid == os.getuid() and (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                os.chmod(name, 0o750 if stat.S_ISDIR(info.st_mode) else 0o640)


def only_yours_again(folder: Path) -> None:
    """What is made in the folder from now on is the user's alone again (the batch that shared it ended)."""
    real = os.path.realpath(folder)
    _group_readable.difference_update({real, os.path.join(real, "traces")})


def mode_for(path: str, folder: bool = False, resolved: bool = False) -> int:
    """0700 or 0600; 0750 or 0640 inside a folder made readable by its group (`resolved`: the path has
    no symlink left in it, as resolve() gives it, and needs no realpath: a file a task costs no lstat
    of each folder above it)."""
    where = os.path.dirname(path) if not folder else path
    real = where if resolved else os.path.realpath(where)
    shared = real in _group_readable  # the folder itself or its traces/, not what else is below
    return (0o750 if folder else 0o640) if shared else (0o700 if folder else 0o600)


def trusted(uid: int) -> bool:
    return uid in (os.getuid(), 0)


def owner_name(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def resolve(path: str, what: str) -> str:
    """The path with every symlink on the way followed, each one checked to be the user's or root's."""
    if not CHECKED:
        return os.path.abspath(path)
    pending = list(Path(path if os.path.isabs(path) else os.path.join(os.getcwd(), path)).parts[1:])
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
        if not trusted(info.st_uid):
            raise ConfigError(f"{what} {path} is reached through {candidate}, a symlink owned by"
                              f" {owner_name(info.st_uid)}, not by you: use a path of your own")
        hops += 1
        if hops > _MAX_LINKS:
            raise ConfigError(f"{what} {path}: too many levels of symlinks")
        target = Path(os.readlink(candidate))
        if target.is_absolute():
            real = os.sep
        pending[:0] = list(target.parts[1:] if target.is_absolute() else target.parts)
    return real


def require_ours(info: os.stat_result, path: str, what: str) -> None:
    """A folder or a regular file must be ours (or root's) and writable by nobody else; devices
    such as /dev/null are let through (nobody can plant a record in them)."""
    if not CHECKED or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
        return
    if not trusted(info.st_uid):
        raise ConfigError(f"{what} {path} belongs to {owner_name(info.st_uid)}, not to you: use one of your own"
                          " (taking it over would make someone else's file yours to obey)")
    if info.st_mode & 0o022:
        private = "700" if stat.S_ISDIR(info.st_mode) else "600"
        raise ConfigError(f"{what} {path} is writable by {'others' if info.st_mode & 0o002 else 'its group'}"
                          f" (mode {stat.S_IMODE(info.st_mode):o}): chmod {private} {path}")


def check_parents(real: str, shown: str, what: str) -> None:
    """The folders above `real` (a path with its symlinks resolved) as ssh's StrictModes checks a home
    folder's: each one yours or root's, and writable by nobody else unless sticky (as /tmp is), so
    that nobody else can swap what is inside for their own. Given the path as written too, it checks
    the folders the symlinks on the way stand in: one of yours in a shared folder can be swapped."""
    if not CHECKED:
        return
    parent = os.path.dirname(real)
    while True:
        try:
            info = os.stat(parent)
        except OSError:  # not made yet: made by us, privately
            info = None
        if info is not None and not stat.S_ISDIR(info.st_mode):  # a file: nothing can be made in it
            info = None
        if info is not None and not trusted(info.st_uid):
            raise ConfigError(f"{what} {shown} is inside {parent}, which belongs to {owner_name(info.st_uid)}: whoever"
                              " owns it can put a folder of theirs in its place; use a folder of your own")
        if info is not None and info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            writers = "others" if info.st_mode & 0o002 else "its group"
            raise ConfigError(f"{what} {shown} is inside {parent}, which is writable by {writers} (mode"
                              f" {stat.S_IMODE(info.st_mode):o}): they can put a folder of theirs in its place;"
                              " use a folder whose parents only you can change")
        if parent == os.path.dirname(parent):
            return
        parent = os.path.dirname(parent)


def checked_folder(folder: Path, what: str = "the run log folder") -> Optional[Path]:
    """The folder, checked with its parents, if it exists; None if it does not."""
    real = resolve(str(folder), what)
    check_parents(real, str(folder), what)
    check_parents(os.path.abspath(folder), str(folder), what)  # and where a symlink on the way stands
    try:
        info = os.stat(real)
    except FileNotFoundError:
        return None
    except OSError as error:  # a file where a folder should be above it, a name too long
        raise ConfigError(f"{what} {folder} cannot be looked at: {error.strerror or error}") from None
    require_ours(info, str(folder), what)
    return Path(real)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def private_folder(folder: Path, what: str = "the run log folder") -> Path:
    """The folder, made 0700 with every missing parent (whatever the umask) and checked, with its
    parents. A mode is set on the folder opened, never by its name, which could be swapped meanwhile."""
    real = Path(resolve(str(folder), what))
    check_parents(str(real), str(folder), what)
    check_parents(os.path.abspath(folder), str(folder), what)  # and where a symlink on the way stands
    missing = []
    while not os.path.lexists(real) and real != real.parent:
        missing.append(real)
        real = real.parent
    for part in reversed(missing):
        try:
            os.mkdir(part, 0o700)
        except FileExistsError:  # another run made it meanwhile: checked below like any other
            continue
        _make_private(part, folder, what)  # a umask of 0o277 or so would leave it unusable
    target = real if not missing else missing[0]
    info = os.stat(target)
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{what} {folder} is not a folder")
    require_ours(info, str(folder), what)
    return target


def _make_private(made: Path, folder: Path, what: str) -> None:
    """Mode 0700 on the folder just made, through a descriptor of it: whatever is at that name by
    now (a symlink to a file of yours, swapped in) is not what gets the mode."""
    try:
        fd = os.open(made, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW)
    except OSError as error:
        raise ConfigError(f"{what} {folder}: {made} changed while it was being made ({error.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise ConfigError(f"{what} {folder}: {made} changed while it was being made")
        os.fchmod(fd, mode_for(str(made), folder=True))
    finally:
        os.close(fd)


def open_private(path: str, what: str = "the trace file") -> int:
    """A file descriptor to read and append: a new file is created 0600 (never through a symlink);
    an existing one is opened without following a symlink and checked once open."""
    real = resolve(path, what)
    flags = os.O_RDWR | os.O_APPEND | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    mode: Optional[int] = mode_for(real, resolved=True)
    try:
        fd = os.open(real, flags | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        fd, mode = os.open(real, flags), None
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISCHR(info.st_mode)):  # a FIFO cannot be appended to and read
            raise ConfigError(f"{what} {path} is not a file (a FIFO or a socket): name a file, or /dev/null")
        if mode is not None and stat.S_IMODE(info.st_mode) != mode:  # a umask of 0o277 would leave it
            os.fchmod(fd, mode)  # unwritable to a later resume
            info = os.fstat(fd)
        require_ours(info, path, what)
    except (ConfigError, OSError):
        os.close(fd)
        raise
    return fd


def not_yours(path: Path) -> Optional[str]:
    """Why a file and its folder are not the user's alone (someone else's, or writable by others), or None."""
    if not CHECKED:
        return None
    folder = path.parent
    for each, what in ((folder, "its folder"), (path, "it")):
        try:
            info = os.lstat(each) if each == path else os.stat(each)
        except OSError as error:
            return f"{what} cannot be looked at ({error.strerror or error})"
        if stat.S_ISLNK(info.st_mode):
            try:
                target = os.stat(each)
            except OSError as error:  # a link to nothing, or a loop of links
                return f"it is a link to nothing that can be read ({error.strerror or error})"
            if not trusted(info.st_uid) or not trusted(target.st_uid):
                return f"it is a link that is not yours to {os.readlink(each)}"
            info = target
        if not trusted(info.st_uid):
            return f"{what} belongs to {owner_name(info.st_uid)}"
        if info.st_mode & 0o022:
            writers = "others" if info.st_mode & 0o002 else "its group"
            fix = f"chmod go-w {'.' if each == folder else './.env'}"
            return f"{what} is writable by {writers} (mode {stat.S_IMODE(info.st_mode):o}; {fix} if that is wrong)"
    return None


def lock(trace: IO) -> bool:
    """Mark an open trace file as in use by this run, for as long as it stays open (on systems
    with flock); False if another run holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(trace.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def in_use(path: Path) -> bool:
    """Is a run still writing this file?"""
    try:
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))) as trace:
            return not lock(trace)
    except OSError:
        return False


def write_private(path: Path, pieces: Iterable[bytes]) -> None:
    """A file readable only by the user, written whole under another name, piece by piece, and then
    renamed over `path`."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")  # pods may share a pid
    with open(open_private(str(temporary), str(path.name)), "wb") as file:
        file.truncate()
        file.writelines(pieces)
    os.replace(temporary, path)
