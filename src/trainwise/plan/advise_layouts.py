"""Advice for a language-model job (pure: its traced estimate + the catalogue -> options): where it fits
(1..N cards, FSDP, CPU offload), how long a step takes there in the precision the run computes in on that card,
and what it costs (llm_time.py: one number per layout, bounded by physics), and host RAM including the final
save. The levers that make a job fit are in advise_levers.py; the card table of any job in advise.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainwise.errors import ConfigError
from trainwise.plan import advise as rules
from trainwise.plan.catalog import Gpu, PriceList
from trainwise.plan.estimates import Estimates
from trainwise.plan.llm_estimate import LmEstimate, advice_estimates
from trainwise.plan.llm_job import LmJob
from trainwise.plan.llm_time import StepWork, layout_price, step_seconds
from trainwise.plan.timing import TRAFFIC_PER_BYTE_WRITTEN
from trainwise.plan.traced_step import StepTrace

LAYOUT_CARDS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Layout:
    """The job on `cards` x one card model: how it is spread, what each card needs, how long a step takes and
    what the cards cost."""

    card: str
    cards: int
    strategy: str  # single | fsdp | fsdp+offload
    needed_bytes: int  # per card, the CUDA context and workspaces included
    usable_bytes: int  # what a step may use on the card: its memory less the context, workspaces and margin
    memory_bytes: int
    fits: bool
    micro_batch_size: int
    step_time_s: float
    bound: str  # what limits the step: compute | memory | launches | interconnect | pcie
    precision: str  # the autocast this card runs (bf16, or fp16 with loss scaling without bf16)
    tokens_per_s: float = 0.0  # all cards together
    price_per_hour: float | None = None  # all cards, in the plan's currency
    price_per_card_hour: float | None = None
    offer: str = ""
    run_hours: float | None = None  # the whole run, when --steps or --tokens gives its length
    run_cost: float | None = None


@dataclass
class LmAdvice:
    layouts: list[Layout]
    host_ram: dict[str, int]
    levers: list = field(default_factory=list)  # advise_levers.Lever, ranked
    combined: object | None = None  # advise_levers.Lever: several together, when no single one fits


def card_budget(gpu: Gpu) -> float:
    """What a training step may use on one card: less the CUDA context, workspaces and the safety margin."""
    return rules.usable_bytes(gpu.memory_bytes, rules.cuda_fixed_bytes(gpu, False), rules.SAFETY_MARGIN)


def card_precision(job: LmJob, gpu: Gpu) -> str:
    """The precision `job` computes in on `gpu`: what the run's rule gave for a card with bf16 or without
    (llm_job.language_model_job asks runtime.precision); fp32 autocast over bf16 weights still multiplies in
    bf16."""
    computed = job.precision if gpu.bf16 else job.precision_without_bf16
    if computed is None:
        raise ConfigError(f"train.precision={job.precision}: {gpu.name} has no bf16; plan other cards, or use "
                          "train.precision=auto (fp16 there) or fp16.")
    if computed == "fp32" and job.dtype == "bf16":  # bf16 weights: the matmuls run at the card's 16-bit rate
        return "bf16" if gpu.bf16 else "fp16"
    return computed


def work_of(trace: StepTrace, job: LmJob, weight_bytes: float, trainable_bytes: float, trainable: float,
            flops: float | None = None) -> StepWork:
    """What a micro-batch of `trace` does on a card (llm_time.StepWork). `flops`: the trace's when it counted
    none (a lever that changes no matrix product)."""
    # forward, backward (the input's gradient), recomputation; QLoRA's dequantised copies are op outputs of the
    # trace already (llm_step.Planned4bitLinear), counted in bytes_written
    passes = 3 if job.gradient_checkpointing else 2
    return StepWork(flops=flops if flops is not None else trace.micro_batch_flops,
                    bytes_written=trace.micro_batch_bytes_written, ops=trace.micro_batch_ops,
                    weight_reads=passes * weight_bytes,
                    optimizer_bytes=optimizer_traffic(trace, trainable_bytes), optimizer_ops=trace.optimizer_ops,
                    gathered_bytes=weight_bytes, gradient_bytes=trainable_bytes, trainable_weights=trainable)


def optimizer_traffic(trace: StepTrace, trainable_bytes: float) -> float:
    """Bytes the optimizer step moves: the weights, their gradients and the state read, the weights and the
    state written back in place (what a fused kernel does without writing a new tensor), or the traced
    outputs' traffic when that is more (clipping's temporaries, an unfused optimizer)."""
    in_place = 2 * (trace.optimizer_state_bytes + trainable_bytes) + trainable_bytes
    return max(trace.optimizer_bytes_written * TRAFFIC_PER_BYTE_WRITTEN, in_place)


def work_at(est: LmEstimate, micro: int) -> StepWork:
    """The job's work at `micro` sequences per micro-batch: on the line through the traced micro-batches."""
    traces = sorted(est.traces, key=lambda t: t.micro_batch_size)
    low = max((t for t in traces if t.micro_batch_size <= micro), key=lambda t: t.micro_batch_size,
              default=traces[0])
    high = min((t for t in traces if t.micro_batch_size >= micro), key=lambda t: t.micro_batch_size,
               default=traces[-1])
    if high is low and len(traces) > 1:
        low, high = (traces[-2], traces[-1]) if micro > traces[-1].micro_batch_size else (traces[0], traces[1])
    share = (micro - low.micro_batch_size) / max(high.micro_batch_size - low.micro_batch_size, 1)

    def line(name: str) -> float:
        return getattr(low, name) + (getattr(high, name) - getattr(low, name)) * share

    facts = est.facts
    # the trace's weights as stored (QLoRA's packed 4-bit ones; facts count them unquantised)
    base = work_of(low, est.job, low.parameter_bytes, facts.trainable_bytes, facts.trainable_parameters)
    return StepWork(**{**base.__dict__, "flops": line("micro_batch_flops"),
                       "bytes_written": line("micro_batch_bytes_written"), "ops": line("micro_batch_ops")})


def layouts(est: LmEstimate, gpus: tuple[Gpu, ...], max_gpus: int, prices: PriceList | None = None,
            currency: str = "USD", steps: int | None = None) -> list[Layout]:
    """Per card model: one card, then FSDP over 2, 4, 8 ... and FSDP with CPU offload, until one fits."""
    inputs, options = advice_estimates(est), rules.Options(max_gpus=max_gpus)
    out = []
    for gpu in gpus:
        for cards in [n for n in LAYOUT_CARDS if n <= max_gpus]:
            row = rules.plan_card(inputs, gpu, options, cards, "single" if cards == 1 else "fsdp")
            out.append(timed(est, gpu, cards, row.strategy, row.needed_bytes, row.fits, row.micro_batch_size,
                             prices, currency, steps))
            if row.fits:
                break
        else:
            out.append(offloaded(est, inputs, gpu, max(n for n in LAYOUT_CARDS if n <= max_gpus), prices,
                                 currency, steps))
    return out


def timed(est: LmEstimate, gpu: Gpu, cards: int, strategy: str, needed: int, fits: bool, micro: int,
          prices: PriceList | None, currency: str, steps: int | None) -> Layout:
    """A layout with its step time (llm_time.step_seconds at its micro-batch; 1 where nothing fits), tokens/s
    and price."""
    job, micro = est.job, max(micro, 1)
    precision = card_precision(job, gpu)
    time = step_seconds(work_at(est, micro), gpu, precision, job.batch_size, micro, cards,
                        offload=strategy == "fsdp+offload")
    hours = time.seconds * steps / 3600 if steps else None
    price = layout_price(gpu, cards, prices, currency, hours) if prices is not None else None
    return Layout(gpu.name, cards, strategy, int(needed), int(card_budget(gpu) + rules.cuda_fixed_bytes(gpu, False)),
                  gpu.memory_bytes, fits, micro if fits else 0, time.seconds, time.bound, precision,
                  job.batch_size * job.seq_len / time.seconds,
                  price.per_hour if price else None, price.per_card_hour if price else None,
                  price.offer if price else "", hours, price.run if price else None)


def offloaded(est: LmEstimate, inputs: Estimates, gpu: Gpu, cards: int, prices: PriceList | None,
              currency: str, steps: int | None) -> Layout:
    """FSDP with CPU offload: parameters, gradients and optimizer state live in host RAM; a card holds the
    activations and the units being gathered (two at a time)."""
    on_card = est.curve.peak(1) - inputs.sharded_state_bytes + 2 * inputs.largest_module_parameter_bytes
    needed = int(on_card + rules.cuda_fixed_bytes(gpu, False))
    return timed(est, gpu, cards, "fsdp+offload", needed, on_card <= card_budget(gpu), 1, prices, currency, steps)


def host_ram(est: LmEstimate) -> dict[str, int]:
    """Host RAM of the run: the process, and the final save (adapters only for LoRA/QLoRA)."""
    job, facts = est.job, est.facts
    adapters = job.method in ("lora", "qlora")
    saved = facts.trainable_bytes if adapters else facts.weight_bytes
    parts = {"process (Python, torch, CUDA libraries)": rules.PROCESS_RAM_BYTES,
             f"final save ({'the adapters' if adapters else 'the whole model'}: state dict on the host + "
             "the safetensors file built in memory)": rules.FINAL_SAVE_COPIES * saved}
    return parts


def offload_ram(est: LmEstimate) -> int:
    """Extra host RAM when FSDP offloads the states to the CPU."""
    return int(advice_estimates(est).sharded_state_bytes)
