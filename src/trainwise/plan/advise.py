"""Advice: estimates + catalog + prices + the present machine -> which card, how long, what it costs.

Pure functions over recorded facts: no torch, no probes; the tests drive them with hand-made catalogs.
Every constant below says where it comes from; `--probe` replaces the utilisation guess by a measurement.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from trainwise.config.derived import micro_batch_at_most
from trainwise.plan.catalog import Gpu, Offer, PriceList, offer_costs
from trainwise.plan.estimates import Estimates
from trainwise.plan.timing import (CPU_BANDWIDTH_BYTES_S_PER_CORE, CPU_OP_OVERHEAD_S, CPU_UTILISATION,
                                   GPU_OP_OVERHEAD_S, GPU_UTILISATION, cpu_peak_flops, step_time)

GiB = 2**30

# ---- per-device fixed costs (CUDA) ------------------------------------------------------------------------
# The CUDA context (driver state, lazily loaded kernels of torch/cuBLAS/cuDNN): ~300-600 MiB by card and
# versions, outside the caching allocator (nvidia-smi shows it, torch.cuda.memory_allocated does not), so a
# plan reports it apart (CardPlan.cuda_context_bytes). 500 MiB: torch 2.x on A100/H100 before the first tensor.
CUDA_CONTEXT_BYTES = 500 * 2**20
# cuBLAS workspace, one per (device, stream), taken from the caching allocator at the first matmul and kept:
# aten/src/ATen/cuda/CublasHandlePool.cpp (parseChosenWorkspaceSize): ":4096:2:16:8" = 8.125 MiB, 32 MiB on
# compute capability 9.x, 10.x, 12.x (Hopper, Blackwell); cuBLASLt shares it (unified_cublas_and_lt_workspaces,
# on by default). Forward and backward run on one stream: one workspace.
CUBLAS_WORKSPACE_BYTES = {"pre_hopper": 4096 * 1024 * 2 + 16 * 1024 * 8, "hopper": 4096 * 8 * 1024}
CUBLAS_32MIB_MAJORS = (9, 10, 12)
# cuDNN's convolution workspace: from the caching allocator for each call, freed after it (a transient the
# trace cannot see); 256 MiB bounds the usual algorithm choices (measured peaks of torchvision ResNets).
CUDNN_WORKSPACE_BYTES = 256 * 2**20
# c10/cuda/CUDACachingAllocator.cpp: blocks are multiples of 512 B (the trace rounds each storage so); blocks
# up to 1 MiB are cut from 2 MiB segments, up to 10 MiB from 20 MiB ones, larger get their own (2 MiB
# multiples). At the peak each pool's last segment is partly unused: that slack is counted; the other
# segments' fragmentation is in the safety margin, kept free as a share of the card (and the margin for all
# else we do not trace).
ALLOCATOR_SLACK_BYTES = 2 * 2**20 + 20 * 2**20
SAFETY_MARGIN = 0.10
# Host: the process with torch + CUDA loaded; the final save holds the weights twice (state dict, file bytes).
PROCESS_RAM_BYTES, FINAL_SAVE_COPIES = int(1.5 * GiB), 2

# Multi-GPU: share of linear speed-up DDP keeps (gradient all-reduce overlapped with backward);
# FSDP adds the parameter all-gathers. NCCL tests / PyTorch DDP paper (Li et al., VLDB 2020, Fig. 9).
SCALING_EFFICIENCY = {"nvlink": 0.90, "pcie": 0.75}
FSDP_EXTRA_EFFICIENCY = 0.90


@dataclass(frozen=True)
class Options:
    currency: str = "USD"
    budget: float | None = None  # in `currency`
    deadline_hours: float | None = None
    max_gpus: int = 8
    safety_margin: float = SAFETY_MARGIN
    utilisation: float = GPU_UTILISATION
    calibration: float | None = None  # measured/predicted step time from --probe on a CUDA card


@dataclass
class CardPlan:
    """One row of the table: a card (or this machine), with N of them, and what the job costs there."""

    name: str
    kind: str  # gpu | cpu
    cards: int
    strategy: str  # single | ddp | fsdp
    fits: bool
    memory_bytes: int
    needed_bytes: int  # at the chosen micro-batch, fixed costs included
    headroom_bytes: int
    max_micro_batch: int
    micro_batch_size: int
    accumulation_steps: int
    step_time_s: float
    epoch_hours: float
    total_hours: float
    bound: str  # compute | memory | overhead | measured
    offer: dict | None = None  # the cheapest offer for this card
    cost_on_demand: float | None = None
    cost_spot: float | None = None
    cost_monthly: float | None = None
    break_even_hours_per_month: float | None = None
    measured: bool = False
    note: str = ""
    # a CUDA card's need, split: its caching allocator at the peak (step, workspaces, slack), and the context
    allocator_bytes: int = 0
    cuda_context_bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Advice:
    currency: str
    rows: list[CardPlan]
    multi_gpu: list[CardPlan]
    cheapest: CardPlan | None
    fastest: CardPlan | None
    fits_anywhere: bool
    host_ram_bytes: int
    disk_bytes: int
    messages: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"currency": self.currency, "cards": [r.to_dict() for r in self.rows],
                "multi_gpu": [r.to_dict() for r in self.multi_gpu],
                "cheapest": self.cheapest.to_dict() if self.cheapest else None,
                "fastest": self.fastest.to_dict() if self.fastest else None,
                "fits_anywhere": self.fits_anywhere, "host_ram_bytes": self.host_ram_bytes,
                "disk_bytes": self.disk_bytes, "messages": self.messages}


# ---- memory ----------------------------------------------------------------------------------------------------

def cuda_allocator_fixed_bytes(gpu: Gpu, has_convolutions: bool) -> int:
    """What the caching allocator holds beyond the traced step: cuBLAS's and cuDNN's workspaces, slack."""
    major = int(str(gpu.compute_capability).split(".")[0])
    cublas = CUBLAS_WORKSPACE_BYTES["hopper" if major in CUBLAS_32MIB_MAJORS else "pre_hopper"]
    return cublas + (CUDNN_WORKSPACE_BYTES if has_convolutions else 0) + ALLOCATOR_SLACK_BYTES


def cuda_fixed_bytes(gpu: Gpu, has_convolutions: bool) -> int:
    """What a CUDA card spends before the first activation: the context, and the allocator's fixed part."""
    return CUDA_CONTEXT_BYTES + cuda_allocator_fixed_bytes(gpu, has_convolutions)


def usable_bytes(memory_bytes: int, fixed_bytes: int, margin: float) -> float:
    return memory_bytes * (1 - margin) - fixed_bytes


def largest_micro_batch(est: Estimates, budget: float, device: str = "cuda", shard_saving: float = 0) -> int:
    """Largest micro-batch ≤ batch_size whose peak (less what sharding saves) fits `budget` (0: none)."""
    curve = est.cpu_memory if device == "cpu" else est.cuda_memory
    return curve.largest_micro_batch(budget, est.batch_size, shard_saving)


def micro_batch_for(batch_size: int, max_micro: int) -> int:
    """The largest legal micro-batch (config.derived) that fits; 0 when nothing does."""
    return micro_batch_at_most(batch_size, max_micro) if max_micro > 0 else 0


def hours_on_offer(row: "CardPlan") -> float:
    return row.offer["hours"] if row.offer else row.total_hours


# ---- the table -----------------------------------------------------------------------------------------------

def plan_card(est: Estimates, gpu: Gpu, options: Options, cards: int = 1, strategy: str = "single") -> CardPlan:
    fixed = cuda_fixed_bytes(gpu, est.has_convolutions)
    budget = usable_bytes(gpu.memory_bytes, fixed, options.safety_margin)
    saving = 0.0
    if strategy == "fsdp":
        # each card holds 1/N of parameters, gradients and optimizer state, plus two gathered modules
        saving = est.sharded_state_bytes * (1 - 1 / cards) - 2 * est.largest_module_parameter_bytes
    elif strategy == "ddp":
        saving = -(est.sharded_state_bytes / 4)  # DDP's gradient buckets: one more copy of the gradients
    per_card_batch = max(est.batch_size // cards, 1)
    limit_est = est if cards == 1 else replace(est, batch_size=per_card_batch)
    max_micro = largest_micro_batch(limit_est, budget, "cuda", saving)
    micro = micro_batch_for(per_card_batch, max_micro)
    accumulation = per_card_batch // micro if micro else 0
    allocator = (est.peak(max(micro, 1)) - saving) + cuda_allocator_fixed_bytes(gpu, est.has_convolutions)
    needed = allocator + CUDA_CONTEXT_BYTES
    seconds, bound = step_time(est, max(micro, 1), max(accumulation, 1),
                               peak_flops=gpu.peak_tflops(est.precision) * 1e12,
                               bandwidth=gpu.bandwidth_gbs * 1e9, op_overhead_s=GPU_OP_OVERHEAD_S,
                               utilisation=options.utilisation)
    if options.calibration:
        seconds *= options.calibration
    if cards > 1:
        seconds /= _efficiency(gpu, strategy)
    return CardPlan(
        name=gpu.name, kind="gpu", cards=cards, strategy=strategy, fits=micro > 0,
        memory_bytes=gpu.memory_bytes, needed_bytes=int(needed), headroom_bytes=gpu.memory_bytes - int(needed),
        max_micro_batch=max_micro, micro_batch_size=micro, accumulation_steps=accumulation,
        step_time_s=seconds, epoch_hours=seconds * est.steps_per_epoch / 3600,
        total_hours=seconds * est.total_steps / 3600, bound=bound, allocator_bytes=int(allocator),
        cuda_context_bytes=CUDA_CONTEXT_BYTES)


def _efficiency(gpu: Gpu, strategy: str) -> float:
    base = SCALING_EFFICIENCY.get(gpu.interconnect, SCALING_EFFICIENCY["pcie"])
    return base * (FSDP_EXTRA_EFFICIENCY if strategy == "fsdp" else 1.0)


def plan_this_machine(est: Estimates, machine: dict, options: Options, measured_step_s: float | None = None,
                      measured_peak: int | None = None) -> CardPlan:
    """The present machine's CPU as a row: RAM instead of card memory, the probe's timing when there is one."""
    budget = machine["ram_available_bytes"] * (1 - options.safety_margin) - est.dataset_bytes - PROCESS_RAM_BYTES
    max_micro = largest_micro_batch(est, budget, "cpu")
    micro = micro_batch_for(est.batch_size, max_micro)
    accumulation = est.batch_size // micro if micro else 0
    cores = machine.get("torch_threads") or machine.get("cpu_cores", 1)
    seconds, bound = step_time(
        est, max(micro, 1), max(accumulation, 1),
        peak_flops=cpu_peak_flops(cores, machine.get("cpu_max_mhz"), tuple(machine.get("cpu_flags", ())),
                                  est.cpu_precision),
        bandwidth=CPU_BANDWIDTH_BYTES_S_PER_CORE * cores, op_overhead_s=CPU_OP_OVERHEAD_S,
        utilisation=CPU_UTILISATION)
    if measured_step_s is not None:
        seconds, bound = measured_step_s, "measured"
    needed = int(measured_peak if measured_peak is not None else est.peak(max(micro, 1), "cpu"))
    return CardPlan(
        name=f"this machine ({machine.get('cpu_model', 'CPU')}, {cores} threads)", kind="cpu", cards=1,
        strategy="single", fits=micro > 0, memory_bytes=int(machine["ram_available_bytes"]), needed_bytes=needed,
        headroom_bytes=int(machine["ram_available_bytes"] - needed), max_micro_batch=max_micro,
        micro_batch_size=micro, accumulation_steps=accumulation, step_time_s=seconds,
        epoch_hours=seconds * est.steps_per_epoch / 3600, total_hours=seconds * est.total_steps / 3600,
        bound=bound, measured=measured_step_s is not None, note="RAM available")


def price_row(row: CardPlan, est: Estimates, gpu: Gpu, offers: list[Offer], options: Options,
              rates: dict[str, float]) -> None:
    """Attach the cheapest offer for the row's card (by on-demand cost of this job). An instance with more
    GPUs than the row uses runs the job on all of them (DDP, or FSDP where DDP does not fit)."""
    best = None
    for offer in offers:
        hours = row.total_hours
        if offer.gpus != row.cards:
            spread = plan_card(est, gpu, options, offer.gpus, "ddp") if offer.gpus > 1 else None
            if spread is not None and not spread.fits:
                spread = plan_card(est, gpu, options, offer.gpus, "fsdp")
            if spread is None or not spread.fits:
                continue
            hours = spread.total_hours
        costs = offer_costs(offer, hours, options.currency, rates)
        key = costs["cost_on_demand"] if costs["cost_on_demand"] is not None else math.inf
        if best is None or key < best[0]:
            best = (key, costs)
    if best:
        for name, value in best[1].items():
            setattr(row, name, value)


def advise(est: Estimates, gpus: tuple[Gpu, ...], prices: PriceList, machine: dict, options: Options,
           probe: dict | None = None) -> Advice:
    rates = prices.exchange_rates_usd
    rows = [plan_card(est, gpu, options) for gpu in gpus]
    by_name = {gpu.name: gpu for gpu in gpus}
    for row in rows:
        if row.fits:  # a card that cannot hold the job has no cost; multi-GPU options below may
            gpu = by_name[row.name]
            price_row(row, est, gpu, [o for o in prices.offers if o.gpu == gpu.name], options, rates)
    this = plan_this_machine(est, machine, options, (probe or {}).get("step_time_s"), (probe or {}).get("peak_bytes"))
    rows.append(this)

    multi: list[CardPlan] = []
    single_fits = [r for r in rows if r.fits and r.kind == "gpu"]
    in_time = [r for r in single_fits
               if options.deadline_hours is None or hours_on_offer(r) <= options.deadline_hours]
    if not single_fits or not in_time:
        multi = multi_gpu_options(est, gpus, prices, options, rates)
    candidates = [r for r in single_fits + [m for m in multi if m.fits] if r.cost_on_demand is not None]
    cheapest = _cheapest(candidates, options)
    fastest = _fastest(candidates, options)
    messages = _messages(est, rows, multi, cheapest, fastest, options)
    host_ram = int(est.dataset_bytes + PROCESS_RAM_BYTES + max(4 * est.batch_size * est.sample_bytes,
                                                               FINAL_SAVE_COPIES * est.weight_bytes))
    disk = int(est.dataset_bytes + est.checkpoint_bytes * est.checkpoints_kept)
    return Advice(currency=options.currency, rows=rows, multi_gpu=multi, cheapest=cheapest, fastest=fastest,
                  fits_anywhere=bool(single_fits) or any(m.fits for m in multi) or this.fits,
                  host_ram_bytes=host_ram, disk_bytes=disk, messages=messages)


def multi_gpu_options(est: Estimates, gpus: tuple[Gpu, ...], prices: PriceList, options: Options,
                      rates: dict[str, float]) -> list[CardPlan]:
    """For each card: the fewest cards (2, 4, 8 ... ≤ max_gpus) with which DDP, or else FSDP, trains the job
    (within the deadline, when one is set)."""
    plans = []
    counts = [n for n in (2, 4, 8, 16, 32, 64) if n <= options.max_gpus]
    for gpu in gpus:
        found = None
        for cards in counts:
            for strategy in ("ddp", "fsdp"):
                plan = plan_card(est, gpu, options, cards, strategy)
                if plan.fits and (options.deadline_hours is None or plan.total_hours <= options.deadline_hours):
                    found = plan
                    break
            if found:
                break
        if found:
            offers = [o for o in prices.offers if o.gpu == gpu.name and o.gpus >= found.cards]
            price_row(found, est, gpu, offers, options, rates)
            plans.append(found)
    return plans


def _cheapest(rows: list[CardPlan], options: Options) -> CardPlan | None:
    ok = [r for r in rows if options.deadline_hours is None or hours_on_offer(r) <= options.deadline_hours]
    return min(ok, key=lambda r: (r.cost_on_demand, hours_on_offer(r)), default=None)


def _fastest(rows: list[CardPlan], options: Options) -> CardPlan | None:
    ok = [r for r in rows if options.budget is None or r.cost_on_demand <= options.budget]
    return min(ok, key=lambda r: (hours_on_offer(r), r.cost_on_demand), default=None)


def _messages(est, rows, multi, cheapest, fastest, options) -> list[str]:
    out = []
    if cheapest and cheapest.break_even_hours_per_month and cheapest.offer:
        hours = cheapest.offer["hours"]
        runs = cheapest.break_even_hours_per_month / hours if hours else math.inf
        out.append(f"{cheapest.offer['provider']} {cheapest.offer['instance']}: renting monthly beats hourly "
                   f"once you use it more than {cheapest.break_even_hours_per_month:.0f} h a month "
                   f"(about {runs:.0f} runs of this job).")
    if options.deadline_hours is not None and cheapest is None:
        out.append(f"no priced option finishes within the deadline of {options.deadline_hours:g} h.")
    if options.budget is not None and fastest is None:
        out.append(f"no priced option costs less than the budget of {options.budget:g} {options.currency}.")
    return out


def no_fit_message(est: Estimates, gpus: tuple[Gpu, ...], options: Options) -> str:
    """Why nothing fits, with the numbers, for the error the CLI shows."""
    biggest = max(gpus, key=lambda g: g.memory_bytes)
    fsdp = plan_card(est, biggest, options, options.max_gpus, "fsdp")
    return (f"this job fits no card in the catalog, not even {options.max_gpus} × {biggest.name} with FSDP: "
            f"one sample needs {fsdp.needed_bytes / GiB:.1f} GiB per card there (of "
            f"{biggest.memory_bytes / GiB:.0f} GiB; parameters + gradients + optimizer state are "
            f"{est.sharded_state_bytes / GiB:.1f} GiB before sharding, activations "
            f"{est.cuda_memory.per_sample_bytes / GiB:.2f} GiB per sample). Turn on model.gradient_checkpointing"
            f"{'' if est.precision in ('bf16', 'fp16') else ', train.precision=bf16'}, a smaller model, or more cards.")
