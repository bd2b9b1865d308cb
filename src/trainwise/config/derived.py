"""Numbers derived from a config, each decided here once: which way a metric improves, how a warmup fraction
becomes steps, how many micro-batches make an optimizer step, which micro-batches are legal, what an unset
`data.seq_len` trains at. Everyone else (the engine, the planner, the rules, the report, the resolve step in
launch/) asks these functions."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol


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


def micro_batch_sizes(per_rank_batch: int) -> list[int]:
    """The legal micro-batches of a rank's share of the batch, smallest first: its divisors, so that the
    accumulated micro-batches add up to the effective batch exactly. The one owner of this rule: the schema's
    checks, the planner's advice and `auto`, and the out-of-memory recovery ask it."""
    return [size for size in range(1, per_rank_batch + 1) if per_rank_batch % size == 0]


def micro_batch_at_most(per_rank_batch: int, limit: int) -> int:
    """The largest legal micro-batch of `per_rank_batch` that is at most `limit` (1 when `limit` is below 1)."""
    return max(size for size in micro_batch_sizes(per_rank_batch) if size <= max(limit, 1))


# What an unset data.seq_len trains at over a corpus whose manifest suggests no length (an older prepare).
DEFAULT_TEXT_SEQ_LEN = 256


def text_sequence_length(seq_len: int | None, manifest: Mapping[str, Any]) -> int:
    """Tokens per training sequence over a prepared text dataset (its `manifest`): `seq_len` when set; unset,
    for instruction data the longest sample `prepare` kept, rounded up to a multiple of 64 and at least the
    suggested length, never past prepare's cut (`--seq-len`, 2,048 by default: a cut, not a length to pack
    to; packing a few hundred short conversations at 2,048 left a handful of optimizer steps); else the
    context length `prepare` suggested for the corpus (DEFAULT_TEXT_SEQ_LEN when the manifest names none)."""
    if seq_len is not None:
        return int(seq_len)
    lengths = manifest.get("lengths") or {}
    instruct = manifest.get("instruct")
    if instruct:
        cut = int(instruct["seq_len"])
        if not lengths.get("max"):  # an older manifest: its cut
            return cut
        return min(cut, max(int(lengths.get("suggested_seq_len") or 0), -(-int(lengths["max"]) // 64) * 64))
    return int(lengths.get("suggested_seq_len") or DEFAULT_TEXT_SEQ_LEN)


# The settings launch/'s resolve step decides when they say `auto` (or are unset): config.yaml records the
# decision. A config that leaves one of them open asks for the same run as a recorded config that holds any value.
RESOLVED_SETTINGS = (("data", "seq_len"), ("train", "precision"), ("train", "strategy"),
                     ("train", "micro_batch_size"), ("model", "attention"), ("model", "dtype"))


def as_recorded(asked: dict[str, Any], recorded: Mapping[str, Any]) -> dict[str, Any]:
    """`asked` (a dumped config) with every setting it leaves to the resolve step taken from `recorded`, so the
    two compare equal when they describe the same run."""
    for section, key in RESOLVED_SETTINGS:
        if asked.get(section, {}).get(key, "auto") in ("auto", None) and key in recorded.get(section, {}):
            asked[section][key] = recorded[section][key]
    return asked
