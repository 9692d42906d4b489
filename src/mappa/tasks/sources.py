"""Loading tasks from a config source: built-in arithmetic, DSBench, a Hugging Face dataset
directory, or a JSON/JSONL task file."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from mappa.tasks.base import (
    DEFAULT_COLUMNS,
    PROMPT_FIELDS,
    TASK_FILE,
    Columns,
    Task,
    TaskSourceError,
    refuse_duplicate_ids,
    tasks_from_rows,
)
from mappa.tasks.hf import HF_PREFIX, load_dataset_dir, load_hub_dataset


def load_task_file(path: Path, columns: Columns = DEFAULT_COLUMNS) -> list[Task]:
    """Read a JSON list or JSONL file of ``{prompt, answer[, id]}`` objects.

    A file that starts with ``[`` is one JSON document; anything else is read as JSONL.
    Errors are ``TaskSourceError``s naming the file and the line: the JSONL line, or the
    JSON decoder's line and column.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM is not an error
    except UnicodeDecodeError as err:
        raise TaskSourceError(f"{path}: not UTF-8 text ({err.reason})") from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as err:
        if text.lstrip().startswith("["):
            raise TaskSourceError(
                f"{path}: line {err.lineno}, column {err.colno}: not valid JSON: {err.msg}"
            ) from None
        rows, where = [], []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as line_err:
                raise TaskSourceError(
                    f"{path}: line {number}: not valid JSON ({line_err.msg}, column "
                    f"{line_err.colno}); {TASK_FILE}"
                ) from None
            where.append(f"line {number}")
        return tasks_from_rows(_some(rows, path), str(path), where, columns)
    lines = [n for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if isinstance(rows, dict) and len(lines) == 1 and not _wraps_tasks(rows, columns):
        return tasks_from_rows([rows], str(path), [f"line {lines[0]}"], columns)  # JSONL of one
    if not isinstance(rows, list):
        what = f"a JSON object (keys: {', '.join(rows)})" if isinstance(rows, dict) else repr(rows)
        raise TaskSourceError(f"{path}: the top level is {what}, not a list of tasks; {TASK_FILE}")
    return tasks_from_rows(_some(rows, path), str(path), columns=columns)


def _wraps_tasks(row: dict[str, object], columns: Columns) -> bool:
    """Whether a file's one object holds the tasks rather than being one (``{"tasks":
    [...]}``): it has a list and no prompt, so asking for its prompt column would mislead."""
    prompts = (columns.prompt,) if columns.prompt else PROMPT_FIELDS
    return any(isinstance(v, list) for v in row.values()) and not any(p in row for p in prompts)


def _some(rows: list[object], path: Path) -> list[object]:
    """``rows``, where the file holds any (an empty one is a file written wrong, not a run
    of no tasks)."""
    if not rows:
        raise TaskSourceError(f"{path}: no tasks; {TASK_FILE}")
    return rows


DSBENCH_PREFIX = "dsbench:"

GENERATED = ("arithmetic", "dsbench-synthetic", "dsbench-sklearn")
"""The sources named by a word, not a path: a source that is neither, and close to one of
these, is most likely it misspelt (``arithmetc``)."""


def load_dsbench(source: str, num_tasks: int, seed: int, root: str | None = None) -> list[Task]:
    """``dsbench-synthetic`` (generated, cached by seed), ``dsbench-sklearn`` (real datasets
    shipped with scikit-learn) or ``dsbench:<task list>`` (real DSBench folders under ``root``)."""
    from mappa.paths import cache_root

    if source == "dsbench-synthetic":
        from mappa.tasks.dsbench.synthetic import generate

        per_kind = max(1, -(-num_tasks // 3))
        specs = generate(cache_root() / "dsbench" / f"synthetic-{seed}-{per_kind}", per_kind, seed)
    elif source == "dsbench-sklearn":
        from mappa.tasks.dsbench.sklearn_data import generate as sklearn_tasks

        specs = sklearn_tasks(cache_root() / "dsbench" / f"sklearn-{seed}", seed=seed)
    else:
        from mappa.tasks.dsbench.loader import load_task_list

        listing = Path(source[len(DSBENCH_PREFIX) :]).expanduser()
        specs, problems = load_task_list(
            listing, Path(root).expanduser() if root else listing.parent
        )
        if problems:
            raise FileNotFoundError(
                f"{listing}: {len(problems)} task(s) cannot load: " + "; ".join(problems[:5])
            )
    tasks = [Task.from_dsbench(s) for s in specs]
    refuse_duplicate_ids(tasks, source)
    return tasks


def load_tasks(
    source: str,
    num_tasks: int,
    difficulty: int,
    seed: int,
    dsbench_root: str | None = None,
    columns: Columns = DEFAULT_COLUMNS,
) -> list[Task]:
    """``arithmetic`` generates tasks; ``dsbench-*`` and ``dsbench:<list>`` are modeling
    tasks; ``hf:<repo>[:<config>]:<split>[@<revision>]`` a Hugging Face dataset; a
    directory is one saved to disk; anything else is a JSON/JSONL task file. ``columns``:
    which columns of a file's or dataset's rows are the prompt and the answer."""
    if source.startswith(("dsbench-", DSBENCH_PREFIX)):
        return load_dsbench(source, num_tasks, seed, dsbench_root)
    if source == "arithmetic":
        from mappa.tasks.arithmetic import generate

        return generate(num_tasks, seed=seed, difficulty=difficulty)
    if source.startswith(HF_PREFIX):
        return load_hub_dataset(source, columns)
    path = Path(source).expanduser()
    if path.is_dir():
        return load_dataset_dir(path, columns)
    if not path.is_file():
        near = difflib.get_close_matches(source, GENERATED, n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise FileNotFoundError(f"{path}: no such task file or dataset directory{hint}")
    return load_task_file(path, columns)
