"""Figures of reports and benchmarks: a row of panels, drawn and written as a PNG file."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

__all__ = ["Panel", "save_figure"]


@dataclass(frozen=True)
class Panel:
    """One plot of a figure: its axes' labels, scales, range and title."""

    xlabel: str
    ylabel: str
    xscale: str = "linear"
    yscale: str = "linear"
    title: str = ""
    ylim: tuple[float, float] | None = None


def save_figure(
    path: Path,
    panels: Sequence[Panel],
    draw: Callable[[list[Axes]], None],
    *,
    width: float = 6.0,
    title: str = "",
    dpi: int = 110,
) -> Path:
    """Draw a row of ``panels`` and write it to ``path`` (a PNG file).

    Parameters
    ----------
    path : Path
        The file to write.
    panels : sequence of Panel
        The plots, left to right.
    draw : callable
        Plots the curves (with labels) on the axes; labels, scales, ranges, titles and
        legends are set here from the panels.
    width : float
        Inches per panel.
    title : str
        The figure's title, if any.
    dpi : int
        Resolution.

    Returns
    -------
    Path
        ``path``.
    """
    fig, grid = plt.subplots(1, len(panels), figsize=(width * len(panels), 4.2), squeeze=False)
    axes = list(grid[0])
    draw(axes)
    for ax, panel in zip(axes, panels, strict=True):
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.set_xscale(panel.xscale)
        ax.set_yscale(panel.yscale)
        if panel.ylim is not None:
            ax.set_ylim(*panel.ylim)
        if panel.title:
            ax.set_title(panel.title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
