"""What training-time telemetry costs: step time with the sampler on vs off, alternated inside one run.

The real Trainer trains the digits CNN (fp32, on the CPU or the GPU there is) with telemetry disabled in its
config; a benchmark callback switches the real TelemetryCallback on and off every BLOCK_S seconds, in the
cycle off -> default interval (2 s) -> off -> stress interval (0.25 s, 8x the default rate). Each block's
figure is its mean optimizer-step time (sampling cost is occasional, so a median would hide it); each "on"
block is divided by the mean of the two "off" blocks around it, so a machine whose load drifts (other jobs)
cancels out. Reported: the median of those ratios. Target ≤ 1.01 at the default interval.
The same ratio of process CPU time per step (all threads, the sampler's included) is reported too: on a
machine shared with other jobs wall time is mostly their noise, while CPU time still shows what the sampler
adds.

Every "on" block starts with an immediate sample, so short blocks sample more often than a real run does:
the ratio errs high. Also measured: the cost of one sample, host part (psutil + the system.jsonl append) and
GPU part (NVML, every card) apart; the overhead bound is their sum / interval.

Without an NVML device there is no GPU part to sample: the run then says that GPU sampling was not measured
(the step-time ratios cover host sampling only), rather than report a figure that leaves it out.

    .venv/bin/python benchmarks/telemetry_overhead.py            # the published figure (~2.5 minutes)
    .venv/bin/python benchmarks/telemetry_overhead.py --quick    # does it run end to end (seconds)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise import ArrayDataset, Callback, DataSpec, RunDir, Trainer, config_from_dict  # noqa: E402
from trainwise.config import TelemetryConfig  # noqa: E402
from trainwise.recipes.models import cnn  # noqa: E402
from trainwise.telemetry.nvml import open_nvml  # noqa: E402
from trainwise.telemetry.sampler import HostMeter, read_sample  # noqa: E402
from trainwise.train.callbacks.telemetry import TelemetryCallback  # noqa: E402

BLOCK_S, CYCLES, SAMPLE_CALLS = 6.0, 6, 200
CYCLE = ["off", "default_2s", "off", "stress_0.25s"]
INTERVALS = {"default_2s": 2.0, "stress_0.25s": 0.25}
SPEC = DataSpec(input_shape=(1, 8, 8), num_classes=10)


class AlternateTelemetry(Callback):
    """Switches telemetry on and off every BLOCK_S seconds and records each block's mean step time."""

    def __init__(self):
        self.blocks: list[tuple[str, float, float]] = []  # (mode, mean step s wall, mean step s CPU)
        self.telemetry: TelemetryCallback | None = None
        self.position = 0

    def on_fit_start(self, trainer):
        self._begin(trainer)

    def on_step_end(self, trainer):
        self.steps += 1
        elapsed = time.perf_counter() - self.started
        if elapsed < BLOCK_S:
            return
        cpu = time.process_time() - self.cpu_started  # every thread of the process, the sampler's included
        self.blocks.append((CYCLE[self.position % len(CYCLE)], elapsed / self.steps, cpu / self.steps))
        self._switch_off(trainer)
        self.position += 1
        if self.position == CYCLES * len(CYCLE) + 1:  # end on an "off" block so every "on" has two neighbours
            trainer.request_stop("benchmark done")
            return
        self._begin(trainer)

    def on_fit_end(self, trainer, summary):
        self._switch_off(trainer)

    def _begin(self, trainer):
        mode = CYCLE[self.position % len(CYCLE)]
        if mode != "off":
            self.telemetry = TelemetryCallback(TelemetryConfig(interval_s=INTERVALS[mode]))
            self.telemetry.on_fit_start(trainer)  # NVML init happens once per real run: not timed
        self.steps, self.started, self.cpu_started = 0, time.perf_counter(), time.process_time()

    def _switch_off(self, trainer):
        if self.telemetry is not None:
            self.telemetry.on_fit_end(trainer, {})
            self.telemetry = None


def train_alternating() -> tuple[list[tuple[str, float, float]], int]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(8192, 1, 8, 8, generator=g), torch.randint(0, 10, (8192,), generator=g)
    config = config_from_dict({
        "optim": {"name": "adamw", "lr": 3e-3}, "schedule": {"warmup_steps": 10, "decay": "cosine"},
        "train": {"max_steps": 1_000_000, "batch_size": 64, "precision": "fp32", "log_every": 50},
        "eval": {"every_epoch": False}, "telemetry": {"enabled": False}})
    torch.manual_seed(0)
    alternate = AlternateTelemetry()
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir.create(Path(tmp) / "r")
        Trainer(cnn(SPEC, channels=(32, 64), hidden=128, dropout=0.1), ArrayDataset(x, y), config=config,
                run_dir=run, callbacks=[alternate], data_spec=SPEC).fit()
        samples = len(run.read_system())
    return alternate.blocks, samples


def neighbour_ratios(blocks, field: int) -> dict[str, list[float]]:
    """Each "on" block's figure over the mean of the "off" blocks on either side of it."""
    ratios: dict[str, list[float]] = {m: [] for m in INTERVALS}
    for i in range(1, len(blocks) - 1):
        if blocks[i][0] != "off" and blocks[i - 1][0] == blocks[i + 1][0] == "off":
            ratios[blocks[i][0]].append(blocks[i][field] / ((blocks[i - 1][field] + blocks[i + 1][field]) / 2))
    return ratios


def sample_costs_s(nvml) -> tuple[float, float | None]:
    """Seconds per sample: (host part: psutil reading + one system.jsonl append, GPU part: NVML reading of
    every card, or None without an NVML session)."""
    host = HostMeter()
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir.create(Path(tmp) / "r")
        started = time.perf_counter()
        for _ in range(SAMPLE_CALLS):
            run.log_system(read_sample(None, host))
        host_cost = (time.perf_counter() - started) / SAMPLE_CALLS
    if nvml is None:
        return host_cost, None
    started = time.perf_counter()
    for _ in range(SAMPLE_CALLS):
        nvml.samples()
    return host_cost, (time.perf_counter() - started) / SAMPLE_CALLS


def main() -> None:
    global BLOCK_S, CYCLES
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 s blocks, two cycles: checks that it runs")
    quick = parser.parse_args().quick
    if quick:
        BLOCK_S, CYCLES = 1.0, 2  # two cycles: the first block is dropped, each "on" block keeps two neighbours
    load_before = os.getloadavg()[0]
    blocks, samples = train_alternating()
    blocks = blocks[1:]  # the first block includes warm-up (allocator, first kernels)
    ratios = neighbour_ratios(blocks, 1)
    cpu_ratios = neighbour_ratios(blocks, 2)
    nvml, nvml_error = open_nvml()
    gpus = len(nvml.handles) if nvml else 0
    host_cost, gpu_cost = sample_costs_s(nvml if gpus else None)
    if nvml is not None:
        nvml.close()
    gpu_measured = gpu_cost is not None
    not_measured = None if gpu_measured else (
        f"GPU sampling (NVML): not measured, no NVML device here ({nvml_error or 'NVML sees no GPU'}); the step-time "
        "ratios cover host sampling only")
    cost = host_cost + (gpu_cost or 0.0)
    default_ratio = statistics.median(ratios["default_2s"])
    step_ms = {m: round(statistics.median(b[1] for b in blocks if b[0] == m) * 1000, 3) for m in ["off", *INTERVALS]}
    payload = {
        "what": "mean optimizer-step time of the real Trainer (digits CNN, batch 64, fp32) with the real "
                "TelemetryCallback switched on / off every block inside one run; each on-block over the mean "
                "of its two off-neighbours; median over blocks",
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "gpus_sampled": gpus, "nvml": nvml_error or "ok", "gpu_sampling_measured": gpu_measured,
        "not_measured": not_measured, "block_s": BLOCK_S, "cycles": CYCLES, "quick": quick,
        "step_time_ratio_default_interval": round(default_ratio, 4),
        "step_time_ratio_stress_interval": round(statistics.median(ratios["stress_0.25s"]), 4),
        "ratios_per_block": {m: [round(v, 4) for v in vals] for m, vals in ratios.items()},
        "cpu_time_ratio_default_interval": round(statistics.median(cpu_ratios["default_2s"]), 4),
        "cpu_time_ratio_stress_interval": round(statistics.median(cpu_ratios["stress_0.25s"]), 4),
        "cpu_ratios_per_block": {m: [round(v, 4) for v in vals] for m, vals in cpu_ratios.items()},
        "median_step_ms": step_ms,
        "samples_written": samples,
        "sample_cost_ms": {"host": round(host_cost * 1000, 3),
                           "gpu": round(gpu_cost * 1000, 3) if gpu_measured else "not measured (no NVML device)"},
        "host_load_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2),
                           "cores": os.cpu_count()},  # load above the core count: other jobs shared the CPU
        "overhead_bound_default_interval": round(cost / 2.0, 6),
        "overhead_bound_covers": "host and GPU sampling" if gpu_measured else "host sampling only",
        "targets": {"step_time_ratio_default_interval": "<= 1.01"},
        # what was measured met (or missed) the target; an unmeasured GPU part is named in not_measured
        "meets_targets": default_ratio <= 1.01,
    }
    write_result("telemetry_overhead", payload)
    print({k: payload[k] for k in ("step_time_ratio_default_interval", "step_time_ratio_stress_interval",
                                   "cpu_time_ratio_default_interval", "cpu_time_ratio_stress_interval",
                                   "median_step_ms", "sample_cost_ms", "overhead_bound_default_interval",
                                   "meets_targets")})
    if not_measured:
        print(not_measured)


if __name__ == "__main__":
    main()
