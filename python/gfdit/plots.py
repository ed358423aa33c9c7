"""What the plots of ``gfdit simulate``, ``gfdit run-trace`` and ``gfdit bench`` share: an axes on a figure
drawn without a display, an empirical CDF, the mark of an empty plot, and saving. matplotlib is imported on
first use (the plots are optional)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def axes(width: float, height: float) -> Any:
    """The axes of a new ``width`` x ``height`` inch figure (``ax.figure``) drawn with the Agg backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig.add_subplot()


def cdf(ax: Any, values: Sequence[float], **style: Any) -> None:
    """The empirical CDF of ``values`` as a step from (0, 0): each sorted value lifts it by 1 / count."""
    xs = sorted(values)
    ax.step([0.0, *xs], [0.0, *((i + 1) / len(xs) for i in range(len(xs)))], where="post", **style)


def empty(ax: Any, text: str) -> None:
    """``text`` in the middle of a plot with nothing to draw."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def save(ax: Any, path: str) -> str:
    """Writes the axes' figure to ``path`` (PNG, 120 dpi); returns the path."""
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=120)
    return path
