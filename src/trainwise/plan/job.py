"""The training job a RunConfig describes, and its estimates: memory as a function of the micro-batch,
FLOPs and bytes per optimizer step, how many steps, how much data.

Memory is traced at two micro-batch sizes. Forward/backward memory grows linearly with the micro-batch
(activations), the optimizer step's does not; the two lines give the largest micro-batch a card holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from trainwise.config import RunConfig
from trainwise.errors import ConfigError
from trainwise.plan.estimates import Estimates, PeakCurve
from trainwise.plan.llm_job import LmJob, is_language_model, language_model_job
from trainwise.plan.memory import trace_step
from trainwise.plan.traced_step import DeviceKind, StepTrace, TrainingStep


@dataclass(frozen=True)
class Job:
    """One run: its training step, its length, its data."""

    step: TrainingStep
    batch_size: int  # effective: samples per optimizer step
    total_steps: int
    steps_per_epoch: int
    num_train: int
    dataset_bytes: int  # all splits, as held in memory
    sample_bytes: int
    precision_requested: str
    cpu_precision: str  # what the run computes in on a CPU (`auto` is fp32 there)
    checkpoints_kept: int  # step checkpoints + last + best
    notes: tuple[str, ...] = ()
    ranks: int = 1  # the step is one rank's: `batch_size` is shared by this many


@dataclass(frozen=True)
class MemoryModel:
    """The traces of one device kind and the peak curve through them."""

    device_kind: DeviceKind
    curve: PeakCurve
    traces: tuple[StepTrace, ...]

    def peak_bytes(self, micro_batch: int) -> int:
        for trace in self.traces:
            if trace.micro_batch_size == micro_batch:
                return trace.peak_bytes
        return int(self.curve.peak(micro_batch))

    def trace_at(self, micro_batch: int) -> StepTrace:
        return next(t for t in self.traces if t.micro_batch_size == micro_batch)


@dataclass(frozen=True)
class JobEstimate:
    job: Job
    memory: dict[str, MemoryModel]  # device kind -> model
    flops_per_sample: float  # forward + backward (+ recompute), per training sample
    bytes_per_sample: float  # memory traffic (op outputs written), per sample
    ops_per_micro_batch: int  # aten ops (kernel launches on a GPU) of one micro-batch
    optimizer_bytes: int  # traffic of clipping + optimizer step, once per optimizer step
    optimizer_ops: int
    parameter_count: int
    parameter_bytes: int
    optimizer_state_bytes: int
    largest_module_parameter_bytes: int


# ---- from a RunConfig --------------------------------------------------------------------------------------

def job_from_config(config: RunConfig, device_kind: DeviceKind = "cuda",
                    cards_without_bf16: tuple[str, ...] = (), ranks: int = 1) -> Job | LmJob:
    """The job one rank of `ranks` runs `config` as: the micro-batch and accumulation are the trainer's for that
    many. `cards_without_bf16`: the cards planned for, when none has bf16 (a T4, a V100); `auto` precision is
    then planned as what it resolves to on them. A language model (model.hf or model.hf_config) is an LmJob,
    traced two depths at a time (llm_estimate.py) and timed per card in the precision it computes in there."""
    from trainwise.recipes.factories import build_data, build_model
    from trainwise.runtime.precision import choose_precision

    if is_language_model(config):
        return language_model_job(config)
    bundle = build_data(config)
    spec = bundle.spec
    train = config.train
    micro = train.micro_batch_for(ranks)
    notes = []
    # the trainer's rule, for the cards planned for: bf16 ones (Ampere and newer) unless none of them has it
    precision = choose_precision(train.precision, "cuda", bf16_native=not cards_without_bf16)
    cpu_precision = choose_precision(train.precision, "cpu", bf16_native=False)
    if train.precision == "auto" and cards_without_bf16:
        notes.append(f"precision `auto` is planned as {precision}: what it resolves to on "
                     f"{', '.join(cards_without_bf16)}, which {'has' if len(cards_without_bf16) == 1 else 'have'} "
                     "no bf16.")
    elif train.precision == "auto":
        notes.append(f"precision `auto` is planned as {precision} (what it resolves to on bf16 cards: Ampere and "
                     f"newer); older cards (T4, V100) would run "
                     f"{choose_precision('auto', 'cuda', bf16_native=False)}, with the same memory.")

    if config.model.compile:
        notes.append("model.compile is planned as eager PyTorch; torch.compile usually needs less activation "
                     "memory and time, so the plan errs on the safe side.")

    def build():
        return build_model(config, spec)

    sample = bundle.train[0]  # read once: a text pack is built from its shard on each access
    tokens = isinstance(sample, dict)
    target_shape, vocabulary = sample_shapes(sample, spec)

    step = TrainingStep(
        build_model=build, input_shape=tuple(spec.input_shape), input_dtype=spec.input_dtype,
        task=spec.task, num_classes=spec.num_classes, micro_batch_size=micro,
        accumulation_steps=train.accumulation_steps_for(ranks), precision=precision, optimizer=config.optim.name,
        optimizer_args={"lr": config.optim.lr, "betas": config.optim.betas, "eps": config.optim.eps,
                        "weight_decay": config.optim.weight_decay, "momentum": config.optim.momentum},
        grad_clip_norm=train.grad_clip_norm, label_smoothing=train.label_smoothing, device_kind=device_kind,
        target_shape=target_shape, vocabulary_size=vocabulary,
        # the built-in gpt on text: token batches and the token loss, as trained
        token_batches=tokens, host_document_lengths=tokens)
    num_train = spec.num_train or len(bundle.train)
    steps_per_epoch = train.steps_per_epoch(num_train)  # the trainer's count: a partial last batch never runs
    total = train.total_steps(num_train)
    sample_bytes = math.prod(spec.input_shape) * torch.empty((), dtype=spec.input_dtype).element_size()
    samples = sum(len(split) for split in (bundle.train, bundle.val, bundle.test) if split is not None)
    return Job(step=step, batch_size=train.batch_size, total_steps=total, steps_per_epoch=steps_per_epoch,
               num_train=num_train, dataset_bytes=samples * (sample_bytes + 8), sample_bytes=sample_bytes,
               precision_requested=train.precision,
               cpu_precision=cpu_precision, checkpoints_kept=config.checkpoint.keep_last + 2,
               notes=tuple(notes), ranks=ranks)


def sample_shapes(sample, spec) -> tuple[tuple[int, ...], int | None]:
    """What one real training sample says that the spec does not: the shape of its target (a label per
    position for next-item recommenders and token models, one label otherwise), and for integer inputs
    the index range the step's fake batches may use (at least the sample's own ids)."""
    # `sample`: the training split's first, (inputs, target) or a token sample's dict (data/batch.py)
    inputs, target = (sample["input_ids"], sample["labels"]) if isinstance(sample, dict) else sample
    target_shape = tuple(torch.as_tensor(target).shape)
    vocabulary = None
    if not spec.input_dtype.is_floating_point:
        vocabulary = max(int(torch.as_tensor(inputs).max()) + 1, 2)
    return target_shape, vocabulary


# ---- estimating -------------------------------------------------------------------------------------------

def traced_sizes(micro_batch: int, batch_size: int) -> tuple[int, ...]:
    """Micro-batches to trace: 1, the recipe's, and the whole batch (no card runs more than the batch at
    once), so every micro-batch a plan may choose lies between two traced ones."""
    return tuple(sorted({1, micro_batch, batch_size, 2 if batch_size == 1 else batch_size}))


def estimate_job(job: Job, device_kinds: tuple[DeviceKind, ...] = ("cuda", "cpu")) -> JobEstimate:
    """Trace the step at a few micro-batch sizes for each device kind; per-sample costs from the largest two."""
    micro = job.step.micro_batch_size
    sizes = traced_sizes(micro, job.batch_size)
    memory: dict[str, MemoryModel] = {}
    for kind in device_kinds:
        step = job.step.on(kind)
        if kind == "cpu":
            step = replace(step, precision=job.cpu_precision)
        memory[kind] = fit_memory(kind, tuple(_trace(step.at_micro_batch(size)) for size in sizes))
    model = memory[device_kinds[0]]
    own, small, large = model.trace_at(micro), model.traces[0], model.traces[-1]
    span = large.micro_batch_size - small.micro_batch_size
    return JobEstimate(
        job=job, memory=memory,
        flops_per_sample=max((large.micro_batch_flops - small.micro_batch_flops) / span, 0.0),
        bytes_per_sample=max((large.micro_batch_bytes_written - small.micro_batch_bytes_written) / span, 0.0),
        ops_per_micro_batch=own.micro_batch_ops, optimizer_bytes=own.optimizer_bytes_written,
        optimizer_ops=own.optimizer_ops, parameter_count=own.parameter_count,
        parameter_bytes=own.parameter_bytes, optimizer_state_bytes=own.optimizer_state_bytes,
        largest_module_parameter_bytes=own.largest_module_parameter_bytes)


def fit_memory(kind: DeviceKind, traces: tuple[StepTrace, ...]) -> MemoryModel:
    curve = PeakCurve(points=tuple((t.micro_batch_size, float(t.micro_batch_peak_bytes)) for t in traces),
                      optimizer_peak_bytes=float(max(t.optimizer_peak_bytes for t in traces)))
    return MemoryModel(device_kind=kind, curve=curve, traces=tuple(traces))


def _trace(step: TrainingStep) -> StepTrace:
    try:
        return trace_step(step)
    except ConfigError:
        raise
    except Exception as error:  # a model that cannot run on fake tensors: say which, and what to do
        raise ConfigError(
            f"plan: could not trace one training step of this model on fake tensors ({type(error).__name__}: "
            f"{error}). The model must run on tensors without data: avoid .item(), .numpy() or data-dependent "
            "Python control flow in forward, or use `trainwise plan --probe` on a machine that can run it."
        ) from None


def advice_inputs(estimate: JobEstimate):
    """The plain numbers advise.py works on."""

    job, cuda, cpu = estimate.job, estimate.memory["cuda"], estimate.memory.get("cpu", estimate.memory["cuda"])
    first = cuda.trace_at(job.step.micro_batch_size)
    sharded = first.parameter_bytes * 2 + estimate.optimizer_state_bytes
    return Estimates(
        batch_size=job.batch_size, micro_batch_size=job.step.micro_batch_size, total_steps=job.total_steps,
        steps_per_epoch=job.steps_per_epoch, precision=job.step.precision, cpu_precision=job.cpu_precision,
        cuda_memory=cuda.curve, cpu_memory=cpu.curve,
        sharded_state_bytes=sharded, largest_module_parameter_bytes=estimate.largest_module_parameter_bytes,
        flops_per_sample=estimate.flops_per_sample, bytes_per_sample=estimate.bytes_per_sample,
        ops_per_micro_batch=estimate.ops_per_micro_batch, optimizer_bytes=estimate.optimizer_bytes,
        optimizer_ops=estimate.optimizer_ops,
        has_convolutions=any("convolution" in op for op in first.flops_by_op),
        dataset_bytes=job.dataset_bytes, sample_bytes=job.sample_bytes,
        checkpoint_bytes=first.parameter_bytes + estimate.optimizer_state_bytes,
        checkpoints_kept=job.checkpoints_kept, weight_bytes=first.parameter_bytes)
