"""The one resolve step: every `auto` or unset setting a run needs becomes a number or a name before the
Trainer is built, and config.yaml records it, so a resume keeps the recorded values (and the checkpoint's
config hash agrees with them). `trainwise train`, `trainwise demo` and Python callers of `train_run` all pass
through here; the engine refuses a micro-batch left at `auto` (it does not import the planner).

- `data.seq_len` unset over a prepared text dataset: the length `trainwise prepare` suggested
  (config.derived.text_sequence_length); data that decides its length as it is built (the built-in corpus)
  has it recorded from the built data (`record_built_length`).
- `model.dtype: auto` (the sft-lora recipe's frozen base): bf16 where the device computes it natively, fp32
  elsewhere (runtime.precision.resolve_weight_dtype); decided before the precision, which depends on it.
- `train.precision: auto`: what this device computes in (runtime.precision, and bf16 for fp32 master weights).
- `train.strategy: auto`: `single` in one process, `ddp` for several CPU ranks; on several CUDA ranks the
  planner's choice for this card (plan/strategy.py: DDP where a replica fits, FSDP where only that fits).
- `train.micro_batch_size: auto`: the largest legal micro-batch whose planned peak fits the memory free on the
  device (plan/auto_micro_batch.py), with its own `micro_batch_auto` event.

Left to the machine that runs, and not recorded: `train.device`, `data.num_workers` and `data.pin_memory`
`auto`. They depend on where the run is (a resume on another machine decides them anew, and config/diff.py
lets a resume change the loader's), and `num_workers: auto` also reads prepared data with threads instead of
worker processes (data/loader.py), which a recorded count would not.

Under torchrun every rank resolves for itself from the same inputs: the config, the manifest, the catalogue
and its card's model and memory, so all ranks reach the same values without talking. The one measured input,
the memory free on each card, is agreed by all of them taking the smallest choice (auto_micro_batch).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainwise.config import RunConfig
from trainwise.config.derived import text_sequence_length
from trainwise.data.bundle import DataBundle
from trainwise.data.prepared import prepared_text_manifest
from trainwise.runtime.device import resolve_device
from trainwise.runtime.precision import resolve_precision, resolve_weight_dtype
from trainwise.train.parallel.distributed import Ranks, launched_ranks, resolve_strategy
from trainwise.train.step.master_weights import computing_precision

EVENT_KIND = "config_resolved"


@dataclass(frozen=True)
class Choice:
    """One setting the step decided: its dotted key, the value config.yaml records, and why."""

    key: str
    value: Any
    why: str


@dataclass
class Resolution:
    """The config with every setting the run needs decided, what was decided, and the planner's own events."""

    config: RunConfig
    choices: list[Choice] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)  # RunDir.log_event's arguments

    def event(self) -> dict | None:
        """The `config_resolved` event (RunDir.log_event's arguments), or None when nothing was left open."""
        if not self.choices:
            return None
        said = "; ".join(f"{c.key}={c.value} ({c.why})" for c in self.choices)
        return {"kind": EVENT_KIND, "message": f"resolved before step 1, recorded in config.yaml: {said}.",
                "evidence": {c.key: {"value": c.value, "why": c.why} for c in self.choices}}


def resolve_run(config: RunConfig) -> Resolution:
    """`config` with its `auto` and unset settings decided for this device and this launch (see the module)."""
    ranks = launched_ranks()
    device = resolve_device(config.train.device, ranks.local_rank if ranks.enabled else None)
    resolution = Resolution(config)
    for decide in (_sequence_length, _weight_dtype, _precision, _strategy):  # the micro-batch is planned with all of them
        choice = decide(resolution.config, ranks, device)
        if choice is not None:
            resolution.config = with_setting(resolution.config, choice.key, choice.value)
            resolution.choices.append(choice)
    if resolution.config.train.micro_batch_size == "auto":
        from trainwise.plan.auto_micro_batch import EVENT_KIND as MICRO_BATCH_EVENT, resolve_micro_batch

        resolution.config, planned = resolve_micro_batch(resolution.config)
        resolution.choices.append(Choice("train.micro_batch_size", planned.micro_batch_size,
                                         f"the planner's fit, see the {MICRO_BATCH_EVENT} event"))
        resolution.events.append(planned.event())
    return resolution


def record_built_length(config: RunConfig, bundle: DataBundle) -> RunConfig:
    """Data that decides its sequence length as it is built (a built-in corpus): config.yaml records it too."""
    built = bundle.notes.get("seq_len")
    if config.data.seq_len is not None or built is None:
        return config
    return with_setting(config, "data.seq_len", int(built))


def with_setting(config: RunConfig, key: str, value: Any) -> RunConfig:
    """`config` with one `section.field` replaced (a decided value: already valid)."""
    section, name = key.split(".")
    return config.model_copy(update={section: getattr(config, section).model_copy(update={name: value})})


def _sequence_length(config: RunConfig, ranks: Ranks, device: torch.device) -> Choice | None:
    manifest = prepared_text_manifest(config.data) if config.data.seq_len is None else None
    if manifest is None:
        return None
    why = ("the longest sample `trainwise prepare` kept, to a multiple of 64" if manifest.get("instruct")
           else "the length `trainwise prepare` suggested for the corpus")
    return Choice("data.seq_len", text_sequence_length(None, manifest), why)


def _weight_dtype(config: RunConfig, ranks: Ranks, device: torch.device) -> Choice | None:
    if config.model.dtype != "auto":  # the user's (or the recipe's) own choice is kept
        return None
    dtype = resolve_weight_dtype("auto", device)
    why = (f"auto on {device.type}: bf16 units" if dtype == "bf16" else
           f"auto on {device.type}: bf16 weights are no faster here than fp32, often slower; model.dtype=bf16 "
           "holds the base in half the memory")
    return Choice("model.dtype", dtype, why)


def _precision(config: RunConfig, ranks: Ranks, device: torch.device) -> Choice | None:
    if config.train.precision != "auto":
        return None
    device_precision = resolve_precision("auto", device)
    precision = computing_precision(device_precision, config.model)
    why = f"auto on {device.type}" + (", fp32 master weights compute in bf16" if precision != device_precision else "")
    return Choice("train.precision", precision, why)


def _strategy(config: RunConfig, ranks: Ranks, device: torch.device) -> Choice | None:
    if config.train.strategy != "auto":
        return None
    if ranks.enabled and device.type == "cuda":  # the planner: does a whole replica fit this card?
        from trainwise.plan.strategy import strategy_for

        card = torch.cuda.get_device_properties(device)
        strategy, why = strategy_for(config, card.name, int(card.total_memory), ranks.world_size)
        return Choice("train.strategy", strategy, why)
    why = f"{ranks.world_size} ranks on the {device.type}" if ranks.enabled else "one process"
    return Choice("train.strategy", resolve_strategy("auto", ranks), why)
