"""A Hugging Face dataset as a batch's task file: `hf:NAME[:SPLIT]` (`hf:NAME:CONFIG:SPLIT`), a
dataset in the local cache, or a folder (one saved with save_to_disk, or a folder of data files),
`FOLDER[:SPLIT]`, read through the `datasets` library (the optional extra agent-demo[datasets]).
Its rows are read as the lines of a JSON Lines file, a row a line: the same keys, peers' shapes and
--fields. Nothing is fetched: reading is offline, and a name not in the cache is refused.

It imports endings; `datasets` only when a dataset is read.
"""
import json
import os
from typing import Any, Iterator, Optional, Tuple

from agent_demo_kit.endings import ConfigError

PREFIX = "hf:"


def names_a_dataset(batch: str) -> bool:
    """Does --batch name a dataset (hf:NAME, a folder, FOLDER:SPLIT) rather than a file?"""
    return batch.startswith(PREFIX) or os.path.isdir(batch) or _folder_and_split(batch) is not None


def _folder_and_split(batch: str) -> Optional[Tuple[str, str]]:
    folder, _, split = batch.rpartition(":")
    return (folder, split) if folder and split and "/" not in split and os.path.isdir(folder) \
        and not os.path.exists(batch) else None


class RowLines:
    """A dataset's rows as the binary stream of a JSON Lines file (what read_tasks reads), a row a line
    as it is asked for: a million rows are never one text."""

    def __init__(self, rows: Iterator[Any]):
        self.rows, self.left = rows, b""

    def readline(self, limit: int = -1) -> bytes:
        if not self.left:
            row = next(self.rows, None)
            if row is None:
                return b""
            if isinstance(row, dict):  # a column a row leaves empty (null) is not there, as in a JSON line
                row = {key: value for key, value in row.items() if value is not None}
            self.left = (json.dumps(row, ensure_ascii=False, default=str) + "\n").encode("utf-8", "surrogatepass")
        said, self.left = (self.left, b"") if limit < 0 else (self.left[:limit], self.left[limit:])
        return said


def dataset_rows(batch: str) -> RowLines:
    """The rows of the dataset --batch names, offline; ConfigError when `datasets` is missing, the name
    is not in the local cache, the split is not one of its splits (or none is named among several)."""
    folder_split = _folder_and_split(batch)
    if not batch.startswith(PREFIX):  # before the library is imported: it never sees such a folder
        check_dataset_folder(folder_split[0] if folder_split else batch, batch)
    else:
        name = batch[len(PREFIX):].split(":")[0]
        if name.startswith(("/", ".", "~")) or name and os.path.exists(name):  # the library would read a folder
            raise ConfigError(f"--batch {batch}: {name!r} is a path, not a dataset's name in the cache; give the"
                              " folder itself: --batch FOLDER")
    datasets = offline_datasets(batch)
    split: Optional[str] = None
    try:
        if batch.startswith(PREFIX):
            parts = batch[len(PREFIX):].split(":")
            if not parts[0] or len(parts) > 3 or not all(parts):
                raise ConfigError(f"--batch {batch}: give hf:NAME, hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT")
            name, config, split = parts[0], parts[1] if len(parts) == 3 else None, parts[-1] if len(parts) > 1 \
                else None
            loaded = cached(datasets, name, config, batch)
        else:
            folder, split = folder_split if folder_split else (batch, None)
            saved = any(os.path.exists(os.path.join(folder, marker))
                        for marker in ("dataset_info.json", "dataset_dict.json", "state.json"))
            loaded = datasets.load_from_disk(folder) if saved else datasets.load_dataset(folder)
    except ConfigError:
        raise
    except Exception as error:  # the library's own errors, of many kinds: said in one line
        raise ConfigError(f"--batch {batch}: the datasets library could not read it ({type(error).__name__}:"
                          f" {' '.join(str(error).split())[:300]})") from None
    if hasattr(loaded, "keys"):  # a DatasetDict: its splits
        splits = list(loaded.keys())
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in splits:
            named = f"has no split {split!r}" if split is not None else "has several splits"
            where = f"{batch.rpartition(':')[0] if split is not None else batch}:SPLIT"
            raise ConfigError(f"--batch {batch} {named} (its splits: {', '.join(map(str, splits))[:200]}): name one"
                              f" as {where}")
        loaded = loaded[split]
    elif split is not None:
        raise ConfigError(f"--batch {batch}: the dataset has no splits to choose from; give it without :{split}")
    return RowLines(iter(loaded))


def check_dataset_folder(folder: str, batch: str) -> None:
    """ConfigError for a folder that holds Python (a dataset's loading script is code someone else wrote,
    and a task file never runs anything; the library before 4.0 would run it) or a link (to a file of
    yours elsewhere, say, which the model would then be sent as tasks)."""
    for where, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(where, name)
            if os.path.islink(path):
                raise ConfigError(f"--batch {batch}: {path} is a link; a dataset's folder is read only when it"
                                  " holds its own files")
            if name.endswith(".py"):
                raise ConfigError(f"--batch {batch}: {path} is Python; a dataset is read as data, and a folder with"
                                  " a loading script is not read at all")


def cached(datasets: Any, name: str, config: Optional[str], batch: str) -> Any:
    """A dataset of the local cache by its hub name, all its splits; ConfigError when it is not there."""
    try:
        return datasets.load_dataset(name, config)
    except (ConnectionError, FileNotFoundError) as error:
        raise ConfigError(f"--batch {batch}: {name!r} is not in the local cache of datasets"
                          f" ({datasets.config.HF_DATASETS_CACHE}); reading is offline here: load it once with the"
                          " datasets library where the network is, or give a folder saved with save_to_disk"
                          f" ({type(error).__name__}: {' '.join(str(error).split())[:200]})") from None


def offline_datasets(batch: str) -> Any:
    """The datasets library, told to stay offline (set before it is imported, and after, should it
    have been already); ConfigError saying what to install when it is missing."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets
        import huggingface_hub.constants
    except ImportError:
        raise ConfigError(f"--batch {batch} is a dataset: reading it needs the datasets library: pip install"
                          " 'agent-demo[datasets]'") from None
    if int(str(getattr(datasets, "__version__", "0")).split(".")[0] or 0) < 4:  # 4.0 runs no loading script
        raise ConfigError(f"--batch {batch}: datasets {getattr(datasets, '__version__', '?')} may run a dataset's"
                          " loading script (Python someone else wrote); it needs datasets 4 or later: pip install"
                          " 'agent-demo[datasets]'")
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    if hasattr(datasets.config, "HF_DATASETS_OFFLINE"):
        datasets.config.HF_DATASETS_OFFLINE = True
    datasets.disable_progress_bars()  # the batch's own lines are what stderr shows
    datasets.logging.set_verbosity_error()
    return datasets
