"""How long a training step takes on a device: compute-bound, memory-bound, or bound by the per-op
overhead of eager PyTorch, from the traced FLOPs, bytes and op counts. Pure; constants say their source."""
from __future__ import annotations

from trainwise.plan.estimates import Estimates

# Share of peak tensor throughput eager PyTorch training reaches on large matmuls (model FLOPs utilisation
# of 35-50% is what MFU reports give for well-shaped models; PaLM paper, Table 3). Replaced after --probe.
GPU_UTILISATION = 0.40
# Share of peak memory bandwidth elementwise kernels reach (STREAM-like copies reach 80-90%).
BANDWIDTH_UTILISATION = 0.70
# Memory traffic ≈ every op output written once and read about twice.
TRAFFIC_PER_BYTE_WRITTEN = 3.0
# Eager PyTorch cost per aten op: Python + dispatcher + kernel launch, ~5-10 µs on a server CPU
# (PyTorch performance tuning guide; why CUDA graphs / torch.compile help small models).
GPU_OP_OVERHEAD_S = 6e-6
CPU_OP_OVERHEAD_S = 4e-6
# CPU: fp32 FLOPs per cycle per core (two FMA units × vector lanes × 2), by the widest vector unit.
CPU_FLOPS_PER_CYCLE = {"avx512f": 64, "avx2": 32, "asimd": 16, "sve": 16, "none": 8}
CPU_UTILISATION = 0.30  # oneDNN/MKL reach 60-80% on large GEMMs; small training steps much less
CPU_BANDWIDTH_BYTES_S_PER_CORE = 8e9  # DDR4/DDR5 server share, ~8-12 GB/s per core


def step_time(est: Estimates, micro: int, accumulation: int, *, peak_flops: float, bandwidth: float,
              op_overhead_s: float, utilisation: float) -> tuple[float, str]:
    """Seconds per optimizer step: each micro-batch is bound by compute or by memory traffic, plus the
    per-op overhead of eager execution; then the optimizer step (memory-bound)."""
    compute = est.flops_per_sample * micro / (peak_flops * utilisation)
    traffic = est.bytes_per_sample * micro * TRAFFIC_PER_BYTE_WRITTEN / (bandwidth * BANDWIDTH_UTILISATION)
    overhead = est.ops_per_micro_batch * op_overhead_s
    optimizer = (est.optimizer_bytes * TRAFFIC_PER_BYTE_WRITTEN / (bandwidth * BANDWIDTH_UTILISATION)
                 + est.optimizer_ops * op_overhead_s)
    parts = {"compute": compute, "memory": traffic, "overhead": overhead}
    bound = max(parts, key=parts.get)
    return accumulation * (max(compute, traffic) + overhead) + optimizer, bound


def cpu_peak_flops(cores: int, mhz: float | None, flags: tuple[str, ...], precision: str) -> float:
    unit = next((f for f in ("avx512f", "avx2", "asimd", "sve") if f in flags), "none")
    peak = cores * (mhz or 2500) * 1e6 * CPU_FLOPS_PER_CYCLE[unit]
    if precision != "fp32" and not {"avx512_bf16", "amx_bf16"} & set(flags):
        peak /= 2  # no native bf16: converts around fp32 kernels, or falls back to im2col convolutions
    return peak
