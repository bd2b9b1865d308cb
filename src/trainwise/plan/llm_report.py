"""`trainwise plan MODEL` for language models: the job -> traces -> card layouts, host RAM, levers; one report.

The entry points are `make_lm_plan(job, request)` (a catalogue name, config.json or model directory with flags)
and `lm_job_from_config(config)` (a recipe whose model.hf / model.hf_config names a language model).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from trainwise.config import RunConfig
from trainwise.errors import ConfigError
from trainwise.llm import methods
from trainwise.plan.catalog import Gpu, find_gpus, load_gpus
from trainwise.plan.llm_advice import LmAdvice, card_budget, host_ram, layouts, offload_ram, rank_levers
from trainwise.plan.llm_plan import LmEstimate, as_dict, estimate_lm
from trainwise.plan.llm_step import LmJob

DEFAULT_SEQ_LEN = 2048


@dataclass
class LmPlanReport:
    estimate: LmEstimate
    advice: LmAdvice
    gpus: tuple[Gpu, ...]
    seconds: float  # planning time
    notes: list[str] = field(default_factory=list)

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
            "traced": [as_dict(t) for t in est.traces],
            "layouts": [asdict(layout) for layout in self.advice.layouts],
            "host_ram_bytes": self.advice.host_ram, "offload_host_ram_bytes": offload_ram(est),
            "levers": [asdict(lever) for lever in self.advice.levers],
            "combined_levers": asdict(self.advice.combined) if self.advice.combined else None,
            "planning_seconds": self.seconds, "notes": self.notes,
        }


def make_lm_plan(job: LmJob, gpu_names: tuple[str, ...] = (), max_gpus: int = 8, advice: bool = True,
                 notes: list[str] | None = None) -> LmPlanReport:
    """Trace the job, lay it out on each card asked about (all catalogue cards when none), and, when it does
    not fit a card alone, trace the levers that would make it fit."""
    check_job(job)
    started = time.perf_counter()
    gpus = find_gpus(load_gpus(), list(gpu_names)) if gpu_names else load_gpus()
    est = estimate_lm(job)
    rows = layouts(est, gpus, max_gpus)
    result = LmAdvice(layouts=rows, host_ram=host_ram(est))
    if advice and any(r.cards == 1 and not r.fits for r in rows):
        result.levers, result.combined = rank_levers(est, gpus, load_gpus())
    notes = list(notes or []) + job_notes(job)
    return LmPlanReport(est, result, gpus, time.perf_counter() - started, notes)


def check_job(job: LmJob) -> None:
    if job.seq_len < 1 or job.batch_size < 1:
        raise ConfigError("--seq-len and --batch must be positive")
    if job.micro_batch_size and job.batch_size % job.micro_batch_size:
        raise ConfigError(f"--micro-batch {job.micro_batch_size} does not divide --batch {job.batch_size}")
    if job.method not in methods.METHODS:
        raise ConfigError(f"--method {job.method!r}: use one of {', '.join(methods.METHODS)}")
    if job.optimizer not in ("adamw", "adamw8bit", "sgd"):
        raise ConfigError(f"--optimizer {job.optimizer!r}: use adamw, adamw8bit or sgd")
    if job.method == "freeze" and not 1 <= job.trainable_blocks <= job.depth():
        raise ConfigError(f"--trainable-blocks {job.trainable_blocks}: the model has {job.depth()} blocks")


def job_notes(job: LmJob) -> list[str]:
    notes = []
    if job.method == "qlora":
        notes.append("QLoRA is planned by size (NF4 weights with double quantisation, dequantised per layer in "
                     "forward and backward); training it needs a CUDA GPU with bitsandbytes.")
    if job.optimizer == "adamw8bit":
        notes.append("8-bit AdamW is planned by the size of bitsandbytes' state (1 byte per moment per weight + "
                     "a 4-byte scale per 256); it needs bitsandbytes on a CUDA GPU.")
    return notes


def lm_job_from_config(config: RunConfig) -> tuple[LmJob, list[str]]:
    """The language-model job a recipe describes (model.hf or model.hf_config set)."""
    model, train = config.model, config.train
    spec = model.hf or model.hf_config
    notes = []
    seq_len = config.data.seq_len
    if seq_len is None:
        seq_len = DEFAULT_SEQ_LEN
        notes.append(f"data.seq_len is not set: planned at {DEFAULT_SEQ_LEN} tokens per sequence.")
    micro = None if train.micro_batch_size == "auto" else train.micro_batch
    precision = "bf16" if train.precision in ("auto", "bf16") else train.precision
    job = LmJob(model=spec, seq_len=seq_len, batch_size=train.batch_size, micro_batch_size=micro,
                method=model.method, trainable_blocks=model.trainable_blocks,
                lora=methods.LoraSettings.from_config(model.lora), dtype=model.dtype, precision=precision,
                optimizer=config.optim.name if config.optim.name != "adam" else "adamw",
                gradient_checkpointing=model.gradient_checkpointing, loss_chunk_size=model.loss_chunk_size,
                grad_clip_norm=train.grad_clip_norm)
    return job, notes


def smallest_fitting(report: LmPlanReport) -> Gpu | None:
    """The smallest card (of those asked about) that holds the job alone."""
    peak = report.estimate.curve.peak(1)
    fitting = [g for g in report.gpus if peak <= card_budget(g)]
    return min(fitting, key=lambda g: g.memory_bytes, default=None)
