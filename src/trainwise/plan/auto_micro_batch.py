"""`train.micro_batch_size: auto`: the largest micro-batch that fits the memory free on this device.

The planner's own estimate decides: the run's training step traced on fake tensors (plan/memory.py, the
same TrainStep the Trainer runs) gives the peak memory as a function of the micro-batch; the budget is the
memory actually free now — `torch.cuda.mem_get_info` on a card, available host RAM (psutil) on the CPU —
less a safety margin. The choice is the largest divisor of the per-rank batch whose peak fits. On a card at
most two real steps confirm it (a smaller divisor after an out-of-memory error); the Trainer's out-of-memory
recovery covers what is left. Under torchrun each rank measures its own device and all take the smallest
choice. The run directory records the choice and its numbers as a `micro_batch_auto` event; config.yaml
records the number, so a resume keeps it.

The engine does not import the planner (tests/test_architecture.py): launch/'s resolve step calls
`resolve_micro_batch` before the Trainer is built, for `trainwise train`, `demo` and Python callers alike.
"""
from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from trainwise.config import RunConfig
from trainwise.config.derived import micro_batch_sizes
from trainwise.plan.advise import (ALLOCATOR_SLACK_BYTES, CUBLAS_32MIB_MAJORS, CUBLAS_WORKSPACE_BYTES,
                                   CUDNN_WORKSPACE_BYTES, SAFETY_MARGIN)
from trainwise.plan.job import estimate_job, job_from_config
from trainwise.plan.llm_job import LmJob
from trainwise.plan.memory import build_train_step
from trainwise.plan.traced_step import TrainingStep
from trainwise.plan.probe import host_batches
from trainwise.runtime.device import resolve_device
from trainwise.runtime.precision import resolve_precision
from trainwise.train.parallel.distributed import init_distributed, launched_ranks

EVENT_KIND = "micro_batch_auto"
MiB = 2**20
MAX_PROBE_STEPS = 2  # real steps on a card that confirm the estimate (each one a full step's peak)


@dataclass(frozen=True)
class MicroBatchChoice:
    """What `auto` resolved to on this device, and why: the numbers of the event."""

    micro_batch_size: int
    per_rank_batch: int
    device: str
    free_bytes: int  # free on the device when the run started (CUDA) or available host RAM (CPU)
    margin_bytes: int  # kept free: a share of the device's total memory
    fixed_bytes: int  # beyond the traced step: cuBLAS/cuDNN workspaces and allocator slack (CUDA)
    budget_bytes: int  # free - margin - fixed: what the step's peak may reach
    estimated_peak_bytes: int  # the planner's peak at the chosen micro-batch
    next_micro_batch_size: int | None  # the next larger divisor of the per-rank batch, if any
    next_estimated_peak_bytes: int | None
    fits: bool  # False: not even a micro-batch of 1 is estimated to fit (the run starts at 1 anyway)
    probes: tuple[tuple[int, bool], ...] = ()  # real steps on a card: (micro-batch, ran without OOM)
    ranks_agreed: int = 1  # ranks whose smallest choice this is

    def evidence(self) -> dict:
        return {**asdict(self), "probes": [list(p) for p in self.probes]}

    def event(self) -> dict:
        """RunDir.log_event's arguments: the record events.jsonl keeps of this choice."""
        return {"kind": EVENT_KIND, "message": self.message(), "severity": "info" if self.fits else "warning",
                "evidence": self.evidence()}

    def message(self) -> str:
        why = (f"estimated peak {_size(self.estimated_peak_bytes)} fits the budget of {_size(self.budget_bytes)} "
               f"({_size(self.free_bytes)} free on {self.device}, less a {_size(self.margin_bytes)} safety margin"
               + (f" and {_size(self.fixed_bytes)} of workspaces" if self.fixed_bytes else "") + ")")
        if not self.fits:
            why = (f"even micro-batch 1 is estimated at {_size(self.estimated_peak_bytes)}, over the budget of "
                   f"{_size(self.budget_bytes)} ({_size(self.free_bytes)} free on {self.device}): starting at 1; "
                   "an out-of-memory error then turns on gradient checkpointing or stops with advice")
        elif self.next_micro_batch_size is not None:
            why += (f"; the next size, {self.next_micro_batch_size}, is estimated at "
                    f"{_size(self.next_estimated_peak_bytes or 0)}")
        confirmed = "".join(f"; a real step at {size} {'ran' if ok else 'ran out of memory'}"
                            for size, ok in self.probes)
        ranks = f"; the smallest choice of {self.ranks_agreed} ranks" if self.ranks_agreed > 1 else ""
        return (f"train.micro_batch_size=auto -> {self.micro_batch_size} of a per-rank batch of "
                f"{self.per_rank_batch}: {why}{confirmed}{ranks}.")


def _size(n: int) -> str:
    return f"{n / MiB:,.1f} MiB" if abs(n) >= MiB else f"{n / 2**10:,.1f} KiB"


def choose_micro_batch(peak: Callable[[int], float], per_rank_batch: int, budget: float
                       ) -> tuple[int, int | None, bool]:
    """(the largest legal micro-batch of `per_rank_batch` (config.derived) whose `peak` fits `budget`, the next
    larger one, whether anything fits). Pure: the estimate and the budget are the inputs."""
    divisors = micro_batch_sizes(per_rank_batch)
    fitting = [d for d in divisors if peak(d) <= budget]
    chosen = fitting[-1] if fitting else 1
    larger = [d for d in divisors if d > chosen]
    return chosen, (larger[0] if larger else None), bool(fitting)


def free_memory_bytes(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes where the step's tensors live: the card's, or the host's available RAM."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def resolve_micro_batch(config: RunConfig) -> tuple[RunConfig, MicroBatchChoice]:
    """`config` with `train.micro_batch_size: auto` replaced by the number chosen for this device (and, under
    torchrun, agreed by every rank), and the choice with its reasoning."""
    train = config.train
    if train.micro_batch_size != "auto":
        raise ValueError("resolve_micro_batch: train.micro_batch_size is not auto")
    ranks = launched_ranks()
    per_rank_batch = train.micro_batch_for(ranks.world_size)  # `auto` unresolved: the rank's whole share
    device = resolve_device(train.device, ranks.local_rank if ranks.enabled else None)
    kind = "cuda" if device.type == "cuda" else "cpu"
    plain = config.model_copy(update={"train": train.model_copy(update={"micro_batch_size": None})})
    job = job_from_config(plain, kind)
    if isinstance(job, LmJob):  # a language model: the planner's LM traces, same levers
        memory, step = _language_model_memory(job, plain, kind, device)
    else:
        if kind == "cuda":  # the precision this card computes in, not the plan's bf16 card
            job = replace(job, step=replace(job.step, precision=resolve_precision(train.precision, device)))
        memory, step = estimate_job(job, (kind,)).memory[kind], job.step
    free, total = free_memory_bytes(device)
    fixed = _cuda_fixed_bytes(device, any("convolution" in op for t in memory.traces for op in t.flops_by_op)) \
        if kind == "cuda" else 0
    margin = int(SAFETY_MARGIN * total)
    budget = free - margin - fixed
    chosen, _, fits = choose_micro_batch(memory.peak_bytes, per_rank_batch, budget)
    probes: tuple[tuple[int, bool], ...] = ()
    if kind == "cuda" and fits:
        chosen, probes = _confirm_on_card(step.on(kind), device, chosen, per_rank_batch)
    agreed = _smallest_over_ranks(chosen, device, train.dist_timeout_s, train.strategy) if ranks.enabled else chosen
    larger = [d for d in micro_batch_sizes(per_rank_batch) if d > agreed]
    choice = MicroBatchChoice(
        micro_batch_size=agreed, per_rank_batch=per_rank_batch, device=str(device), free_bytes=free,
        margin_bytes=margin, fixed_bytes=fixed, budget_bytes=int(budget),
        estimated_peak_bytes=memory.peak_bytes(agreed), next_micro_batch_size=larger[0] if larger else None,
        next_estimated_peak_bytes=memory.peak_bytes(larger[0]) if larger else None, fits=fits, probes=probes,
        ranks_agreed=ranks.world_size)
    resolved = config.model_copy(update={"train": train.model_copy(update={"micro_batch_size": agreed})})
    return resolved, choice


def _language_model_memory(job: LmJob, config: RunConfig, kind: str, device: torch.device):
    """The peak curve of a language-model job (plan/llm_estimate.py) as a MemoryModel, and its step (full
    depth), in the precision the run computes in on this device (the runtime's rule, master weights in bf16)."""
    from trainwise.plan.job import fit_memory
    from trainwise.plan.llm_estimate import estimate_lm
    from trainwise.plan.llm_step import lm_step
    from trainwise.train.step.master_weights import computing_precision

    if kind == "cuda":
        job = job.with_changes(precision=computing_precision(resolve_precision(config.train.precision, device),
                                                             config.model))
    estimate = estimate_lm(job, device_kind=kind)
    return fit_memory(kind, estimate.traces), lm_step(job, device_kind=kind)


def _cuda_fixed_bytes(device: torch.device, has_convolutions: bool) -> int:
    """The planner's allocator costs beyond the traced step (advise.cuda_allocator_fixed_bytes); the CUDA
    context is already outside what mem_get_info reports free."""
    major = torch.cuda.get_device_capability(device)[0]
    cublas = CUBLAS_WORKSPACE_BYTES["hopper" if major in CUBLAS_32MIB_MAJORS else "pre_hopper"]
    return cublas + (CUDNN_WORKSPACE_BYTES if has_convolutions else 0) + ALLOCATOR_SLACK_BYTES


def _confirm_on_card(step: TrainingStep, device: torch.device, chosen: int, per_rank_batch: int
                     ) -> tuple[int, tuple[tuple[int, bool], ...]]:
    """At most MAX_PROBE_STEPS real steps (one micro-batch each) at the chosen size, stepping down to the
    next smaller divisor after an out-of-memory error."""
    probes = []
    size = chosen
    for _ in range(MAX_PROBE_STEPS):
        ok = _one_real_step(step.at_micro_batch(size), device)
        probes.append((size, ok))
        if ok:
            return size, tuple(probes)
        smaller = [d for d in micro_batch_sizes(per_rank_batch) if d < size]
        if not smaller:
            break
        size = smaller[-1]
    return size, tuple(probes)  # unconfirmed: the Trainer's recovery takes it from here


def _one_real_step(step: TrainingStep, device: torch.device) -> bool:
    step = replace(step, accumulation_steps=1)
    model = train_step = None
    ran = True
    try:
        model = step.build_model().to(device)
        train_step = build_train_step(step, model, device)
        train_step(host_batches(step))
        torch.cuda.synchronize(device)
    except torch.OutOfMemoryError:
        ran = False
    del model, train_step  # outside the except clause: the failed step's frames are gone too
    gc.collect()
    torch.cuda.empty_cache()
    return ran


def _smallest_over_ranks(chosen: int, device: torch.device, timeout_s: float, strategy: str) -> int:
    import torch.distributed as dist

    init_distributed(timeout_s, sharded=strategy in ("ddp", "fsdp"))  # the Trainer finds it joined
    value = torch.tensor([chosen], device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())
