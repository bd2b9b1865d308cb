"""`trainwise plan` end to end: a RunConfig -> job -> traced estimates (-> probe) -> advice, as one report.

`make_plan` is the one function the CLI calls, for every job: job.job_from_config reads the config (its one
language-model branch gives an LmJob), and the report follows the job: the card table (advise.py) for a job
traced whole, layouts and levers (advise_layouts.py, advise_levers.py) for a language model traced at two
depths. Each stage lives in its own module (job, memory, flops, probe, catalog, advise); this file only wires
them in order.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from trainwise.config import RunConfig
from trainwise.errors import ConfigError
from trainwise.plan import advise as advice_rules
from trainwise.plan.advise_layouts import LmAdvice, host_ram, layouts, offload_ram
from trainwise.plan.advise_levers import rank_levers
from trainwise.plan.catalog import Gpu, PriceList, _key, device_card, find_gpus, load_gpus, prices_in
from trainwise.plan.job import JobEstimate, advice_inputs, estimate_job, job_from_config
from trainwise.plan.llm_estimate import LmEstimate, as_dict, estimate_lm, peak_at_micro_one
from trainwise.plan.llm_job import PLAN_ONLY_OPTIMIZERS, LmJob, method_notes
from trainwise.plan.llm_time import MFU
from trainwise.plan.probe import read_machine


@dataclass(frozen=True)
class PlanRequest:
    gpu_names: tuple[str, ...] = ()
    max_gpus: int = 8
    budget: float | None = None
    deadline_hours: float | None = None
    prices_file: Path | None = None
    currency: str = "USD"
    rates: dict[str, float] = field(default_factory=dict)
    probe: bool = False
    nproc: int | None = None  # ranks per node: per-rank memory of DDP and FSDP, and the recommendation
    # language models: the run's length, to price it (steps, or tokens over batch x seq_len), and a plan-only
    # optimizer (adamw8bit, planned by size) in place of optim.name
    steps: int | None = None
    tokens: int | None = None
    optimizer: str | None = None


@dataclass
class PlanReport:
    estimate: JobEstimate
    advice: advice_rules.Advice
    machine: dict
    probe: dict | None
    prices_as_of: str
    price_sources: tuple[str, ...]
    notes: list[str]
    strategies: list = field(default_factory=list)  # StrategyPlan per card, with --nproc

    def to_dict(self) -> dict:
        job, est = self.estimate.job, self.estimate
        memory = {}
        for kind, model in est.memory.items():
            trace = model.trace_at(job.step.micro_batch_size)
            memory[kind] = {"micro_batch_size": trace.micro_batch_size, "precision": trace.precision,
                            "peak_bytes": trace.peak_bytes, "breakdown_bytes": trace.breakdown,
                            "per_sample_bytes": model.curve.per_sample_bytes,
                            "optimizer_peak_bytes": model.curve.optimizer_peak_bytes,
                            "traced": {t.micro_batch_size: t.peak_bytes for t in model.traces}}
        return {
            "job": {"batch_size": job.batch_size, "micro_batch_size": job.step.micro_batch_size,
                    "accumulation_steps": job.step.accumulation_steps, "ranks": job.ranks,
                    "total_steps": job.total_steps,
                    "steps_per_epoch": job.steps_per_epoch, "num_train": job.num_train,
                    "precision_requested": job.precision_requested, "precision_planned": job.step.precision,
                    "optimizer": job.step.optimizer, "parameters": est.parameter_count,
                    "total_parameters": est.memory[next(iter(est.memory))].trace_at(
                        job.step.micro_batch_size).total_parameter_count,
                    "parameter_bytes": est.parameter_bytes, "optimizer_state_bytes": est.optimizer_state_bytes,
                    "dataset_bytes": job.dataset_bytes},
            "memory": memory,
            "flops_per_sample": est.flops_per_sample,
            "flops_per_optimizer_step": est.flops_per_sample * job.batch_size,
            "fixed_costs_bytes": {"cuda_context": advice_rules.CUDA_CONTEXT_BYTES,
                                  "cublas_workspace": advice_rules.CUBLAS_WORKSPACE_BYTES,
                                  "cudnn_workspace_if_convolutions": advice_rules.CUDNN_WORKSPACE_BYTES,
                                  "safety_margin_fraction": advice_rules.SAFETY_MARGIN},
            "advice": self.advice.to_dict(),
            "machine": self.machine,
            "probe": self.probe,
            "prices": {"as_of": self.prices_as_of, "sources": list(self.price_sources),
                       "label": "defaults to check: verify on each provider's price page"},
            "notes": self.notes,
            "strategies": [plan.to_dict() for plan in self.strategies],
        }


def make_plan(config: RunConfig, request: PlanRequest) -> PlanReport | LmPlanReport:
    """The plan of any job `config` describes, for the cards `request` asks about (all when none)."""
    gpus = load_gpus()
    if request.gpu_names:
        gpus = find_gpus(gpus, list(request.gpu_names))
    prices, currency = prices_in(request.currency, request.prices_file, request.rates)
    if request.max_gpus < 1:
        raise ConfigError("--gpus-per-node must be at least 1.")

    without_bf16 = tuple(g.name for g in gpus) if request.gpu_names and not any(g.bf16 for g in gpus) else ()
    # micro-batch per rank, as `train --nproc` runs it
    job = job_from_config(config, cards_without_bf16=without_bf16, ranks=request.nproc or 1)
    if isinstance(job, LmJob):
        return plan_language_model(job, gpus, request, prices, currency)
    estimate = estimate_job(job)
    machine = read_machine().to_dict()
    notes = list(job.notes) + cpu_workspace_notes(estimate)
    probe_result, calibration = None, None
    if request.probe:
        probe_result, calibration, probe_notes = _probe(config, job, estimate, gpus)
        notes += probe_notes
    options = advice_rules.Options(currency=currency, budget=request.budget,
                                   deadline_hours=request.deadline_hours, max_gpus=request.max_gpus,
                                   calibration=calibration)
    inputs = advice_inputs(estimate)
    cpu_probe = probe_result if probe_result and probe_result["device"] == "cpu" else None
    advice = advice_rules.advise(inputs, gpus, prices, machine, options, cpu_probe)
    _mark_present_gpu(advice, machine, probe_result)
    if not advice.fits_anywhere:
        raise ConfigError(advice_rules.no_fit_message(inputs, gpus, options))
    strategies = []
    if request.nproc and request.nproc > 1:
        from trainwise.plan.strategy import plan_strategies

        strategies = [plan_strategies(inputs, gpu, request.nproc, options) for gpu in gpus]
    return PlanReport(estimate=estimate, advice=advice, machine=machine, probe=probe_result,
                      prices_as_of=prices.as_of, price_sources=prices.sources, notes=notes, strategies=strategies)


@dataclass
class LmPlanReport:
    """A language model's plan: its traced estimate, its layouts per card and the levers that make it fit."""

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
            "job": {**{k: v for k, v in asdict(job).items() if k not in ("overrides", "notes")},
                    "model": str(job.model)},
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


def plan_language_model(job: LmJob, gpus: tuple[Gpu, ...], request: PlanRequest, prices: PriceList | None = None,
                        currency: str = "USD", advice: bool = True) -> LmPlanReport:
    """Trace the job, lay it out on each card (with step times in the precision it computes in there, and
    prices: `request.steps` or `request.tokens` give the whole run's too), and, when it does not fit a card
    alone, trace the levers that would make it fit."""
    started = time.perf_counter()
    if request.optimizer in PLAN_ONLY_OPTIMIZERS:
        job = job.with_changes(optimizer=request.optimizer)
    gpus, notes = runnable_cards(job, gpus)
    notes = list(job.notes) + notes + method_notes(job)
    steps = request.steps
    if steps is None and request.tokens is not None:
        steps = max(-(-request.tokens // (job.batch_size * job.seq_len)), 1)
    est = estimate_lm(job)
    rows = layouts(est, gpus, request.max_gpus, prices, currency, steps)
    result = LmAdvice(layouts=rows, host_ram=host_ram(est))
    if advice and any(r.cards == 1 and not r.fits for r in rows):
        result.levers, result.combined = rank_levers(est, gpus, load_gpus(), peak_at_micro_one)
    return LmPlanReport(est, result, gpus, time.perf_counter() - started, notes, steps, currency,
                        prices.as_of if prices is not None else "")


def runnable_cards(job: LmJob, gpus: tuple[Gpu, ...]) -> tuple[tuple[Gpu, ...], list[str]]:
    """The cards the run's precision rule lets it run on, and what a reader needs told: which cards compute in
    fp16 with loss scaling (no bf16; the same memory, timed at their fp16 peak), or which were left out
    (bf16 asked, and they have none)."""
    without = [g.name for g in gpus if not g.bf16]
    if not without or job.precision != "bf16":
        return gpus, []
    if job.precision_without_bf16 is None:
        kept = tuple(g for g in gpus if g.bf16)
        if not kept:
            raise ConfigError(f"train.precision=bf16: {', '.join(without)} {'has' if len(without) == 1 else 'have'} "
                              "no bf16 (compute capability 8.0, Ampere or newer); use train.precision=auto "
                              "(fp16 there) or fp16, or plan a card with bf16.")
        return kept, [f"{', '.join(without)}: left out, no bf16 (train.precision=bf16 does not run there; auto "
                      "would run fp16)."]
    if job.precision_without_bf16 != "fp16":
        return gpus, []
    return gpus, [f"{', '.join(without)}: no bf16, so fp16 autocast with loss scaling there (what the run's "
                  "precision rule picks for train.precision=auto; the same memory as bf16, timed at the card's fp16 "
                  "peak)."]


def cpu_workspace_notes(estimate: JobEstimate) -> list[str]:
    """What the CPU memory figures bound from above instead of measuring (workspaces.py), said once."""
    import torch

    from trainwise.plan.kernel_bounds import probe_threads

    model = estimate.memory.get("cpu")
    if model is None:
        return []
    notes = []
    bounded = sorted({op.removeprefix("aten.") for trace in model.traces for op in trace.bounded_ops})
    if bounded:
        notes.append(f"CPU memory: the internal buffers of {', '.join(bounded)} could not be measured on this "
                     "CPU (too large to run here, or a profiler was already running), so an upper bound is "
                     "counted: a reordered copy of every operand plus a convolution's im2col columns.")
    threads, torch_threads = probe_threads(), torch.get_num_threads()
    if threads > torch_threads:
        notes.append(f"CPU memory counts kernels' per-thread buffers for {threads} threads (every usable core; "
                     f"torch runs {torch_threads} here): an upper bound for a run with fewer threads.")
    return notes


def _probe(config: RunConfig, job, estimate: JobEstimate, gpus: tuple[Gpu, ...]):
    """A few real steps on the present device; on a CUDA card, how far the time model was off there."""
    from trainwise.plan.probe import probe_steps
    from trainwise.runtime.device import resolve_device
    from trainwise.runtime.precision import resolve_precision

    device = resolve_device(config.train.device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    step = replace(job.step.on(kind), precision=resolve_precision(config.train.precision, device))
    result = probe_steps(step, device).to_dict()
    result["device"] = "cpu" if device.type == "cpu" else str(device)
    estimated = estimate.memory[kind].peak_bytes(step.micro_batch_size)
    result["estimated_peak_bytes"] = estimated
    notes = [f"--probe: {result['steps_timed']} real steps on {device}: {result['step_time_s'] * 1000:.1f} ms per "
             f"optimizer step; peak memory measured {result['peak_bytes'] / 2**20:.1f} MiB vs estimated "
             f"{estimated / 2**20:.1f} MiB."]
    calibration = None
    if device.type == "cuda":
        import torch

        card = device_card(torch.cuda.get_device_name(device), gpus)
        if card is not None:
            predicted = advice_rules.plan_card(advice_inputs(estimate), card, advice_rules.Options()).step_time_s
            calibration = result["step_time_s"] / predicted
            result["calibration"] = calibration
            notes.append(f"GPU times are scaled by {calibration:.2f}, measured / predicted on this {card.name}.")
    return result, calibration, notes


def device_peak_flops(device_name: str, precision: str, tf32: bool = True) -> float | None:
    """The catalogue's dense peak (FLOP/s) of a CUDA device by its name, for a precision; None when the
    catalogue does not know the card (the MFU of a run on it is then not reported)."""
    card = device_card(device_name, load_gpus())
    return card.peak_tflops(precision, tf32) * 1e12 if card is not None else None


def _mark_present_gpu(advice: advice_rules.Advice, machine: dict, probe: dict | None) -> None:
    for present in machine.get("gpus", ()):
        for row in advice.rows:
            if row.kind == "gpu" and (_key(row.name) in _key(present["name"])):
                row.note = "this machine"
                row.measured = bool(probe and probe.get("device", "").startswith("cuda"))
