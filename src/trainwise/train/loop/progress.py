"""What the person at the terminal sees while training: a Rich progress bar on a TTY, plain periodic lines
otherwise (logs, CI, nohup). TensorBoard events when it is installed."""
from __future__ import annotations

import os
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from trainwise.train.callbacks.base import Callback


class TrainingConsole(Console):
    """The console a training run writes to. When the reader goes away (`trainwise train ... | head`, a
    closed ssh session's pipe) the run goes on silently: Rich's default ends the process with SystemExit(1),
    which killed a healthy run as `failed`. Everything the run records still goes to its directory."""

    def __init__(self, **kwargs):
        super().__init__(**{"stderr": True, **kwargs})

    def on_broken_pipe(self) -> None:
        self.quiet = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())  # later writes by anyone to this stream go nowhere, quietly
            os.close(devnull)
        except (OSError, ValueError):  # a stream without a file descriptor: quiet is enough
            pass


# The progress line keeps to the terminal's width (80 columns when piped): what says least goes first. A data
# wait under DATA_WAIT_SHOWN is not worth a place on every line; a missing MFU (no catalogue peak) is not shown.
DATA_WAIT_SHOWN = 0.05
SEPARATOR = "  "
BAR_WIDTH = 12


def _describe(record: dict, width: int = 200) -> str:
    """The interval's figures, those that say least dropped first until the line fits `width` columns."""
    parts = [(f"loss {record['loss']:.4f}", 0), (f"lr {record['lr']:.2e}", 2)]
    if "tokens_per_s" in record:
        parts.append((f"{_count(record['tokens_per_s'])} tokens/s", 1))
        if "mfu" in record:
            parts.append((f"MFU {record['mfu']:.0%}", 3))
    else:
        parts.append((f"{_count(record['samples_per_s'])} samples/s", 1))
    if record.get("data_wait_fraction", 0.0) >= DATA_WAIT_SHOWN:
        parts.append((f"data wait {record['data_wait_fraction']:.0%}", 2))
    return fit_line(parts, width)


def fit_line(parts: list[tuple[str, int]], width: int) -> str:
    """`parts` joined, the highest-ranked (least telling) left out, the latest first, until it fits `width`."""
    parts = list(parts)
    while len(parts) > 1 and len(SEPARATOR.join(text for text, _ in parts)) > width:
        parts.pop(max(range(len(parts)), key=lambda i: (parts[i][1], i)))
    return SEPARATOR.join(text for text, _ in parts)


def _count(rate: float) -> str:
    """149,225 -> "149k": a rate needs three figures, not six."""
    if rate >= 1e6:
        return f"{rate / 1e6:.1f}M"
    return f"{rate / 1e3:.0f}k" if rate >= 1e4 else f"{rate:,.0f}"


def duration(seconds: float) -> str:
    if seconds != seconds:  # NaN: no pace yet
        return "?"
    seconds = int(round(seconds))
    if seconds < 100:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class StepPace:
    """Seconds per optimizer step, smoothed: an exponential moving average of step times that ignores this
    process's first `warmup` steps (compilation, allocator and data workers starting) and counts one slow step
    (an evaluation, a checkpoint) as at most SPIKE times the average, so the ETA does not swing with them."""

    SPIKE = 4.0

    def __init__(self, clock=None, warmup: int = 3, smoothing: float = 0.1):
        self.clock = clock or (lambda: time.perf_counter())
        self.warmup, self.smoothing = warmup, smoothing
        self.last: float | None = None
        self.steps = 0
        self.average: float | None = None

    def start(self) -> None:
        self.last, self.steps, self.average = self.clock(), 0, None

    def step(self) -> None:
        now = self.clock()
        took, self.last = now - (self.last if self.last is not None else now), now
        self.steps += 1
        if self.steps <= self.warmup:
            return
        if self.average is None:
            self.average = took
        else:
            self.average += self.smoothing * (min(took, self.SPIKE * self.average) - self.average)

    def eta(self, remaining: int) -> float | None:
        """Seconds left for `remaining` steps; None before the warm-up steps are over."""
        return None if self.average is None else self.average * remaining


def _starting(trainer) -> str:
    if trainer.step:
        start = f"resuming from step {trainer.step} of {trainer.max_steps} (epoch {trainer.epoch})"
    else:
        start = f"training {trainer.max_steps} steps"
    attention = getattr(getattr(getattr(trainer, "model", None), "config", None), "_attn_implementation", None)
    with_attention = f", {attention} attention" if attention else ""
    return (f"{start} on {trainer.device} ({precision_words(trainer)}{with_attention}); run directory "
            f"{trainer.run_dir.path}")


def precision_words(trainer) -> str:
    """What the run computes in: the autocast precision, and the weights' own dtype where that is not fp32 (a
    bf16 base trains in bf16 whatever autocast says), with the trainable ones' where they differ (LoRA)."""
    import torch

    model = getattr(trainer, "model", None)
    sizes: dict[tuple[torch.dtype, bool], int] = {}
    for parameter in model.parameters() if isinstance(model, torch.nn.Module) else ():
        key = (parameter.dtype, parameter.requires_grad)
        sizes[key] = sizes.get(key, 0) + parameter.numel()
    if not sizes:
        return trainer.precision
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    bulk = name.get(max(sizes, key=sizes.get)[0], "?")
    trained = {name.get(dtype, "?") for (dtype, trainable) in sizes if trainable}
    if bulk == "fp32" and trained <= {"fp32"}:
        return trainer.precision
    words = f"{bulk} weights" + (f", trainable in {'/'.join(sorted(trained))}" if trained - {bulk} else "")
    return words if trainer.precision in ("fp32", bulk) else f"{words}, {trainer.precision} autocast"


# event kinds the terminal shows when they happen (live diagnoses, the sanity checks before step 1, warnings
# the engine issues, the outcome the CLI prints): not repeated at the end
SHOWN_AS_THEY_HAPPEN = ("diagnosis", "sanity", "checkpoint_fallback", "config_changed", "signal", "stopped",
                        "failed", "nonfinite")


class ProgressDisplay(Callback):
    def __init__(self, console: Console | None = None, clock=None):
        self.console = console or TrainingConsole()
        self.progress: Progress | None = None
        self.task = None
        self.clock = clock or (lambda: time.perf_counter())  # looked up at each call: tests patch it
        self.pace = StepPace(self.clock)
        self.started = 0.0
        self.first_step = 0  # the step this process started from (after a resume, not 0)
        self.events_before = 0  # events.jsonl lines written before this session

    def on_fit_start(self, trainer) -> None:
        self.started = self.clock()
        self.pace.start()
        self.first_step = trainer.step
        self.events_before = len(trainer.run_dir.read_events())
        self.console.print(_starting(trainer), highlight=False, soft_wrap=True)
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("step {task.completed}/{task.total}"), BarColumn(bar_width=BAR_WIDTH),
                TextColumn("{task.description}"), TextColumn("{task.fields[eta]}"), console=self.console,
                transient=False)
            self.progress.start()
            self.task = self.progress.add_task("", total=trainer.max_steps, completed=trainer.step, eta="")

    def on_step_end(self, trainer) -> None:
        self.pace.step()
        if self.progress is not None:
            self.progress.update(self.task, completed=trainer.step, eta=self._eta(trainer))

    def _eta(self, trainer) -> str:
        """From the smoothed pace; until the warm-up steps are over, from the pace since this process started
        (a resumed run has not done its first steps here)."""
        remaining = trainer.max_steps - trainer.step
        seconds = self.pace.eta(remaining)
        if seconds is None:
            done_here = trainer.step - self.first_step
            seconds = (self.clock() - self.started) / done_here * remaining if done_here > 0 else float("nan")
        return f"eta {duration(seconds)}"

    def on_log(self, trainer, record) -> None:
        if self.progress is not None:  # step, bar, ETA (up to 10) and their 3 spaces around it
            room = self.console.width - len(f"step {trainer.step}/{trainer.max_steps}") - BAR_WIDTH - 14
            self.progress.update(self.task, description=_describe(record, room))
            return
        head, eta = f"step {trainer.step}/{trainer.max_steps}", self._eta(trainer)
        room = self.console.width - len(head) - len(eta) - 2 * len(SEPARATOR)
        self.console.print(SEPARATOR.join((head, _describe(record, room), eta)), highlight=False, soft_wrap=True)

    def on_eval(self, trainer, record) -> None:
        shown = "  ".join(f"{k} {v:.4f}" for k, v in record.items()
                          if isinstance(v, float) and k not in ("time",))
        message = f"step {record['step']} val: {shown}"
        (self.progress.console if self.progress else self.console).print(message, highlight=False)

    def on_fit_end(self, trainer, summary) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        # what the report lists among the warnings, the terminal says too: one line each
        for event in trainer.run_dir.read_events()[self.events_before:]:
            if event.get("severity") in ("warning", "error") and event.get("kind") not in SHOWN_AS_THEY_HAPPEN:
                message = str(event.get("message", "")).splitlines()[0] if event.get("message") else event.get("kind")
                self.console.print(f"[yellow]{event['severity']}[/] step {event.get('step')}: {message}",
                                   highlight=False)


class TensorBoardLog(Callback):
    """Mirror metrics.jsonl into TensorBoard event files (RUN/tensorboard) when tensorboard is installed."""

    def __init__(self):
        self.writer = None

    @staticmethod
    def available() -> bool:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            return False
        return True

    def on_fit_start(self, trainer) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(trainer.run_dir.tensorboard_dir()))

    def _write(self, record: dict) -> None:
        for key, value in record.items():
            if isinstance(value, (int, float)) and key not in ("step", "epoch", "time"):
                self.writer.add_scalar(f"{record['split']}/{key}", value, record["step"])

    def on_log(self, trainer, record) -> None:
        self._write(record)

    def on_eval(self, trainer, record) -> None:
        self._write(record)

    def on_fit_end(self, trainer, summary) -> None:
        if self.writer is not None:
            self.writer.close()
