"""Memory that keeps growing after warm-up: a leak that ends in an out-of-memory crash hours later.

Pure over what the run recorded, best source first: the CUDA allocator's `cuda_allocated_bytes` in the train
records, when the engine logs it; else the telemetry samples of system.jsonl (each with the trainer's step):
per-GPU `memory_used_bytes` (what the caching allocator reserved), the process's `rss_bytes` when sampled,
otherwise the host's `ram_used_bytes` (the whole machine's, so other programs show in it too).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainwise.findings import Finding
from trainwise.diagnose.hardware import gpus_of

MIB = 2**20
# The first part of the run is warm-up: the caching allocator grows to its working set, loader workers
# start, the first evaluation allocates. Growth there is expected, so it is left out.
WARMUP_SHARE = 0.2
# Fewer samples (or a shorter stretch of steps) cannot tell a trend from one allocation.
MIN_SAMPLES = 8
MIN_STEP_SPAN = 20
# Steady: a straight line explains this share of the variance (R²); a single jump (first eval) does not.
STEADY_R2 = 0.8
# Growth worth a warning: this share of the starting footprint over the post-warm-up stretch...
MIN_RELATIVE_GROWTH = 0.05
# ...and at least this much in bytes: a few MiB of fragmentation on a small process is noise.
MIN_GROWTH_BYTES = 64 * MIB

CAUSES = ("Accumulate metrics as numbers, not tensors: `total += loss.item()`, not `total += loss` (that keeps "
          "every step's graph alive).",
          "Do not keep outputs across steps; store `output.detach().cpu()` or only what you need.",
          "Look for a cache that grows in your Dataset or model (a dict filled in `__getitem__`, a list of "
          "batches); in loader workers, Python lists of objects grow by copy-on-access: use NumPy arrays.",
          "Find the growing allocation: `torch.cuda.memory_summary()` every few hundred steps, or tracemalloc "
          "on the host.")


def memory_findings(records: list[dict[str, Any]], system: list[dict[str, Any]], *,
                    max_steps: int | None = None) -> list[Finding]:
    found = [memory_leak(name, points, total, max_steps) for name, points, total in memory_series(records, system)]
    return [f for f in found if f is not None]


def memory_series(records: list[dict[str, Any]],
                  system: list[dict[str, Any]]) -> list[tuple[str, list[tuple[int, float]], float | None]]:
    """(source, [(step, bytes)], total bytes or None) for each memory the run recorded, best source first."""
    allocated = _points((r.get("step"), r.get("cuda_allocated_bytes")) for r in records if r.get("split") == "train")
    if allocated:
        return [("CUDA allocated memory", allocated, None)]
    found = []
    gpus: dict[Any, list] = {}
    totals: dict[Any, float] = {}
    for sample in system:
        for g in gpus_of(sample):
            gpus.setdefault(g.get("index"), []).append((sample.get("step"), g.get("memory_used_bytes")))
            if _number(g.get("memory_total_bytes")):
                totals[g.get("index")] = float(g["memory_total_bytes"])
    for index, pairs in gpus.items():
        found.append((f"GPU {index} memory used", _points(pairs), totals.get(index)))
    rss = _points((s.get("step"), s.get("rss_bytes")) for s in system)
    if rss:
        found.append(("process RSS", rss, None))
    else:
        ram_total = next((float(s["ram_total_bytes"]) for s in system if _number(s.get("ram_total_bytes"))), None)
        found.append(("host RAM used (whole machine)", _points((s.get("step"), s.get("ram_used_bytes"))
                                                               for s in system), ram_total))
    return [(name, points, total) for name, points, total in found if points]


def memory_leak(source: str, points: list[tuple[int, float]], total: float | None = None,
                max_steps: int | None = None) -> Finding | None:
    """Steady growth after warm-up, with the growth per 100 steps and when it would run out."""
    if not points:
        return None
    first, last = points[0][0], points[-1][0]
    after = [(s, b) for s, b in points if s >= first + WARMUP_SHARE * (last - first)]
    if len(after) < MIN_SAMPLES or after[-1][0] - after[0][0] < MIN_STEP_SPAN:
        return None
    steps = np.array([s for s, _ in after], dtype=float)
    used = np.array([b for _, b in after], dtype=float)
    slope, intercept = np.polyfit(steps, used, 1)
    fitted = slope * steps + intercept
    spread = float(((used - used.mean()) ** 2).sum())
    r2 = 1.0 - float(((used - fitted) ** 2).sum()) / spread if spread > 0 else 0.0
    start, end = float(fitted[0]), float(fitted[-1])
    growth = end - start
    if slope <= 0 or r2 < STEADY_R2 or growth < MIN_GROWTH_BYTES or growth < MIN_RELATIVE_GROWTH * max(start, 1.0):
        return None
    per_100 = float(slope * 100)
    projected = float(slope * max_steps + intercept) if max_steps else None
    runs_out = total is not None and projected is not None and projected >= total
    start_step = int(steps[0])
    evidence = {"source": source, "from_step": start_step, "to_step": int(steps[-1]), "start_bytes": start,
                "end_bytes": end, "growth_bytes": growth, "growth_per_100_steps_bytes": per_100, "r2": r2,
                "samples": len(after), "total_bytes": total, "max_steps": max_steps,
                "projected_at_max_steps_bytes": projected,
                "rule": f"linear growth after the first {WARMUP_SHARE:.0%} of steps, R² ≥ {STEADY_R2}, "
                        f"≥ {MIN_RELATIVE_GROWTH:.0%} and ≥ {MIN_GROWTH_BYTES // MIB} MiB"}
    outlook = (f" At this rate it reaches {projected / MIB:,.0f} MiB by step {max_steps}, more than the "
               f"{total / MIB:,.0f} MiB there are: the run will run out of memory." if runs_out else "")
    return Finding(
        "memory_leak", "error" if runs_out else "warn",
        f"{source} grows {per_100 / MIB:,.1f} MiB per 100 steps after warm-up",
        f"{source} grew steadily from {start / MIB:,.0f} MiB at step {start_step} to {end / MIB:,.0f} MiB at step "
        f"{int(steps[-1])} (R² {r2:.2f} over {len(after)} samples): something keeps references to memory every "
        f"step.{outlook}" + (" This is the whole machine's RAM: check no other program grew with it."
                             if "whole machine" in source else ""),
        evidence, CAUSES, step=start_step)


def _points(pairs) -> list[tuple[int, float]]:
    return sorted((int(s), float(b)) for s, b in pairs
                  if isinstance(s, int) and not isinstance(s, bool) and _number(b))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
