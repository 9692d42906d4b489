"""Tasks from a local Hugging Face dataset directory (the output of ``save_to_disk``).

The ``datasets`` package reads it (Arrow shards, index mappings, features), so we do not
re-implement its format. It is an optional dependency (``pip install 'mappa-rl[hf]'``): it
pulls pyarrow and pandas but no torch, and nothing else in mappa needs it. Nothing is
fetched from a hub: only directories already on disk are read.
"""

from __future__ import annotations

from pathlib import Path

from mappa.tasks.base import DEFAULT_COLUMNS, Columns, Task, tasks_from_rows


def load_dataset_dir(path: Path, columns: Columns = DEFAULT_COLUMNS) -> list[Task]:
    """Every row of the dataset saved at ``path`` as a Task (columns as in ``tasks_from_rows``).

    A ``DatasetDict`` holds one folder per split; point at the split's folder
    (``data/math/test``) so that train and eval splits are never mixed by accident.
    """
    try:
        from datasets import Dataset, load_from_disk
    except ImportError as err:
        raise ImportError(
            f"{path} is a directory: reading Hugging Face datasets needs "
            "`pip install 'mappa-rl[hf]'`"
        ) from err
    data = load_from_disk(str(path))
    if not isinstance(data, Dataset):
        splits = ", ".join(str(path / name) for name in data)
        raise ValueError(f"{path} holds several splits; use one of: {splits}")
    return tasks_from_rows(data, str(path), columns=columns)
