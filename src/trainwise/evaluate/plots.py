"""The report's figures, drawn with matplotlib (Agg, no display) and inlined as PNG data URIs.

Figures are built with `matplotlib.figure.Figure` directly, not pyplot: no global state, safe in threads.
Building a figure and encoding it (`data_uri`) are apart, so tests read the axes (limits, labels, ticks).
"""
from __future__ import annotations

import base64
import io
import math
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

WIDTH, HEIGHT, DPI = 6.4, 3.2, 110
TRAIN_COLOR, VAL_COLOR, BEST_COLOR = "#1f77b4", "#d62728", "#2ca02c"


def data_uri(figure: Figure) -> str:
    """The PNG encoding of a built figure, as a data URI the report inlines."""
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class PlainLogFormatter(LogFormatter):
    """Log-axis tick labels as plain numbers ("0.3", "2", "10"), not "3×10⁻¹": matplotlib still picks
    which ticks get a label, so the axis does not crowd."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def _axes(title: str, xlabel: str = "step", ylabel: str = "", size=(WIDTH, HEIGHT)):
    figure = Figure(figsize=size)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return figure, ax


def line_chart(title: str, lines: dict[str, list[tuple[float, float]]], *, ylabel: str = "",
               best_step: int | None = None, log_y: bool = False, xlabel: str = "step",
               from_zero: bool = False, y_max: float | None = None) -> Figure | None:
    """One chart of several (x, y) series; None when there is nothing to draw. `from_zero`: the axis starts
    at 0 (shares, percentages, memory), so small noise is drawn small; `y_max`: the top the axis reaches at
    least (100 for a percentage)."""
    lines = {name: [(x, y) for x, y in pts if y is not None and math.isfinite(y)] for name, pts in lines.items()}
    lines = {name: pts for name, pts in lines.items() if pts}
    if not lines:
        return None
    figure, ax = _axes(title, xlabel=xlabel, ylabel=ylabel)
    colors = {"train": TRAIN_COLOR, "val": VAL_COLOR}
    for name, points in lines.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=name, color=colors.get(name), marker="o" if len(xs) < 30 else None,
                markersize=3, linewidth=1.4)
    if best_step is not None:
        ax.axvline(best_step, color=BEST_COLOR, linestyle="--", linewidth=1, label=f"best (step {best_step})")
    if log_y and all(y > 0 for pts in lines.values() for _, y in pts):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(PlainLogFormatter())
        ax.yaxis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))
    elif from_zero or y_max is not None:
        highest = max(y for pts in lines.values() for _, y in pts)
        top = (highest * 1.15 or 1.0) if y_max is None else max(highest * 1.03, y_max)
        ax.set_ylim(0.0 if from_zero else ax.get_ylim()[0], top)
    ax.legend(fontsize=8)
    return figure


def confusion_heatmap(labels: list[str], counts: list[list[int]], normalized: list[list[float]]) -> Figure:
    """Colour = share of the true class (row-normalised), text = count: a rare class's misses stay visible."""
    n = len(labels)
    side = max(3.2, 0.45 * n + 1.6)
    figure, ax = _axes("confusion matrix (colour: share of true class)", xlabel="predicted", ylabel="true",
                       size=(side + 1.0, side))
    ax.grid(False)
    image = ax.imshow(normalized, cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(n), labels, rotation=45 if n > 4 else 0, ha="right" if n > 4 else "center", fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    for i in range(n):
        for j in range(n):
            share = normalized[i][j]
            ax.text(j, i, f"{counts[i][j]}", ha="center", va="center", fontsize=8 if n > 6 else 10,
                    color="white" if share > 0.5 else "black")
    figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return figure


def reliability_diagram(bins: list[dict[str, Any]], ece: float) -> Figure | None:
    """Accuracy per confidence bin against the diagonal, and under it how many samples each bin holds: a
    bar far from the diagonal means little when it stands for three samples."""
    if not bins:
        return None
    figure = Figure(figsize=(HEIGHT + 1.0, HEIGHT + 1.4))
    FigureCanvasAgg(figure)
    ax, counts_ax = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1], "hspace": 0.08})
    ax.set_title(f"calibration (ECE {ece:.3f})", fontsize=10)
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="perfect")
    lowers = [b["lower"] for b in bins]
    widths = [b["upper"] - b["lower"] for b in bins]
    ax.bar(lowers, [b["accuracy"] for b in bins], width=widths, align="edge",
           color=TRAIN_COLOR, alpha=0.7, edgecolor="white", label="accuracy in bin")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    counts = [b["count"] for b in bins]
    bars = counts_ax.bar(lowers, counts, width=widths, align="edge", color="grey", alpha=0.6, edgecolor="white")
    counts_ax.bar_label(bars, labels=[str(c) for c in counts], fontsize=7)
    counts_ax.set_ylim(0, max(counts) * 1.35)
    counts_ax.set_ylabel("samples")
    counts_ax.set_xlabel("confidence")
    return figure


def bar_chart_with_errors(title: str, names: list[str], means: list[float], stds: list[float],
                          ylabel: str, highlight: list[bool] | None = None) -> str | None:
    """Mean ± std per variant (the ablation chart); highlighted bars differ beyond seed noise."""
    if not names:
        return None
    figure, ax = _axes(title, xlabel="", ylabel=ylabel, size=(max(WIDTH, 1.2 * len(names)), HEIGHT + 0.6))
    colors = [VAL_COLOR if h else TRAIN_COLOR for h in (highlight or [False] * len(names))]
    ax.bar(range(len(names)), means, yerr=stds, capsize=4, color=colors, alpha=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    low = min(m - s for m, s in zip(means, stds))
    high = max(m + s for m, s in zip(means, stds))
    pad = (high - low) * 0.3 or abs(high) * 0.05 or 0.05
    ax.set_ylim(low - pad, high + pad)
    return data_uri(figure)
