"""The report's figures, drawn with matplotlib (Agg, no display) and inlined as PNG data URIs.

Figures are built with `matplotlib.figure.Figure` directly, not pyplot: no global state, safe in threads.
"""
from __future__ import annotations

import base64
import io
import math
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

WIDTH, HEIGHT, DPI = 6.4, 3.2, 110
TRAIN_COLOR, VAL_COLOR, BEST_COLOR = "#1f77b4", "#d62728", "#2ca02c"


def data_uri(figure: Figure) -> str:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _axes(title: str, xlabel: str = "step", ylabel: str = "", size=(WIDTH, HEIGHT)):
    figure = Figure(figsize=size)
    ax = figure.add_subplot()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return figure, ax


def line_chart(title: str, lines: dict[str, list[tuple[float, float]]], *, ylabel: str = "",
               best_step: int | None = None, log_y: bool = False, xlabel: str = "step") -> str | None:
    """One chart of several (x, y) series; None when there is nothing to draw."""
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
    ax.legend(fontsize=8)
    return data_uri(figure)


def confusion_heatmap(labels: list[str], counts: list[list[int]], normalized: list[list[float]]) -> str:
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
    return data_uri(figure)


def reliability_diagram(bins: list[dict[str, Any]], ece: float) -> str | None:
    if not bins:
        return None
    figure, ax = _axes(f"calibration (ECE {ece:.3f})", xlabel="confidence", ylabel="accuracy",
                       size=(HEIGHT + 0.6, HEIGHT))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="perfect")
    widths = [b["upper"] - b["lower"] for b in bins]
    ax.bar([b["lower"] for b in bins], [b["accuracy"] for b in bins], width=widths, align="edge",
           color=TRAIN_COLOR, alpha=0.7, edgecolor="white", label="accuracy in bin")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper left")
    return data_uri(figure)


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
