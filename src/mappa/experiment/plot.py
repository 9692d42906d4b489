"""``heldout_accuracy.png``: held-out accuracy against training steps, one line per arm
(the mean over seeds) with the seeds' min-max band, the base model at step 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mappa.report.charts import LINESTYLES, PALETTE, require_matplotlib


def plot_heldout(results: dict[str, Any], path: Path, title: str) -> Path:
    """Draw the curves of ``results`` (``summarize``'s) to ``path`` (PNG).

    Raises ``MissingReportDependency`` naming the install command without matplotlib.
    """
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for i, (arm, summary) in enumerate(results["arms"].items()):
        points = [p for p in summary["heldout"] if p["n"]]
        if not points:
            continue
        colour = PALETTE[i % len(PALETTE)]
        steps = [p["step"] for p in points]
        seeds = len(summary["seeds"])
        style = LINESTYLES[i % len(LINESTYLES)][0]  # arms that coincide stay visible
        ax.plot(
            steps,
            [p["mean"] for p in points],
            marker="o",
            color=colour,
            linestyle=style,
            label=f"{arm} (n={seeds})",
        )
        ax.fill_between(
            steps, [p["min"] for p in points], [p["max"] for p in points], color=colour, alpha=0.15
        )
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("training steps (0: base model)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
