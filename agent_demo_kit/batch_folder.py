"""A batch's output folder: where it is by default (beside the task file, a folder a model), the
configuration its results belong to, the checks it passes before anything is sent (yours, writable
by nobody else, no links out), its files' names, and results.jsonl put in order, a line a task,
written whole before it replaces the old one.

It imports prompts, tools, settings, private_files, urls, task_file and comparison.
"""
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from agent_demo_kit import prompts
from agent_demo_kit.comparison import OUTPUT_FILES, Key, config_differences, result_key
from agent_demo_kit.endings import ConfigError
from agent_demo_kit.private_files import check_parents, require_ours, resolve, write_private
from agent_demo_kit.seals import is_sealed
from agent_demo_kit.settings import Settings
from agent_demo_kit.task_file import BatchTask
from agent_demo_kit.tools import REGISTRY
from agent_demo_kit.tools import in_use as offered_tools
from agent_demo_kit.urls import display_url, endpoint_of, mcp_urls


def default_out(source: str, model: str) -> Path:
    """The folder a task file's results go to when --out is not given: beside it, named after it, a
    folder a model (FILE-results/MODEL), so that the same file run with two models just works; for a
    dataset of the cache (hf:NAME:SPLIT), hf-NAME-SPLIT-results/MODEL here."""
    if source == "-":
        folder = Path("batch-results")
    elif source.startswith("hf:"):
        folder = Path(re.sub(r"[^A-Za-z0-9._-]+", "-", source).strip(".-") + "-results")
    else:  # a file by its name without its suffix; a dataset's folder by its whole name (ds.v1, ds.v2)
        path = Path(source)
        folder = path.with_name(f"{path.name if os.path.isdir(source) else path.stem}-results")
    return folder / model_folder(model)


def model_folder(model: str) -> str:
    """The name of a model's folder of results (in FILE-results/, or in --out with several models)."""
    name = model.strip()
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:80] or "model"
    # A name a folder cannot hold as it is gets a hash of itself too: openai/gpt-4o and openai-gpt-4o differ.
    return safe if safe == name else f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def configuration(settings: Settings) -> dict:
    """What decides an answer, as each results line records it: the model, the endpoint (its base URL, no login), the
    mode, the tools, the system prompt's version (a hash of it), --max-rounds, the check and --escalate.
    A rerun into a folder of another configuration is refused; --summary puts them side by side."""
    offered = {name: tool for name, tool in REGISTRY.items()
               if settings.tool_names is None or name in settings.tool_names}
    system = prompts.render_system_prompt(offered_tools(offered, answer_only=settings.tool_names == []),
                                          settings.mode, settings.max_calls)
    tools = [*(["all"] if settings.tool_names is None else settings.tool_names or ["none"]), *(f"file {os.path.basename(path)}" for path in settings.tools_files),
             *(f"mcp {display_url(server) if mcp_urls([server]) else server}" for server in settings.mcp_servers),
             *([f"mcp-config {os.path.basename(settings.mcp_config)}"] if settings.mcp_config else [])]
    return {"model": settings.model.strip(), "endpoint": endpoint_of(settings.endpoint), "mode": settings.mode,
            "tools": tools, "prompt": hashlib.sha256(system.encode("utf-8")).hexdigest()[:12],
            "max_rounds": settings.max_rounds, "check": settings.check,
            "escalate": settings.escalate.strip() if settings.escalate else None}


def results_name(part: Optional[Tuple[int, int]], kind: str) -> str:
    """results.jsonl / summary.json, or a shard's own (results-0of4.jsonl)."""
    tail = f"-{part[0]}of{part[1]}" if part else ""
    return f"{kind}{tail}.{'jsonl' if kind == 'results' else 'json'}"


def check_output_parents(out: Path) -> Path:
    """The output folder's real path, once every folder above it is checked as the run log's are: yours
    or root's, writable by nobody else unless sticky (as /tmp is). Someone who can write a folder above
    it (a co-user who made FILE-results/, a group-writable team folder) could swap the folder, or what is
    in it, for their own mid-batch: ConfigError, before anything is made or sent."""
    what = "the output folder"
    real = resolve(str(out), what)
    check_parents(real, str(out), what)
    check_parents(os.path.abspath(out), str(out), what)  # and where a symlink on the way stands
    return Path(real)


def check_output_folder(out: Path) -> None:
    """The output folder, its traces and its results files are used only when they are yours and
    writable by nobody else, inside folders only you can change, with no links out (a link of yours on
    the way to the folder is followed); ConfigError naming the first that is not, before anything is sent."""
    what = "the output folder"
    real = check_output_parents(out)
    for folder in (real, real / "traces"):
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"{what}: {folder} is {'a link' if stat.S_ISLNK(info.st_mode) else 'not a folder'};"
                              " use a folder of your own")
        require_ours(info, str(folder), what)
    for folder, names in ((real, OUTPUT_FILES.fullmatch), (real / "traces", lambda name: name.endswith(".jsonl"))):
        with os.scandir(folder) as entries:
            for entry in entries:
                if not names(entry.name):
                    continue
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode):
                    kind = "a link" if stat.S_ISLNK(info.st_mode) else "not a plain file"
                    raise ConfigError(f"{what}: {entry.path} is {kind}: a batch reads only files it wrote; move it"
                                      " away")
                require_ours(info, entry.path, what)


def open_plain(path: Path) -> Any:
    """A results file opened to read, never through a link and never a FIFO (which would hold the
    batch at its end); ConfigError when it is not a plain file of yours."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise ConfigError(f"{path} cannot be read: {error.strerror or error}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ConfigError(f"{path} is not a plain file any more: a batch reads only files it wrote")
    try:
        require_ours(info, str(path), "the results file")
    except ConfigError:
        os.close(fd)
        raise
    return open(fd, "rb")


def iter_lines(file: Any) -> Iterator[Tuple[int, bytes]]:
    """Each line of a binary file with the offset it starts at."""
    offset = 0
    for raw in file:
        yield offset, raw
        offset += len(raw)


def put_results_in_order(path: Path, tasks: List[BatchTask]) -> int:
    """results.jsonl with one line a task, in the task file's order (the last line of each the batch
    sealed; none it did not seal, none of a task the file no longer has: its trace stays), written whole before it replaces the old one, so a
    crash leaves one or the other. Left as it is when it is so already. Tries of the file's tasks past
    this batch's --repeat (an earlier --repeat 3, rerun without it) are kept, after the others: how
    many is returned, to be said."""
    latest: Dict[Key, int] = {}  # id and try -> where its last line starts
    order = {task.key: n for n, task in enumerate(tasks)}
    ids = {task.id for task in tasks}
    count, last, in_order = 0, -1, True
    with open_plain(path) as results:
        for offset, raw in iter_lines(results):
            try:
                line = json.loads(raw)
                ident = result_key(line)
            except (ValueError, AttributeError, RecursionError):
                continue
            count += 1
            if not is_sealed(line):  # not the batch's: never kept in place of its own (and left out)
                in_order = False
                continue
            latest[ident] = offset
            in_order, last = in_order and order.get(ident, len(order)) > last, order.get(ident, len(order))
        gone = [ident for ident in latest if ident[0] not in ids]  # tasks the file no longer has
        for ident in gone:
            del latest[ident]
        extra = sum(ident not in order for ident in latest)  # tries past --repeat: kept, last
        if len(latest) == count and in_order:
            return extra
        offsets = [offset for _, offset in sorted(latest.items(), key=lambda item: order.get(item[0], len(order)))]
        latest.clear()

        def lines() -> Iterator[bytes]:  # one at a time: the file is never held whole
            for offset in offsets:
                results.seek(offset)
                yield results.readline().rstrip(b"\n") + b"\n"
        write_private(path, lines())
    return extra


def refuse_another_configuration(out: Path, known: Dict[Any, dict], config: dict) -> None:
    """ConfigError when the folder's lines (the ones this user's batches wrote) are another configuration's:
    a batch (or its --plan) into it would mix them."""
    for line in known.values():
        if isinstance(line.get("config"), dict) and line["config"] != config:
            raise another_configuration(out, config_differences(line["config"], config))


def refuse_another_task_file(out: Path, source: str) -> None:
    """ConfigError when the folder's summaries say its results are another task file's: this batch would
    leave their lines out of results.jsonl (a task the file does not have is not kept)."""
    if source == "-":  # stdin names no file to compare
        return
    this = source if source.startswith("hf:") else os.path.abspath(source)
    for path in sorted(out.glob("summary*.json")) if out.is_dir() else []:
        try:
            with open_plain(path) as file:
                other = json.load(file).get("tasks_file")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(other, str) and other != this:
            raise ConfigError(f"{out} holds the results of another task file ({other}); these would replace them."
                              " Give another --out, or move it away to start over")


def another_configuration(out: Path, differences: List[str]) -> ConfigError:
    """The refusal of a folder whose results came from another configuration, naming what differs."""
    return ConfigError(f"{out} holds results of another configuration ({'; '.join(differences)}); these would be"
                       " mixed with them. Give another --out (without --out each model has a folder of its own), or"
                       f" move {out} away to start over")
