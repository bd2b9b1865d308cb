"""What the present machine is, and what a few real training steps cost on it (`trainwise plan --probe`).

Probes only read facts and time things; every decision over them is in advise.py. Peak memory is measured
by the allocator itself: on CUDA `torch.cuda.max_memory_allocated` after a warm-up step; on CPU the
allocation events of torch.profiler (each records the bytes the CPU allocator handed out or took back).
"""
from __future__ import annotations

import contextlib
import gc
import platform
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from trainwise.plan.fake_build import make_batch
from trainwise.plan.kernel_bounds import probe_threads, threads
from trainwise.plan.memory import build_train_step
from trainwise.plan.traced_step import TrainingStep
from trainwise.plan.workspaces import quiet_stderr


@dataclass(frozen=True)
class MachineFacts:
    """The present machine, as the advice needs it."""

    cpu_model: str
    cpu_cores: int  # cores this process may use (affinity and container quota), as the loader counts them
    cpu_max_mhz: float | None
    cpu_flags: tuple[str, ...]  # the vector-unit flags that set peak FLOP/s: avx512f, avx2, fma, ...
    ram_bytes: int
    ram_available_bytes: int
    disk_free_bytes: int
    torch_threads: int
    gpus: tuple[dict, ...] = field(default_factory=tuple)  # {"name", "memory_bytes", "capability"}

    def to_dict(self) -> dict:
        return asdict(self)


def read_machine(disk_path: str | Path = ".") -> MachineFacts:
    import psutil

    from trainwise.data.loader import usable_cores

    memory = psutil.virtual_memory()
    frequency = None
    try:
        freq = psutil.cpu_freq()
        frequency = float(freq.max or freq.current) if freq else None
    except (NotImplementedError, FileNotFoundError, AttributeError):
        pass
    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"name": props.name, "memory_bytes": int(props.total_memory),
                         "capability": f"{props.major}.{props.minor}"})
    return MachineFacts(cpu_model=_cpu_model(), cpu_cores=usable_cores(), cpu_max_mhz=frequency,
                        cpu_flags=_cpu_flags(), ram_bytes=int(memory.total),
                        ram_available_bytes=int(memory.available),
                        disk_free_bytes=int(shutil.disk_usage(_existing(Path(disk_path))).free),
                        torch_threads=torch.get_num_threads(), gpus=tuple(gpus))


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> tuple[str, ...]:
    wanted = {"avx512f", "avx512_bf16", "amx_bf16", "avx2", "fma", "asimd", "sve"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return tuple(sorted(wanted & set(line.split(":", 1)[1].split())))
    except OSError:
        pass
    return ("asimd",) if platform.machine() in ("arm64", "aarch64") else ()


# ---- measuring real steps --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProbeResult:
    device: str
    steps_timed: int
    step_time_s: float  # median seconds per optimizer step, warm-up excluded
    peak_bytes: int  # allocator peak over a warm-up step and a steady one

    def to_dict(self) -> dict:
        return asdict(self)


def cpu_peak_bytes(run: Callable[[], None], within: str | None = None) -> int:
    """Peak bytes the CPU allocator had handed out while `run` ran (counted from the start of `run`).

    With `within`, the peak is taken only inside the profiler ranges of that name (record_function), while
    the running total still counts everything allocated before and outside them."""
    return cpu_peaks(run, within)[0]


def cpu_peaks(run: Callable[[], None], within: str | None = None) -> tuple[int, int]:
    """(the peak inside the `within` ranges, the peak over all of `run`) from one profiled run."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with quiet_stderr():  # kineto logs "profiler_start/stop" lines to fd 2, noise in a plan
        prof.__enter__()
    try:
        run()
    finally:
        with quiet_stderr():
            prof.__exit__(None, None, None)
    events: list[tuple[int, int]] = []
    windows: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
            events.append((node.start_time_ns, node.typed[1].alloc_size))
        elif within is not None and node.name == within:
            windows.append((node.start_time_ns, node.end_time_ns))
        stack.extend(node.children)
    if within is not None and not windows:
        raise RuntimeError(f"no profiler range named {within!r} ran")
    events.sort()
    windows.sort()
    live = peak = overall = 0
    for time_ns, size in events:
        live += size
        overall = max(overall, live)
        if within is None or any(start <= time_ns <= end for start, end in windows):
            peak = max(peak, live)
    return peak, overall


def measured_peak_bytes(step: TrainingStep, device: torch.device) -> int:
    """Real peak of what trace_step estimates: the model, then two steps of the Trainer's TrainStep. On the CPU
    the steps run with the threads the trace assumes (`probe_threads`: every usable core, as a run here may
    use), since kernels take buffers per thread: a process limited to fewer (OMP_NUM_THREADS=1) would measure
    less than the plan bounds."""
    def two_steps() -> None:
        model = step.build_model().to(device)
        train_step = build_train_step(step, model, device)
        for _ in range(2):
            train_step(host_batches(step))

    with contextlib.nullcontext() if device.type == "cuda" else threads(probe_threads()):
        return peak_bytes(two_steps, device)


def peak_bytes(run: Callable[[], None], device: torch.device, within: str | None = None) -> int:
    """Peak bytes the device's allocator handed out while `run` ran, over what was allocated before it: on
    CUDA torch.cuda.max_memory_allocated, on the CPU the profiler's allocation events (see cpu_peak_bytes)."""
    if device.type != "cuda":
        return cpu_peak_bytes(run, within=within)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def host_batches(step: TrainingStep) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One optimizer step's micro-batches in host memory, as the loader hands them to the Trainer."""
    return [make_batch(step, "cpu") for _ in range(step.accumulation_steps)]


def probe_steps(step: TrainingStep, device: torch.device, *, steps: int = 5,
                time_limit_s: float = 20.0) -> ProbeResult:
    """Time a few real optimizer steps on `device` (after one warm-up) and measure the peak memory."""
    peak = measured_peak_bytes(step, device)
    model = step.build_model().to(device)
    train_step = build_train_step(step, model, device)
    batches = host_batches(step)
    train_step(batches)  # warm-up: lazy init, kernel choice
    times: list[float] = []
    started = time.perf_counter()
    for _ in range(steps):
        _synchronize(device)
        t0 = time.perf_counter()
        train_step(batches)
        _synchronize(device)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - started > time_limit_s:
            break
    return ProbeResult(device=str(device), steps_timed=len(times), step_time_s=statistics.median(times),
                       peak_bytes=peak)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
