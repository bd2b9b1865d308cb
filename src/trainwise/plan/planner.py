"""`trainwise plan` end to end: recipe -> job -> traced estimates (-> probe) -> advice, as one report.

This is the one function the CLI calls; each stage lives in its own module (job, memory, flops, probe,
catalog, advise), and this file only wires them in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from trainwise.config import RunConfig
from trainwise.errors import ConfigError
from trainwise.plan import advise as advice_rules
from trainwise.plan.catalog import Gpu, _key, device_card, find_gpus, load_gpus, prices_in
from trainwise.plan.job import JobEstimate, advice_inputs, estimate_job, job_from_config
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


def make_plan(config: RunConfig, request: PlanRequest) -> PlanReport:
    gpus = load_gpus()
    if request.gpu_names:
        gpus = find_gpus(gpus, list(request.gpu_names))
    prices, currency = prices_in(request.currency, request.prices_file, request.rates)
    if request.max_gpus < 1:
        raise ConfigError("--gpus-per-node must be at least 1.")

    without_bf16 = tuple(g.name for g in gpus) if request.gpu_names and not any(g.bf16 for g in gpus) else ()
    # micro-batch per rank, as `train --nproc` runs it
    job = job_from_config(config, cards_without_bf16=without_bf16, ranks=request.nproc or 1)
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
