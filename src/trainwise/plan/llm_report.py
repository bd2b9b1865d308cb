"""`trainwise plan MODEL` for language models: the job (a RunConfig, llm_job.py) -> traces -> card layouts with
step times and prices, host RAM, levers; one report.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from trainwise.config import RunConfig
from trainwise.plan.catalog import Gpu, PriceList, find_gpus, load_gpus, prices_in
from trainwise.plan.llm_advice import LmAdvice, card_budget, host_ram, layouts, offload_ram
from trainwise.plan.llm_job import PLAN_ONLY_OPTIMIZERS, check_job, job_notes, lm_job_from_config
from trainwise.plan.llm_levers import rank_levers
from trainwise.plan.llm_plan import LmEstimate, as_dict, estimate_lm
from trainwise.plan.llm_step import LmJob
from trainwise.plan.llm_time import MFU


@dataclass
class LmPlanReport:
    estimate: LmEstimate
    advice: LmAdvice
    gpus: tuple[Gpu, ...]
    seconds: float  # planning time
    notes: list[str] = field(default_factory=list)
    steps: int | None = None  # the run's optimizer steps, when --steps or --tokens gives them
    currency: str = "USD"
    prices_as_of: str = ""

    def to_dict(self) -> dict:
        est, job, facts = self.estimate, self.estimate.job, self.estimate.facts
        own = est.trace_at(job.micro)
        return {
            "job": {**{k: v for k, v in asdict(job).items() if k != "overrides"}, "model": str(job.model)},
            "parameters": {"total": facts.total_parameters, "trainable": facts.trainable_parameters},
            "peak": {"bytes": own.peak_bytes, "where": own.peak_where, "breakdown_bytes": own.breakdown,
                     "micro_batch_size": own.micro_batch_size,
                     "forward_backward_peak_bytes": own.micro_batch_peak_bytes,
                     "optimizer_step_peak_bytes": own.optimizer_peak_bytes},
            "per_extra_token_bytes": est.per_token_bytes, "per_extra_sequence_bytes": est.per_sequence_bytes,
            "flops_per_step": own.micro_batch_flops * (job.batch_size // job.micro), "mfu_planned": MFU,
            "steps": self.steps, "currency": self.currency, "prices_as_of": self.prices_as_of,
            "traced": [as_dict(t) for t in est.traces],
            "layouts": [asdict(layout) for layout in self.advice.layouts],
            "host_ram_bytes": self.advice.host_ram, "offload_host_ram_bytes": offload_ram(est),
            "levers": [asdict(lever) for lever in self.advice.levers],
            "combined_levers": asdict(self.advice.combined) if self.advice.combined else None,
            "planning_seconds": self.seconds, "notes": self.notes,
        }


def plan_language_model(config: RunConfig, gpu_names: tuple[str, ...] = (), max_gpus: int = 8,
                        money: dict | None = None, optimizer: str | None = None) -> LmPlanReport:
    """The plan of a RunConfig whose model is a language model (model.hf or model.hf_config): `plan MODEL ...`
    and a recipe naming one both come here. `money`: prices_file, currency, rates, steps, tokens (the CLI's
    options); `optimizer`: a plan-only optimizer (adamw8bit) in place of optim.name."""
    money = dict(money or {})
    job, notes = lm_job_from_config(config, optimizer if optimizer in PLAN_ONLY_OPTIMIZERS else None)
    prices, currency = prices_in(money.get("currency", "USD"), money.get("prices_file"), money.get("rates"))
    return make_lm_plan(job, gpu_names, max_gpus, notes=notes, prices=prices, currency=currency,
                        steps=money.get("steps"), tokens=money.get("tokens"))


def make_lm_plan(job: LmJob, gpu_names: tuple[str, ...] = (), max_gpus: int = 8, advice: bool = True,
                 notes: list[str] | None = None, prices: PriceList | None = None, currency: str = "USD",
                 steps: int | None = None, tokens: int | None = None) -> LmPlanReport:
    """Trace the job, lay it out on each card asked about (all catalogue cards when none) with step times and
    prices (`steps` or `tokens`: the whole run's too), and, when it does not fit a card alone, trace the
    levers that would make it fit."""
    check_job(job)
    started = time.perf_counter()
    gpus = find_gpus(load_gpus(), list(gpu_names)) if gpu_names else load_gpus()
    notes = list(notes or [])
    job, precision_note = resolve_autocast(job, gpus)
    notes += precision_note + job_notes(job)
    if steps is None and tokens is not None:
        steps = max(-(-tokens // (job.batch_size * job.seq_len)), 1)
    est = estimate_lm(job)
    rows = layouts(est, gpus, max_gpus, prices, currency, steps)
    result = LmAdvice(layouts=rows, host_ram=host_ram(est))
    if advice and any(r.cards == 1 and not r.fits for r in rows):
        result.levers, result.combined = rank_levers(est, gpus, load_gpus())
    return LmPlanReport(est, result, gpus, time.perf_counter() - started, notes, steps, currency,
                        prices.as_of if prices is not None else "")


def resolve_autocast(job: LmJob, gpus: tuple[Gpu, ...]) -> tuple[LmJob, list[str]]:
    """train.precision=auto is bf16 autocast where a card has bf16 and fp16 with loss scaling where it has not
    (a T4, a V100): the same memory, so the trace runs bf16 and each layout is timed in its card's own
    (llm_advice.card_precision); the cards without bf16 are named."""
    without = [g.name for g in gpus if not g.bf16]
    traced = job.with_changes(precision="bf16" if job.precision in ("auto", "fp16") else job.precision)
    if traced.precision != "bf16" or not without:
        return traced, []
    return traced, [f"{', '.join(without)}: no bf16, so fp16 autocast with loss scaling there (what "
                    "train.precision=auto runs; the same memory as bf16, timed at the card's fp16 peak)."]


def smallest_fitting(report: LmPlanReport) -> Gpu | None:
    """The smallest card (of those asked about) that holds the job alone."""
    peak = report.estimate.curve.peak(1)
    fitting = [g for g in report.gpus if peak <= card_budget(g)]
    return min(fitting, key=lambda g: g.memory_bytes, default=None)
