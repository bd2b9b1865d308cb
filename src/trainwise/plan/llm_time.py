"""How long a language-model step takes on a layout (one card, FSDP over N, FSDP + CPU offload), and what the
layout costs — one number per layout, bounded below by physics:

- a card's matrix work: FLOPs / (peak of the autocast's precision x MFU), MFU below;
- a card's memory traffic: (op outputs written x TRAFFIC_PER_BYTE_WRITTEN + the weights read by forward,
  backward and recomputation + QLoRA's dequantised copies) / (bandwidth x BANDWIDTH_UTILISATION);
- eager PyTorch's launches: ops x GPU_OP_OVERHEAD_S, hidden behind the card's work when that is longer (kernels
  are queued asynchronously), so a LoRA step pays its extra small matmuls as what they are, not twice;
- the optimizer step: AdamW reads each trainable weight, its gradient and both moments and writes the weight
  and the moments back (in place: a fused kernel writes no new tensor the trace could count);
- FSDP: every micro-batch all-gathers the parameters in forward and again in backward, and reduce-scatters the
  trainable gradients, over the card's link (PCIe or NVLink, gpus.yaml); overlapped with compute, so a
  micro-batch takes the longer of the two, never less than its share of one card's work;
- CPU offload: the shards cross PCIe to the card for each gather and the gradients back, and AdamW runs on the
  host's memory bandwidth: added to FSDP's time, never subtracted.
Pure: the numbers come from the traces (llm_estimate.py) and the catalogue.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from trainwise.plan.catalog import Gpu, PriceList, convert
from trainwise.plan.timing import BANDWIDTH_UTILISATION, GPU_OP_OVERHEAD_S, TRAFFIC_PER_BYTE_WRITTEN

# Model FLOPs utilisation of a well-shaped transformer step in eager PyTorch with fused kernels: PaLM's paper
# (Chowdhery et al. 2022, Table 3) reports 46% for PaLM and 30-32% for Megatron-Turing NLG / GPT-3-class runs;
# torchtitan's Llama-3-8B on H100 (FSDP, bf16) reaches ~38% counting attention. 40% is the planned share.
MFU = 0.40
# NCCL's achieved bus bandwidth as a share of the link's datasheet figure (nccl-tests all_gather_perf on
# NVLink A100/H100 reach ~80%; PCIe rings a little less).
LINK_UTILISATION = 0.80
# AdamW on the host under CPU offload: reads and writes weight, gradient and both moments in fp32 (~32 bytes per
# trainable weight per step) over the host's memory, ~50 GB/s for a dual-channel-per-socket server share.
HOST_ADAM_BYTES_PER_WEIGHT, HOST_BANDWIDTH = 32, 50e9


@dataclass(frozen=True)
class StepWork:
    """What one micro-batch of `micro` sequences does on one card, and what the optimizer step does."""

    flops: float  # forward + backward (+ recompute) of a micro-batch
    bytes_written: float  # op outputs of a micro-batch
    ops: float  # aten ops (kernel launches) of a micro-batch
    weight_reads: float  # parameter bytes read by a micro-batch's matmuls (all passes)
    optimizer_bytes: float  # memory traffic of clipping + the optimizer step (bytes moved)
    optimizer_ops: float
    gathered_bytes: float  # what FSDP gathers per pass: every parameter as stored
    gradient_bytes: float  # trainable gradients: what FSDP reduce-scatters
    trainable_weights: float  # elements the optimizer updates


@dataclass(frozen=True)
class StepTime:
    seconds: float
    bound: str  # compute | memory | launches | interconnect | pcie


def micro_batch_seconds(work: StepWork, gpu: Gpu, precision: str) -> tuple[float, str]:
    parts = {"compute": work.flops / (gpu.peak_tflops(precision) * 1e12 * MFU),
             "memory": (work.bytes_written * TRAFFIC_PER_BYTE_WRITTEN + work.weight_reads)
             / (gpu.bandwidth_gbs * 1e9 * BANDWIDTH_UTILISATION),
             "launches": work.ops * GPU_OP_OVERHEAD_S}
    bound = max(parts, key=parts.get)
    return parts[bound], bound


def optimizer_seconds(work: StepWork, gpu: Gpu, cards: int) -> float:
    traffic = work.optimizer_bytes / (gpu.bandwidth_gbs * 1e9 * BANDWIDTH_UTILISATION)
    return max(traffic / cards, work.optimizer_ops * GPU_OP_OVERHEAD_S)


def step_seconds(work: StepWork, gpu: Gpu, precision: str, batch: int, micro: int, cards: int = 1,
                 offload: bool = False) -> StepTime:
    """One optimizer step of `batch` sequences over `cards` cards at `micro` sequences per micro-batch."""
    micro = max(micro, 1)
    micro_batches = max(math.ceil(batch / cards / micro), 1)
    seconds, bound = micro_batch_seconds(work, gpu, precision)
    if cards > 1:  # FSDP: parameters gathered twice per micro-batch, gradients reduce-scattered once
        share = (cards - 1) / cards
        comm = share * (2 * work.gathered_bytes + work.gradient_bytes) / (gpu.link_bytes_s * LINK_UTILISATION)
        if comm > seconds:
            seconds, bound = comm, "interconnect"
    total = micro_batches * seconds + optimizer_seconds(work, gpu, cards)
    if offload:  # the shards come over PCIe for each gather, the gradients go back; AdamW on the host
        pcie = micro_batches * (2 * work.gathered_bytes + work.gradient_bytes) / cards / gpu.host_bytes_s
        host_adam = work.trainable_weights * HOST_ADAM_BYTES_PER_WEIGHT / HOST_BANDWIDTH
        if pcie > total:
            bound = "pcie"
        total = max(total, pcie) + host_adam
    return StepTime(total, bound)


def floor_seconds(work: StepWork, gpu: Gpu, precision: str, batch: int, micro: int) -> float:
    """What no layout of one card can beat: the step's FLOPs at the card's peak (100% utilisation)."""
    return max(math.ceil(batch / max(micro, 1)), 1) * work.flops / (gpu.peak_tflops(precision) * 1e12)


# ---- money ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Price:
    per_hour: float  # what is rented for the layout (whole instances), in the plan's currency
    per_card_hour: float  # one card of that offer
    offer: str  # provider and instance
    run: float | None  # the whole run, when its length is known


def layout_price(gpu: Gpu, cards: int, prices: PriceList, currency: str, hours: float | None) -> Price | None:
    """The cheapest on-demand offer holding `cards` of `gpu` (several instances when one has fewer GPUs);
    None when the price list has none."""
    rates = prices.exchange_rates_usd
    best = None
    for offer in prices.offers:
        if offer.gpu != gpu.name or offer.on_demand_hour is None:
            continue
        instances = math.ceil(cards / offer.gpus)
        if cards > 1 and offer.gpus == 1:
            continue  # FSDP needs its cards in one machine (or machines of 8): no fast link between 1-GPU VMs
        hourly = instances * convert(offer.on_demand_hour, offer.currency, currency, rates)
        if best is None or hourly < best[0]:
            name = f"{instances} x " if instances > 1 else ""
            best = (hourly, hourly / (instances * offer.gpus), f"{name}{offer.provider} {offer.instance}")
    if best is None:
        return None
    hourly, per_card, where = best
    return Price(hourly, per_card, where, hourly * hours if hours is not None else None)
