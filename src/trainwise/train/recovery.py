"""Out of memory inside a step: what to change, one thing at a time, so the run goes on unchanged.

The effective batch (`train.batch_size`) is what the optimizer sees; the micro-batch is only how it is
cut. Halving the micro-batch and accumulating twice as many gives the same gradient over the same samples,
so the optimizer's trajectory does not change — only the step gets slower. At a micro-batch of 1 the next
lever is gradient checkpointing (the built-in models have the switch); after that, the job does not fit
this device and the advice is the planner's.
"""
from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainwise.errors import TrainingError

if TYPE_CHECKING:
    from trainwise.train.trainer import Trainer


def recover_from_oom(trainer: "Trainer") -> None:
    """Free what the failed step held, then change one thing: a smaller micro-batch, else gradient
    checkpointing; the Trainer retries the step on the same samples. Raises when nothing is left."""
    trainer.optimizer.zero_grad(set_to_none=True)  # a partial accumulation must not reach the update
    gc.collect()
    if trainer.device.type == "cuda":
        torch.cuda.empty_cache()
    step, old, batch_size = trainer.step + 1, trainer.micro_batch_size, trainer.config.train.batch_size
    smaller = smaller_micro_batch(old, batch_size // trainer.ranks.world_size)
    if smaller is not None:
        trainer.set_micro_batch(smaller)
        trainer.run_dir.log_event(
            "oom_recovered", f"out of memory at step {step} with micro-batch {old}; retrying with micro-batch "
            f"{smaller} × {trainer.accumulation_steps} accumulated (effective batch {batch_size} unchanged, so "
            "the optimizer's trajectory is the same)", severity="warning", step=step,
            evidence={"old_micro_batch_size": old, "micro_batch_size": smaller,
                      "accumulation_steps": trainer.accumulation_steps})
    elif can_checkpoint(trainer.model):
        trainer.model.gradient_checkpointing = True
        trainer.run_dir.log_event("oom_recovered", f"out of memory at step {step} with micro-batch 1; retrying "
                                  "with gradient checkpointing (activations recomputed in backward)",
                                  severity="warning", step=step, evidence={"gradient_checkpointing": True})
    else:
        message = out_of_memory_advice(step, old, trainer.precision)
        trainer.run_dir.log_event("oom", message, severity="error", step=step,
                                  evidence={"micro_batch_size": old, "precision": trainer.precision})
        raise TrainingError(message)


def smaller_micro_batch(current: int, per_rank_batch: int) -> int | None:
    """The largest micro-batch at most half of `current` that divides the per-rank batch, or None at 1."""
    if current <= 1:
        return None
    return max(size for size in range(1, current // 2 + 1) if per_rank_batch % size == 0)


def can_checkpoint(model: nn.Module) -> bool:
    """Whether the model has a gradient-checkpointing switch that is off (the built-in models do)."""
    return getattr(model, "gradient_checkpointing", None) is False


def out_of_memory_advice(step: int, micro_batch_size: int, precision: str) -> str:
    cheaper = "" if precision in ("bf16", "fp16") else "train.precision=bf16 (Ampere or newer) or fp16, "
    return (f"out of memory at step {step} even with micro-batch {micro_batch_size} and gradient checkpointing: "
            f"this job does not fit this device. Try {cheaper}a card with more memory (`trainwise plan RECIPE` "
            "lists the ones it fits), or shard the model over several cards (FSDP).")
