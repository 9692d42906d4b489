"""The live view of a run: every numeric step metric as a TensorBoard scalar.

``train.tensorboard`` (on by default) makes the trainer write ``<run_dir>/tb/`` as each step
ends, under the same keys as ``metrics.jsonl`` (``coach/<agent>``, ``rl/<agent>/clip_frac``,
``eval/accuracy``, ...), so ``tensorboard --logdir runs/`` shows every run's curves while it
trains and overlays runs side by side. The static report (``mappa report``) is the fuller
view; this is the one that refreshes itself.

tensorboardX imports torch when it is installed, so only the trainer imports this module,
never the report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_ILLEGAL_IN_TAGS = re.compile(r"[^-/\w.]")
"""What TensorBoard refuses in a tag (tensorboardX's own rule)."""


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics TensorBoard can plot: finite numbers (not flags, strings or None), under
    tags it accepts (``eval/avg@1`` -> ``eval/avg_1``, as tensorboardX would rename it, but
    without its warning per key on every step).

    >>> scalars({"step": 3, "coach/v": 7.5, "rl/v/skipped": "", "ok": True, "kl": None})
    {'coach/v': 7.5}
    >>> scalars({"eval/avg@1": 0.5})
    {'eval/avg_1': 0.5}
    """
    return {
        _ILLEGAL_IN_TAGS.sub("_", key): float(value)
        for key, value in metrics.items()
        if key != "step"
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


class ScalarLog:
    """Writes one step's metrics to a TensorBoard event file and flushes, so a step shows up
    in TensorBoard as soon as it is in ``metrics.jsonl``.

    ``resume_step``: on ``mappa train --resume`` the steps from there on are run again, and
    TensorBoard is told to drop the earlier events of those steps (``purge_step``).
    """

    def __init__(self, log_dir: Path, resume_step: int | None = None) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(log_dir), purge_step=resume_step or None)

    def write(self, values: Mapping[str, float], step: int) -> None:
        """One step's ``scalars``."""
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
