"""Numbers derived from a config, each decided here once: which way a metric improves, how a warmup fraction
becomes steps, how many micro-batches make an optimizer step. Everyone else (the engine, the planner, the
rules, the report) asks these functions."""
from __future__ import annotations

from typing import Literal, Protocol


class Warmup(Protocol):
    """What a warmup is said with (the schema's ScheduleConfig): a fraction of the run, or a step count."""

    warmup_fraction: float | None
    warmup_steps: int

# Name parts of metrics where lower is better; every other metric is higher-is-better (accuracy, f1, roc_auc,
# r2, mrr, hr@k, ndcg@k). The one place this is decided: early stopping, best checkpoints, curve findings
# and ablations all ask `lower_is_better`.
LOWER_IS_BETTER_PARTS = frozenset({"loss", "error", "mae", "mse", "rmse", "ece", "rank", "perplexity"})


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of `metric` (`loss`, `val/ece`, `test/median_rank`, ...) is the better one."""
    name = metric.split("/")[-1].lower()
    return any(part in LOWER_IS_BETTER_PARTS for part in name.replace("@", "_").split("_"))


def metric_mode(metric: str) -> Literal["min", "max"]:
    """`min` for lower-is-better metrics, `max` otherwise: what `eval.mode: auto` resolves to."""
    return "min" if lower_is_better(metric) else "max"


def warmup_steps(schedule: Warmup, max_steps: int) -> int:
    """Optimizer steps of linear warmup: `warmup_fraction` of the run when set, else `warmup_steps`."""
    if schedule.warmup_fraction is not None:
        return int(round(schedule.warmup_fraction * max_steps))
    return schedule.warmup_steps


def accumulation_steps(batch_size: int, micro_batch_size: int, world_size: int = 1) -> int:
    """Micro-batches each rank accumulates per optimizer step: the effective batch over every rank's
    micro-batch (the config's validators make it divide evenly)."""
    return batch_size // (micro_batch_size * world_size)
