"""Charts for the report: matplotlib (Agg) drawn to SVG and inlined into the page.

SVG keeps the report a single static file that needs no script to draw its charts and stays
sharp at any zoom; text stays text (``svg.fonttype: none``), so a chart is a few kilobytes.
matplotlib is the ``report`` extra: ``require_matplotlib`` says how to install it instead
of failing with a bare ImportError.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

INSTALL_HINT = "pip install 'mappa-rl[report]'"

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)
"""Colours by index (matplotlib's tab10, reordered so the first three read apart)."""

LINESTYLES = (("-", "solid"), ("--", "dashed"), (":", "dotted"), ("-.", "dash-dot"))
"""Line styles by run (matplotlib's and the name the page gives it), so overlaid runs stay
apart when their agents share a colour."""


class MissingReportDependency(ImportError):
    """The report's plotting library is not installed."""


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or an error naming the install command."""
    try:
        import matplotlib
    except ImportError as err:
        raise MissingReportDependency(
            f"mappa report draws its charts with matplotlib, which is not installed: "
            f"run `{INSTALL_HINT}`"
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "mappa",  # the same data draws the same file
            "font.size": 8,
            "axes.titlesize": 9,
            "legend.fontsize": 7,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


@dataclass
class Series:
    """One line of a chart: ``ys[i]`` at step ``xs[i]`` (steps without a value left out)."""

    label: str
    xs: list[float]
    ys: list[float]
    color: int = 0
    style: int = 0


_REF = re.compile(r'(\bid="|url\(#|href="#)')


def _inline_svg(fig: Any, prefix: str) -> str:
    """The figure as an ``<svg>`` element for inlining: the XML prolog dropped and every id
    (and reference to one) prefixed, so two charts in one page never share a clip-path id."""
    plt = require_matplotlib()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    return _REF.sub(lambda m: f"{m.group(1)}{prefix}-", svg[svg.index("<svg") :])


def readable_limits(
    series: Sequence[Series],
) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """Axis limits for a chart of one step or of one value (None: matplotlib's own): a step
    either side, and 10 % of the value (0.05 at least) either side, where matplotlib would
    zoom to a few percent of the value (one accuracy of 1.0 on an axis from 0.96 to 1.04).

    >>> readable_limits([Series("a", [3.0], [1.0])])
    ((2.0, 4.0), (0.9, 1.1))
    >>> readable_limits([Series("a", [0.0, 1.0], [0.2, 0.5])])
    (None, None)
    """
    xs = {x for s in series for x in s.xs}
    ys = {y for s in series for y in s.ys}
    xlim = ylim = None
    if len(xs) == 1:
        x = next(iter(xs))
        xlim = (x - 1.0, x + 1.0)
    if len(ys) == 1:
        y = next(iter(ys))
        pad = max(abs(y) * 0.1, 0.05)
        ylim = (y - pad, y + pad)
    return xlim, ylim


def line_chart(
    title: str, ylabel: str, series: Sequence[Series], chart_id: str, xlabel: str = "step"
) -> str:
    """A line chart over training steps; a legend when there is more than one line (below
    the axes when there are many). A chart of one step, or of one value, keeps a readable
    range around it (matplotlib's own is a few percent of the value)."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(4.4, 2.7))
    for s in series:
        ax.plot(
            s.xs,
            s.ys,
            label=s.label,
            color=PALETTE[s.color % len(PALETTE)],
            linestyle=LINESTYLES[s.style % len(LINESTYLES)][0],
            marker="o" if len(s.xs) <= 20 else None,
            markersize=3,
            linewidth=1.4,
        )
    xlim, ylim = readable_limits(series)
    if xlim:
        ax.set_xlim(*xlim)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    if len(series) > 3:  # overlaid runs: a legend inside would cover the lines
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    elif len(series) > 1:
        ax.legend(loc="best", frameon=False)
    return _inline_svg(fig, chart_id)


def histogram_chart(
    title: str, groups: dict[str, list[int]], chart_id: str, xlabel: str = "coach score"
) -> str:
    """Grouped bars over the 11 score bins of ``coachstats.spread`` (share of each group, so
    groups of different sizes compare)."""
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(4.4, 2.7))
    width = 0.8 / max(1, len(groups))
    for i, (label, hist) in enumerate(groups.items()):
        total = sum(hist) or 1
        xs = [b + (i - (len(groups) - 1) / 2) * width for b in range(len(hist))]
        ax.bar(
            xs,
            [h / total for h in hist],
            width=width,
            label=f"{label} (n={sum(hist)})",
            color=PALETTE[i % len(PALETTE)],
        )
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of actions")
    ax.set_xticks(range(11))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="best", frameon=False)
    return _inline_svg(fig, chart_id)
