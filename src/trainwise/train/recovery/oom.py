"""Out of memory inside a step: what to change, one thing at a time, so the run goes on unchanged.

The effective batch (`train.batch_size`) is what the optimizer sees; the micro-batch is only how it is
cut. Halving the micro-batch and accumulating twice as many gives the same gradient over the same samples,
so the optimizer's trajectory does not change — only the step gets slower. At a micro-batch of 1 the next
lever is gradient checkpointing (the built-in models have the switch); after that, the job does not fit
this device and the advice is the planner's.

Under DDP every rank must take the same decision on the same step, and the hard part is that a rank which
runs out of memory in forward/backward never reaches the gradient all-reduce its peers are already waiting
in: they cannot learn of it, and time out. So the steps where memory runs out in practice — the first
`GUARDED_STEPS` after a start, a resume or a micro-batch change, where the allocator reaches its peak — are
*guarded*: each rank runs its micro-batches through the plain model (no DDP hook, no collective), then one
tiny all-reduce says which ranks ran out of memory (one host read per guarded step). None did: the gradients
are averaged over the ranks in a few bucketed all-reduces and the update runs, the same update as DDP's.
One did: every rank drops the step, shrinks the micro-batch to the same size and retries the same samples,
guarded again. After the window the normal DDP step runs, its all-reduce overlapped with backward and no
host read between settle points; an out-of-memory error there cannot be agreed on, so that rank stops with
a message saying so, and its peers stop on the lost-peer path (train/parallel/distributed.py: peer_lost, within
`train.dist_timeout_s`). A resume starts guarded again.

The tradeoff is deliberate: a guarded step gives up the overlap of communication with backward and waits
once for the device, a few times per run; the steady state pays nothing. torch's Join context
(torch.distributed.algorithms.Join) was considered: it lets a rank that has stopped shadow its peers'
collectives, for uneven inputs, but a joined rank contributes zero gradients (a different update), cannot
rejoin the same step, and adds an all-reduce to every forward; it cannot retry a step. FSDP is not guarded:
its forward itself gathers parameters, so a rank that fails mid-forward leaves the others in a collective.
"""
from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainwise.config import accumulation_steps
from trainwise.config.derived import micro_batch_at_most
from trainwise.errors import TrainingError
from trainwise.llm.methods import enable_gradient_checkpointing, gradient_checkpointing_enabled
from trainwise.train.parallel.distributed import agree, average_gradients
from trainwise.train.step.state import TrainState
from trainwise.data.batch import MicroBatch
from trainwise.train.step.train_step import STEP_RANGE, StepOutcome, TrainStep

if TYPE_CHECKING:
    from trainwise.rundir.layout import RunDir
    from trainwise.train.parallel.distributed import Ranks

# optimizer steps guarded after a start, a resume or a micro-batch change: step 1's forward/backward runs
# before the optimizer's moments exist, step 2's with them in place (the usual peak), step 3 covers the
# allocator's fragmentation. (Running out of memory in the update itself is not a micro-batch problem.)
GUARDED_STEPS = 3


class OomGuard:
    """Runs the steps of a run so that running out of memory is recoverable: one process catches it; the
    ranks of a DDP job agree on it during the guarded steps (see the module docstring). Recovering changes
    the run's TrainState (its micro-batch size: the one holder) or the model (gradient checkpointing)."""

    def __init__(self, train_step: TrainStep, state: TrainState, run_dir: "RunDir", ranks: "Ranks", *,
                 batch_size: int, ddp: bool, recover: bool):
        self.train_step, self.state, self.run_dir, self.ranks = train_step, state, run_dir, ranks
        self.batch_size, self.recover_policy = batch_size, recover
        self.agreed = ranks.enabled and ddp and recover
        self.guarded_left = GUARDED_STEPS if self.agreed else 0

    @property
    def guarding(self) -> bool:
        return self.guarded_left > 0

    def may_recover(self) -> bool:
        """Under torchrun the other ranks wait in the gradient all-reduce: agreeing needs a collective that
        the failed rank can no longer reach, so only the guarded steps of a DDP run recover."""
        return self.recover_policy and (not self.ranks.enabled or self.guarding)

    def restart(self) -> None:
        """A new micro-batch: its first steps are guarded again."""
        self.guarded_left = GUARDED_STEPS if self.agreed else 0

    def step(self, micro_batches: Sequence[MicroBatch]) -> tuple[StepOutcome | None, list[int]]:
        """(the step's outcome, []) or (None, the ranks that ran out of memory) when the step is to be retried
        smaller. Raises when running out of memory cannot be recovered from here."""
        if self.guarding:
            return self._guarded_step(micro_batches)
        try:
            return self.train_step(micro_batches), []
        except torch.OutOfMemoryError as error:
            if not self.may_recover():
                if self.agreed:  # past the guarded steps the peers already wait in the all-reduce
                    raise TrainingError(unagreed_oom_message(self.ranks, self.state)) from error
                raise
        return None, [self.ranks.rank]  # outside the except clause: the failed step's frames are gone

    def _guarded_step(self, micro_batches: Sequence[MicroBatch]) -> tuple[StepOutcome | None, list[int]]:
        ranks = self.ranks
        with torch.profiler.record_function(STEP_RANGE):
            loss, out_of_memory = None, False
            try:
                loss = self.train_step.accumulate(micro_batches, local=True)
            except torch.OutOfMemoryError:
                out_of_memory = True
            # one tiny all-reduce, one host read: which ranks got through
            failed = agree([out_of_memory and rank == ranks.rank for rank in range(ranks.world_size)],
                           self.train_step.device)
            if any(failed):
                return None, [rank for rank, flag in enumerate(failed) if flag]
            average_gradients(self.train_step.parameters)
            self.guarded_left -= 1
            return self.train_step.update(loss), []

    def recover(self, failed_ranks: Sequence[int] = ()) -> None:
        """Free what the failed step held, then change one thing: a smaller micro-batch, else gradient
        checkpointing; the caller retries the step on the same samples, guarded again. Raises when nothing is
        left. Under DDP every rank calls it on the same step with the same state (`failed_ranks`: those that
        ran out of memory), so every rank makes the same change."""
        train_step, state, ranks = self.train_step, self.state, self.ranks
        train_step.optimizer.zero_grad(set_to_none=True)  # a partial accumulation must not reach the update
        gc.collect()
        if train_step.device.type == "cuda":
            torch.cuda.empty_cache()
        step, old, batch_size = state.step + 1, state.micro_batch_size, self.batch_size
        smaller = smaller_micro_batch(old, batch_size // ranks.world_size)
        where = f" on rank {', '.join(map(str, failed_ranks))}" if ranks.enabled and failed_ranks else ""
        evidence = {"ranks": list(failed_ranks)} if ranks.enabled else {}
        if smaller is not None:
            state.micro_batch_size = smaller  # accumulation steps, the sampler's cut and the eval batch follow
            accumulated = accumulation_steps(batch_size, smaller, ranks.world_size)
            self.run_dir.log_event(
                "oom_recovered", f"out of memory at step {step}{where} with micro-batch {old}; retrying with "
                f"micro-batch {smaller} × {accumulated} accumulated"
                f"{' on every rank' if where else ''} (effective batch {batch_size} unchanged, so the optimizer's "
                "trajectory is the same)", severity="warning", step=step,
                evidence={"old_micro_batch_size": old, "micro_batch_size": smaller,
                          "accumulation_steps": accumulated, **evidence})
        elif can_checkpoint(train_step.model):
            enable_gradient_checkpointing(train_step.model)
            self.run_dir.log_event("oom_recovered", f"out of memory at step {step}{where} with micro-batch 1; "
                                   "retrying with gradient checkpointing (activations recomputed in backward)",
                                   severity="warning", step=step,
                                   evidence={"gradient_checkpointing": True, **evidence})
        else:
            message = out_of_memory_advice(step, old, train_step.precision)
            self.run_dir.log_event("oom", message, severity="error", step=step,
                                   evidence={"micro_batch_size": old, "precision": train_step.precision, **evidence})
            raise TrainingError(message)
        self.restart()  # the first steps after a change are where memory runs out


def unagreed_oom_message(ranks: "Ranks", state: TrainState) -> str:
    return (f"out of memory on rank {ranks.rank} at step {state.step + 1} with micro-batch "
            f"{state.micro_batch_size}, after the first {GUARDED_STEPS} steps: the other ranks of this "
            f"{ranks.world_size}-rank DDP job were already reducing gradients, so they cannot agree on a smaller "
            "micro-batch and stop too. The last checkpoint is intact: `trainwise resume RUN` starts guarded again "
            "(an out-of-memory error in its first steps shrinks the micro-batch on every rank); if it recurs, "
            "train with a smaller train.micro_batch_size.")


def smaller_micro_batch(current: int, per_rank_batch: int) -> int | None:
    """The largest micro-batch at most half of `current` that divides the per-rank batch, or None at 1."""
    if current <= 1:
        return None
    return micro_batch_at_most(per_rank_batch, current // 2)


def can_checkpoint(model: nn.Module) -> bool:
    """Whether the model has a gradient-checkpointing switch that is off: the built-in models' attribute, or a
    Hugging Face model's (also inside a peft wrapper) `activation_checkpointing_enable`."""
    if gradient_checkpointing_enabled(model):
        return False
    hf_switch = any(callable(getattr(model, name, None)) for name in ("activation_checkpointing_enable",
                                                                       "gradient_checkpointing_enable"))
    return hf_switch and bool(getattr(model, "supports_gradient_checkpointing", True)) or \
        getattr(model, "gradient_checkpointing", None) is False


def out_of_memory_advice(step: int, micro_batch_size: int, precision: str) -> str:
    cheaper = "" if precision in ("bf16", "fp16") else "train.precision=bf16 (Ampere or newer) or fp16, "
    return (f"out of memory at step {step} even with micro-batch {micro_batch_size} and gradient checkpointing: "
            f"this job does not fit this device. Try {cheaper}a card with more memory (`trainwise plan RECIPE` "
            "lists the ones it fits), or shard the model over several cards (FSDP).")
