"""Tasks from Hugging Face datasets: a directory written by ``save_to_disk``, or a dataset
named ``hf:<repo>[:<config>]:<split>[@<revision>]`` (``tasks.source``).

The ``datasets`` package reads both (Arrow shards, the Hub, its cache, offline mode with
``HF_DATASETS_OFFLINE=1``), so we do not re-implement any of it. It is an optional
dependency (``pip install 'mappa-rl[hf]'``): it pulls pyarrow and pandas but no torch, and
nothing else in mappa needs it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mappa.hub import hub_unreachable
from mappa.tasks.base import (
    DEFAULT_COLUMNS,
    SOURCES,
    Columns,
    Task,
    TaskSourceError,
    tasks_from_rows,
)
from mappa.text import first_line

log = logging.getLogger(__name__)


HF_PREFIX = "hf:"

READ: dict[str, dict[str, Any]] = {}
"""What this process read through ``load_hub_dataset``, by source: a run's record of its
data (``<run_dir>/data.json``)."""


@dataclass(frozen=True)
class HubSource:
    """A dataset on the Hub (or a local dataset folder ``datasets`` can read), one split."""

    repo: str
    config: str | None
    split: str
    revision: str | None

    @classmethod
    def parse(cls, source: str) -> HubSource:
        """``hf:<repo>[:<config>]:<split>[@<revision>]``; ``ValueError`` saying the form.

        >>> HubSource.parse("hf:HuggingFaceH4/MATH-500:test@ff5b2")
        HubSource(repo='HuggingFaceH4/MATH-500', config=None, split='test', revision='ff5b2')
        >>> HubSource.parse("hf:openai/gsm8k:main:test").config
        'main'
        """
        body, _, revision = source.removeprefix(HF_PREFIX).partition("@")
        parts = body.split(":")
        if len(parts) not in (2, 3) or not all(parts) or (revision == "" and "@" in source):
            raise ValueError(
                f"{source!r}: a Hub dataset is hf:<repo>[:<config>]:<split>[@<revision>], "
                "e.g. hf:HuggingFaceH4/MATH-500:test"
            )
        config = parts[1] if len(parts) == 3 else None
        return cls(parts[0], config, parts[-1], revision or None)


def load_hub_dataset(source: str, columns: Columns = DEFAULT_COLUMNS) -> list[Task]:
    """Every row of one split of a Hub dataset as a Task (``HubSource``). Read through the
    ``datasets`` cache: offline (``HF_DATASETS_OFFLINE=1``) only what it holds. Without a
    ``@revision`` the newest is read, and a warning says the run cannot be reproduced
    exactly; the data's fingerprint is logged, and what was read is kept in ``READ``."""
    hub = HubSource.parse(source)
    datasets = _datasets(source)
    if not Path(hub.repo).expanduser().exists() and not datasets.config.HF_HUB_OFFLINE:
        unreachable = hub_unreachable()
        if unreachable:
            raise ValueError(
                f"{source}: the Hub cannot be reached from here ({unreachable}); on a machine "
                "without it, set HF_DATASETS_OFFLINE=1 to read the datasets cache, or give a "
                "local copy"
            )
    load_dataset = datasets.load_dataset
    try:
        data = load_dataset(hub.repo, hub.config, split=hub.split, revision=hub.revision)
    except Exception as err:  # datasets raises many kinds: not found, offline, bad split
        first = first_line(err) or type(err).__name__
        fix = (
            "offline mode reads only the datasets cache: load it once where the Hub is "
            "reachable and copy the cache (HF_HOME), or give a local copy"
            if datasets.config.HF_HUB_OFFLINE
            else "check its repo (or folder), config, split and revision"
        )
        raise ValueError(f"{source}: cannot load it ({first}); {fix}") from None
    if hub.revision is None:
        log.warning("%s: no @revision pinned: a later run may read other rows", source)
    log.info("%s: %d rows, fingerprint %s", source, len(data), data._fingerprint)
    READ[source] = {
        "source": source,
        "revision": hub.revision,
        "rows": len(data),
        "fingerprint": data._fingerprint,  # datasets' hash of what it read
    }
    return tasks_from_rows(data, source, columns=columns)


def _saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder ``save_to_disk`` wrote: a dataset (its info and state
    files) or a dataset dict (its list of splits), as ``datasets.load_from_disk`` tells."""
    dataset = (path / "dataset_info.json").is_file() and (path / "state.json").is_file()
    return dataset or (path / "dataset_dict.json").is_file()


def _datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            f"{what}: reading Hugging Face datasets needs `pip install 'mappa-rl[hf]'`"
        ) from err
    return datasets


def load_dataset_dir(path: Path, columns: Columns = DEFAULT_COLUMNS) -> list[Task]:
    """Every row of the dataset saved at ``path`` as a Task (columns as in ``tasks_from_rows``).

    A ``DatasetDict`` holds one folder per split; point at the split's folder
    (``data/math/test``) so that train and eval splits are never mixed by accident. A
    directory ``save_to_disk`` did not write is refused before ``datasets`` is imported
    (its own message says neither what the directory is for nor what to give instead).
    """
    if not _saved_dataset(path):
        inside = [str(d) for d in sorted(path.iterdir()) if d.is_dir() and _saved_dataset(d)]
        fix = f"use one of: {', '.join(inside)}" if inside else f"a task source is {SOURCES}"
        raise TaskSourceError(f"{path}: a directory that holds no saved dataset; {fix}")
    datasets = _datasets(f"{path} is a directory")
    data = datasets.load_from_disk(str(path))
    if not isinstance(data, datasets.Dataset):
        splits = ", ".join(str(path / name) for name in data)
        raise ValueError(f"{path} holds several splits; use one of: {splits}")
    return tasks_from_rows(data, str(path), columns=columns)
