"""Which distributed strategy a job needs on N ranks of a card: the planner's one decision behind
`train.strategy: auto` and `trainwise plan --nproc N`.

DDP keeps a whole replica per rank (parameters, gradients, optimizer state, plus DDP's gradient buckets)
and is the fastest where that fits with the activations of a micro-batch. FSDP divides parameters,
gradients and optimizer state by N and gathers one block's parameters at a time: slower (the all-gathers),
but it fits jobs DDP cannot. So: DDP when it fits, FSDP when only it does, neither when nothing fits.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainwise.config import RunConfig
from trainwise.plan import advise as advice_rules
from trainwise.plan.catalog import Gpu, device_card, load_gpus
from trainwise.plan.estimates import Estimates
from trainwise.plan.job import advice_inputs, estimate_job, job_from_config
from trainwise.plan.llm_job import LmJob

STRATEGIES = ("ddp", "fsdp")


@dataclass(frozen=True)
class StrategyPlan:
    card: str
    ranks: int
    rows: dict[str, advice_rules.CardPlan]  # strategy -> per-rank memory, micro-batch, step time
    recommended: str | None
    reason: str

    def to_dict(self) -> dict:
        return {"card": self.card, "ranks": self.ranks, "recommended": self.recommended, "reason": self.reason,
                "per_rank": {s: {"fits": r.fits, "needed_bytes": r.needed_bytes, "memory_bytes": r.memory_bytes,
                                 "micro_batch_size": r.micro_batch_size, "step_time_s": r.step_time_s}
                             for s, r in self.rows.items()}}


def plan_strategies(estimates: Estimates, gpu: Gpu, ranks: int,
                    options: advice_rules.Options | None = None) -> StrategyPlan:
    options = options or advice_rules.Options()
    rows = {s: advice_rules.plan_card(estimates, gpu, options, ranks, s) for s in STRATEGIES}
    gib = 2**30
    if rows["ddp"].fits:
        chosen, reason = "ddp", (f"a whole replica fits each {gpu.name} ({rows['ddp'].needed_bytes / gib:.1f} of "
                                 f"{gpu.memory_gib:.0f} GiB per rank): DDP, the faster of the two")
    elif rows["fsdp"].fits:
        chosen, reason = "fsdp", (f"a replica does not fit one {gpu.name}; sharded over {ranks} ranks it needs "
                                  f"{rows['fsdp'].needed_bytes / gib:.1f} GiB per rank: FSDP")
    else:
        chosen, reason = None, (f"neither fits {ranks} × {gpu.name}: more ranks, a bigger card, or a smaller "
                                "micro-batch / bf16")
    return StrategyPlan(gpu.name, ranks, rows, chosen, reason)


def strategy_for(config: RunConfig, device_name: str, memory_bytes: int, ranks: int) -> tuple[str, str]:
    """`train.strategy: auto` for `ranks` ranks of the card this machine has: (strategy, why)."""
    if ranks <= 1:
        return "single", "one process"
    gpu = local_card(device_name, memory_bytes)
    plan = plan_strategies(job_estimates(config), gpu, ranks)
    return plan.recommended or "fsdp", plan.reason


def local_card(device_name: str, memory_bytes: int) -> Gpu:
    """The catalog's entry for this card when it has one (its throughput); its real memory either way."""
    gpus = load_gpus()
    known = device_card(device_name, gpus)
    base = known or max(gpus, key=lambda g: g.memory_gib)
    return base.model_copy(update={"name": device_name, "memory_gib": memory_bytes / 2**30})


def job_estimates(config: RunConfig) -> Estimates:
    """The numbers advise.py works on for `config`'s job on a CUDA card: a language model's from its two-depth
    traces, any other's from tracing its step."""
    job = job_from_config(config)
    if isinstance(job, LmJob):
        from trainwise.plan.llm_estimate import advice_estimates, estimate_lm

        return advice_estimates(estimate_lm(job))
    return advice_inputs(estimate_job(job, ("cuda",)))
