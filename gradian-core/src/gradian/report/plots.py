"""PNG plots for the report, drawn with matplotlib's Agg canvas (no pyplot, no global backend change).

matplotlib is an optional extra (``gradian-core[plots]``); it is imported only inside these functions.
"""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BLAME_PLOT = "blame_distribution.png"
ITEMS_PLOT = "item_scores.png"
MAX_LABELLED_ITEMS = 60
MISSING_NOTE = "Plots skipped: matplotlib is not installed (pip install 'gradian-core[plots]')."


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported, without importing it."""
    return importlib.util.find_spec("matplotlib") is not None


def blame_distribution_png(blame: np.ndarray, accused_mask: np.ndarray | None = None,
                           accused_name: str | None = None) -> bytes:
    """Histogram of every example's blame, with the accused cluster's members drawn on top."""
    figure, axes = _figure(7.0, 4.0)
    blame = np.asarray(blame, dtype=np.float64)
    bins = np.histogram_bin_edges(blame, bins=min(60, max(10, int(np.sqrt(blame.size)))))
    axes.hist(blame, bins=bins, color="#9aa5b1", label="all examples")
    if accused_mask is not None and np.any(accused_mask):
        axes.hist(blame[accused_mask], bins=bins, color="#d64545", alpha=0.85,
                  label=f"accused cluster {accused_name}" if accused_name else "accused cluster")
    axes.axvline(0.0, color="#333333", linewidth=0.8)
    axes.set_xlabel("aggregated blame (positive = pushed the model toward the failure)")
    axes.set_ylabel("training examples")
    axes.set_title("Blame distribution")
    axes.legend(loc="best", frameon=False)
    return _png(figure)


def item_scores_png(items: Sequence[dict[str, Any]], metric: str) -> bytes:
    """Base vs fine-tuned score per eval item: a line from one to the other, red where the item regressed."""
    figure, axes = _figure(7.0, max(2.5, min(12.0, 0.22 * len(items) + 1.2)))
    for row, item in enumerate(items):
        base, tuned = item["base_score"], item["finetuned_score"]
        color = "#d64545" if item["regressed"] else "#9aa5b1"
        axes.plot([base, tuned], [row, row], color=color, linewidth=1.2)
        axes.scatter([base], [row], color="#2f6fb0", s=14, zorder=3)
        axes.scatter([tuned], [row], color=color, marker="x", s=18, zorder=3)
    if len(items) <= MAX_LABELLED_ITEMS:
        axes.set_yticks(range(len(items)))
        axes.set_yticklabels([str(item["id"]) for item in items], fontsize=6)
    else:  # past this many rows the ids overlap into noise
        axes.set_yticks([])
        axes.set_ylabel(f"{len(items)} eval items")
    axes.invert_yaxis()
    axes.set_xlabel(f"{metric} (dot: base, cross: fine-tuned; red: regressed)")
    axes.set_title("Base vs fine-tuned per eval item")
    return _png(figure)


def _figure(width: float, height: float) -> tuple[Figure, Axes]:
    # matplotlib is the optional `plots` extra, imported only to draw: reading a report never needs it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot(1, 1, 1)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    # No Software/date metadata, so the same data gives the same bytes.
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
