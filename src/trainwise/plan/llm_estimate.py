"""Plan a language-model job: trace its step on fake tensors at two depths and a few sizes, extend the line to
the model's real depth, and turn the traces into the numbers advise.py works on.

Why two depths: a transformer's blocks are identical, so everything a step holds or computes is (embedding,
head, loss) + depth x (one block) — parameters, gradients, optimizer state, saved activations, FLOPs. Tracing
2 and 3 blocks (for `freeze`: the trainable blocks plus 1 and 2 frozen ones) and extending the line is exact
where the peak falls at the same place in both (tested against full-depth traces), and keeps a 70B plan to
seconds and well under 2 GiB of RAM. The fields that are not linear (the largest module) come from the traces.

Sizes: micro-batches 1, the job's and the whole batch (the peak curve advise.py reads), and the job's
micro-batch at twice the context (the cost of an extra token of context). Both costs are slopes of the
forward/backward peak, so a peak sitting in the optimizer step cannot hide them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from trainwise.llm import hf, methods
from trainwise.plan.allocation_tracker import REGIONS
from trainwise.plan.estimates import Estimates, PeakCurve
from trainwise.plan.job import traced_sizes
from trainwise.plan.llm_job import LmJob
from trainwise.plan.llm_step import build_lm, lm_step
from trainwise.plan.memory import trace_step
from trainwise.plan.traced_step import DeviceKind, StepTrace

LINEAR_INT_FIELDS = ("micro_batch_peak_bytes", "optimizer_peak_bytes", "parameter_count",
                     "parameter_bytes", "optimizer_state_bytes", "micro_batch_flops", "micro_batch_bytes_written",
                     "micro_batch_ops", "optimizer_bytes_written", "optimizer_ops")


@dataclass(frozen=True)
class ModelFacts:
    """What the full-depth model is, read from its meta build (no memory)."""

    total_parameters: int  # tied weights once; 4-bit weights by their element count
    trainable_parameters: int
    depth: int
    block_parameter_bytes: int  # one block as it sits on the card: FSDP gathers a block at a time
    root_parameter_bytes: int  # embedding, head, final norm: the FSDP root unit
    weight_bytes: int  # all parameters (and buffers) as stored
    trainable_bytes: int


@dataclass(frozen=True)
class LmEstimate:
    job: LmJob
    facts: ModelFacts
    traces: tuple[StepTrace, ...]  # full depth, at each traced micro-batch, at the job's context
    longer: StepTrace  # full depth, the job's micro-batch, twice the context
    curve: PeakCurve

    def trace_at(self, micro: int) -> StepTrace:
        return next(t for t in self.traces if t.micro_batch_size == micro)

    @property
    def per_sequence_bytes(self) -> float:
        return self.curve.per_sample_bytes

    @property
    def per_token_bytes(self) -> float:
        """What one more token of context costs the job's micro-batch (forward/backward peak)."""
        own = self.trace_at(self.job.micro)
        return max((self.longer.micro_batch_peak_bytes - own.micro_batch_peak_bytes) / self.job.seq_len, 0.0)


def traced_depths(job: LmJob) -> tuple[int, int] | None:
    """The two depths traced (None: the model is shallow enough to trace whole)."""
    depth = job.depth()
    # freeze: the trainable blocks and one or two frozen ones (with none frozen, checkpointing differs)
    low = job.trainable_blocks + 1 if job.method == "freeze" else 1
    return None if depth <= low + 1 else (low, low + 1)


def trace_lm(job: LmJob, micro: int, seq_len: int | None = None, device_kind: DeviceKind = "cuda",
             count_flops: bool = True) -> StepTrace:
    """One full-depth trace of `job` at `micro` sequences of `seq_len` tokens (extended from two depths)."""
    depths = traced_depths(job)

    def step(depth):
        return replace(lm_step(job, depth, micro, seq_len, device_kind), count_flops=count_flops)
    with hf.traceable_experts():
        if depths is None:
            return trace_step(step(None))
        low, high = (trace_step(step(d)) for d in depths)
    return extend(low, high, depths, job.depth())


def extend(low: StepTrace, high: StepTrace, depths: tuple[int, int], depth: int) -> StepTrace:
    """The trace at `depth` blocks on the line through the traces at `depths` (see the module doc)."""
    a, b = depths
    share = (depth - a) / (b - a)

    def line(x: float, y: float) -> int:
        return int(round(x + (y - x) * share))

    def lines(x: dict, y: dict) -> dict:
        return {key: line(x.get(key, 0), y.get(key, 0)) for key in set(x) | set(y)}

    values = {name: line(getattr(low, name), getattr(high, name)) for name in LINEAR_INT_FIELDS}
    parts = {part: lines(low.part_breakdowns.get(part, {}), high.part_breakdowns.get(part, {}))
             for part in high.part_breakdowns}
    where = dict(high.part_where)
    # each region of forward/backward on its own line, the largest only then (step_phases.py). The line through
    # the two traced peaks is a floor (the peak is the largest of lines, so it bends upwards): it stands where
    # the peak falls outside the labelled regions (a chunked loss runs the head outside the model's forward)
    regions = [region for region in REGIONS if region in low.part_breakdowns and region in parts]
    if regions:
        highest = max(regions, key=lambda region: sum(parts[region].values()))
        if sum(parts[highest].values()) >= values["micro_batch_peak_bytes"]:
            values["micro_batch_peak_bytes"] = sum(parts[highest].values())
            parts["micro_batches"], where["micro_batches"] = parts[highest], where[highest]
    micro_peak, optimizer_peak = values["micro_batch_peak_bytes"], values["optimizer_peak_bytes"]
    worst = "optimizer" if optimizer_peak > micro_peak else "micro_batches"
    return replace(high, **values, peak_bytes=max(micro_peak, optimizer_peak),
                   breakdown=parts.get(worst, high.breakdown), part_breakdowns=parts, part_where=where,
                   peak_where=where.get(worst, high.peak_where),
                   flops_by_op=lines(low.flops_by_op, high.flops_by_op),
                   largest_module_parameter_bytes=max(low.largest_module_parameter_bytes,
                                                      high.largest_module_parameter_bytes))


def model_facts(job: LmJob) -> ModelFacts:
    """Parameter counts and sizes of the full-depth model, from meta builds (unquantised for QLoRA, so the
    counts are the model's; its 4-bit bytes come from the trace). A deep model is built at the two traced
    depths and extended (blocks are alike): wrapping 80 blocks with peft on the meta device alone took
    ~100 s of a 70B plan."""
    counting = job.with_changes(method="lora") if job.method == "qlora" else job
    counting = counting.with_changes(gradient_checkpointing=False)
    depths = traced_depths(job)
    if depths is None:
        return _facts(build_lm(counting, device="meta"))
    low, high = (_facts(build_lm(counting, depth, device="meta")) for depth in depths)
    share = job.depth() - depths[0]  # the traced depths are one block apart
    return ModelFacts(*(getattr(low, name) + (getattr(high, name) - getattr(low, name)) * share
                        if name not in ("block_parameter_bytes", "root_parameter_bytes") else getattr(high, name)
                        for name in (f.name for f in fields(ModelFacts))))


def _facts(model) -> ModelFacts:
    counts = methods.parameter_counts(model)
    blocks = methods.transformer_blocks(model)
    in_blocks = {id(p) for p in blocks.parameters()}
    block = sum(p.numel() * p.element_size() for p in blocks[0].parameters())
    root = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in in_blocks)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return ModelFacts(counts.total, counts.trainable, len(blocks), block, root, weights, trainable)


def estimate_lm(job: LmJob, device_kind: DeviceKind = "cuda") -> LmEstimate:
    """Every trace the plan reads: the peak curve over micro-batches, and the job at twice its context."""
    facts = model_facts(job)
    sizes = traced_sizes(job.micro, job.batch_size)
    traces = tuple(trace_lm(job, size, device_kind=device_kind) for size in sizes)
    longer = trace_lm(job, job.micro, 2 * job.seq_len, device_kind=device_kind, count_flops=False)
    curve = PeakCurve(points=tuple((t.micro_batch_size, float(t.micro_batch_peak_bytes)) for t in traces),
                      optimizer_peak_bytes=float(max(t.optimizer_peak_bytes for t in traces)))
    return LmEstimate(job, facts, traces, longer, curve)


def peak_at_micro_one(job: LmJob, device_kind: DeviceKind = "cuda", count_flops: bool = True) -> StepTrace:
    """The smallest the job can run with (one sequence per micro-batch): what decides whether it fits.
    Remembered for the process: the advice traces a lever alone, then again inside a combination."""
    key = repr((job.with_changes(micro_batch_size=1), device_kind))
    known = _AT_MICRO_ONE.get(key)
    if known is None or (count_flops and not known.micro_batch_flops):
        known = trace_lm(job.with_changes(micro_batch_size=1), 1, device_kind=device_kind, count_flops=count_flops)
        _AT_MICRO_ONE[key] = known
    return known


_AT_MICRO_ONE: dict[str, StepTrace] = {}


def advice_estimates(est: LmEstimate, total_steps: int = 1000) -> Estimates:
    """The plain numbers advise.py's card table works on, for this job."""
    job, own = est.job, est.trace_at(est.job.micro)
    small, large = est.traces[0], est.traces[-1]
    span = max(large.micro_batch_size - small.micro_batch_size, 1)
    precision = "bf16" if "bf16" in (job.precision, job.dtype) else job.precision
    sharded = est.facts.weight_bytes + est.facts.trainable_bytes + own.optimizer_state_bytes
    return Estimates(
        batch_size=job.batch_size, micro_batch_size=job.micro, total_steps=total_steps,
        steps_per_epoch=total_steps, precision=precision, cpu_precision=precision,
        cuda_memory=est.curve, cpu_memory=est.curve, sharded_state_bytes=sharded,
        largest_module_parameter_bytes=max(est.facts.block_parameter_bytes, est.facts.root_parameter_bytes),
        flops_per_sample=max((large.micro_batch_flops - small.micro_batch_flops) / span,
                             own.micro_batch_flops / max(job.micro, 1)),
        bytes_per_sample=max((large.micro_batch_bytes_written - small.micro_batch_bytes_written) / span, 0.0),
        ops_per_micro_batch=own.micro_batch_ops, optimizer_bytes=own.optimizer_bytes_written,
        optimizer_ops=own.optimizer_ops, checkpoint_bytes=est.facts.weight_bytes + own.optimizer_state_bytes,
        weight_bytes=est.facts.weight_bytes)


def as_dict(trace: StepTrace) -> dict:
    return {f.name: getattr(trace, f.name) for f in fields(trace) if f.name != "flops_by_op"}
