"""The learning-rate range test's curve, pure: the sweep's schedule (`lr_at`), the smoothed loss, where it
diverges, the suggested rate and its caveats, and the figure — everything `trainwise lr-find` and the report
read off a recorded sweep (lr_find.json). The sweep itself runs training steps: trainwise.check.lr_find.

The rule (Smith 2017, "Cyclical Learning Rates for Training Neural Networks", §3.3; popularised by fastai's
`lr_find`): smooth the loss with an exponential moving average corrected for its zero start, stop once the
smoothed loss passes `DIVERGENCE_FACTOR` × its best, and suggest the rate at the smoothed minimum / 10.
"""
from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, field

from trainwise.errors import ConfigError, TrainingError

DEFAULT_MIN_LR, DEFAULT_MAX_LR = 1e-6, 1.0  # wide enough for Adam (≈1e-4..1e-2) and SGD (≈1e-2..1)
MAX_STEPS = 100  # fastai's default: ~17 points per decade over 6 decades
MIN_STEPS = 50
SWEEP_EPOCHS = 8  # on small data, fewer steps: a long sweep would mostly measure memorisation
SMOOTHING = 0.9  # EMA factor. fastai uses 0.98, whose ~50-step lag would move a 100-step curve by 3
#                   decades; 0.9 averages ~10 steps: enough against batch noise, half a decade of lag
DIVERGENCE_FACTOR = 4.0  # smoothed loss above 4× its best: the run has diverged (fastai's stop rule)
READ_EVERY = 10  # steps between reads of the device losses
SUGGESTION_DIVISOR = 10.0
RULE = ("lr at the minimum of the smoothed loss, divided by 10 (fastai's lr_min; Smith 2017 §3.3): the "
        "largest rate that still lowers the loss, with a margin for the longer run that follows")


@dataclass(frozen=True)
class SweepSettings:
    min_lr: float = DEFAULT_MIN_LR
    """First learning rate of the sweep."""
    max_lr: float = DEFAULT_MAX_LR
    """Last learning rate, reached only if the loss never diverges."""
    steps: int | None = None
    """Optimizer steps of the sweep; None: `default_steps` of the training data."""
    smoothing: float = SMOOTHING
    """EMA factor of the smoothed curve (0: no smoothing)."""
    divergence_factor: float = DIVERGENCE_FACTOR
    """Stop when the smoothed loss exceeds this multiple of its best."""

    def check(self) -> None:
        if not (0 < self.min_lr < self.max_lr) or not math.isfinite(self.max_lr):
            raise ConfigError(f"lr-find: need 0 < --min-lr < --max-lr (got {self.min_lr:g} and {self.max_lr:g}).")
        if self.steps is not None and self.steps < 10:
            raise ConfigError(f"lr-find: --steps {self.steps} is too few for a curve; use at least 10.")
        if not 0 <= self.smoothing < 1 or self.divergence_factor <= 1:
            raise ConfigError("lr-find: smoothing must be in [0, 1) and the divergence factor above 1.")


@dataclass(frozen=True)
class LrFindResult:
    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    suggestion: float
    steps_planned: int
    diverged: bool
    """The sweep stopped because the smoothed loss passed `divergence_factor` × its best."""
    settings: SweepSettings
    note: str = ""
    """Said when the curve makes the suggestion doubtful (the loss never fell, or never diverged)."""
    context: dict = field(default_factory=dict)
    """What the suggestion holds for: optimizer, batch size, precision, device (a new batch size or
    optimizer needs a new sweep)."""
    rule: str = field(default=RULE)

    @property
    def override(self) -> str:
        return f"optim.lr={self.suggestion:.3g}"

    def to_dict(self) -> dict:
        return {"suggestion": self.suggestion, "override": self.override, "rule": self.rule, "note": self.note,
                "diverged": self.diverged, "steps_run": len(self.lrs), "steps_planned": self.steps_planned,
                "settings": asdict(self.settings), "context": self.context, "lrs": self.lrs,
                "losses": self.losses, "smoothed": self.smoothed}


# ---- the curve (pure) ---------------------------------------------------------------------------------

def lr_at(step: int, steps: int, min_lr: float, max_lr: float) -> float:
    """The exponential sweep: equal ratios between steps, `min_lr` at step 0, `max_lr` at the last."""
    return min_lr * (max_lr / min_lr) ** (step / max(1, steps - 1))


def smooth(losses: list[float], beta: float = SMOOTHING) -> list[float]:
    """Exponential moving average divided by (1 - beta^n): without the correction the first values would
    be pulled toward the average's zero start."""
    average, smoothed = 0.0, []
    for n, loss in enumerate(losses, start=1):
        average = beta * average + (1 - beta) * loss
        smoothed.append(average / (1 - beta ** n) if beta else loss)
    return smoothed


def divergence_index(smoothed: list[float], factor: float = DIVERGENCE_FACTOR) -> int | None:
    """The first index where the smoothed loss is not finite or above `factor` × the best so far."""
    best = math.inf
    for index, value in enumerate(smoothed):
        if not math.isfinite(value) or value > factor * best:
            return index
        best = min(best, value)
    return None


def suggest_lr(lrs: list[float], smoothed: list[float]) -> float:
    """The rule (RULE): lr at the smoothed curve's minimum / 10. The minimum, not the steepest slope:
    a slope of a noisy curve jumps between neighbouring points, while the minimum of a smoothed one moves
    little, so the same recipe gets the same suggestion run after run."""
    finite = [(loss, lr) for lr, loss in zip(lrs, smoothed) if math.isfinite(loss)]
    if not finite:
        raise TrainingError("lr-find: the loss was never finite, even at the smallest learning rate; check "
                            "the data for NaN/Inf and the model's output (`trainwise diagnose` on a short run).")
    _, lr_of_min = min(finite)
    return lr_of_min / SUGGESTION_DIVISOR


def default_steps(steps_per_epoch: int) -> int:
    return max(MIN_STEPS, min(MAX_STEPS, SWEEP_EPOCHS * steps_per_epoch))


def curve_note(lrs: list[float], smoothed: list[float], suggestion: float, diverged: bool,
          settings: SweepSettings) -> str:
    finite = [s for s in smoothed if math.isfinite(s)]
    if min(finite) > 0.97 * finite[0]:
        return ("the loss hardly fell anywhere in the sweep: the suggestion is a guess. Check the data and "
                "labels, or sweep longer (--steps).")
    lowest = smoothed.index(min(finite))
    if not diverged and lowest >= len(smoothed) - 5:  # still falling at the end of the sweep
        return (f"the loss was still falling at {lrs[-1]:.3g}, the end of the sweep: the suggestion may be "
                "low; try a larger --max-lr.")
    if suggestion < settings.min_lr:
        return f"the loss was lowest at the start of the sweep: try a smaller --min-lr than {settings.min_lr:g}."
    return ""


def render_png(result: LrFindResult) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 3.6))  # a Figure, not pyplot: no global state
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    points = [(lr, raw, s) for lr, raw, s in zip(result.lrs, result.losses, result.smoothed)
              if math.isfinite(raw) and math.isfinite(s)]
    if points:
        xs, raw, smoothed = zip(*points)
        ax.plot(xs, raw, color="#1f77b4", alpha=0.3, linewidth=1, label="loss")
        ax.plot(xs, smoothed, color="#1f77b4", linewidth=1.8, label="smoothed")
        # the diverged tail can be 100× the rest: keep the part of the curve the suggestion is read from
        low, high = min(min(raw), min(smoothed)), max(smoothed[0], max(smoothed[:-1] or smoothed))
        ax.set_ylim(low - 0.05 * (high - low), high + 0.5 * (high - low))
    ax.axvline(result.suggestion, color="#2ca02c", linestyle="--", linewidth=1.2,
               label=f"suggested {result.override}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title("learning-rate range test" + (" (stopped at divergence)" if result.diverged else ""), fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight", facecolor="white")
    return buffer.getvalue()


def finite_json(value):
    """A NaN/Inf loss (the diverged point) as a string: strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_json(v) for v in value]
    return value
