"""What the person at the terminal sees while training: a Rich progress bar on a TTY, plain periodic lines
otherwise (logs, CI, nohup). TensorBoard events when it is installed."""
from __future__ import annotations

import os
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from trainwise.train.callbacks import Callback


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


def _describe(record: dict, device_type: str = "cpu") -> str:
    rate = f"{record['samples_per_s']:,.0f} samples/s"
    if "tokens_per_s" in record:
        from trainwise.train.language_model import mfu_text

        rate = f"{record['tokens_per_s']:,.0f} tokens/s  {mfu_text(record, device_type)}"
    return f"loss {record['loss']:.4f}  lr {record['lr']:.2e}  {rate}  data wait {record['data_wait_fraction']:.0%}"


def _device_type(trainer) -> str:
    device = getattr(trainer, "device", "cpu")
    return getattr(device, "type", str(device))


def _starting(trainer) -> str:
    if trainer.step:
        return f"resuming from step {trainer.step} of {trainer.max_steps} (epoch {trainer.epoch})"
    attention = getattr(getattr(trainer.model, "config", None), "_attn_implementation", None)  # Hugging Face
    return f"training {trainer.max_steps} steps" + (f" with {attention} attention" if attention else "")


# event kinds the terminal shows when they happen (live diagnoses, the sanity checks before step 1, warnings
# the engine issues, the outcome the CLI prints): not repeated at the end
SHOWN_AS_THEY_HAPPEN = ("diagnosis", "sanity", "checkpoint_fallback", "config_changed", "signal", "stopped",
                        "failed", "nonfinite")


class ProgressDisplay(Callback):
    def __init__(self, console: Console | None = None):
        self.console = console or TrainingConsole()
        self.progress: Progress | None = None
        self.task = None
        self.started = 0.0
        self.first_step = 0  # the step this process started from (after a resume, not 0)
        self.events_before = 0  # events.jsonl lines written before this session

    def on_fit_start(self, trainer) -> None:
        self.started = time.perf_counter()
        self.first_step = trainer.step
        self.events_before = len(trainer.run_dir.read_events())
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                TextColumn("{task.description}"), TimeRemainingColumn(), console=self.console, transient=False)
            self.progress.start()
            self.task = self.progress.add_task("", total=trainer.max_steps, completed=trainer.step)
        else:
            self.console.print(f"{_starting(trainer)} on {trainer.device} ({trainer.precision}); "
                               f"run directory {trainer.run_dir.path}", highlight=False)

    def on_step_end(self, trainer) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=trainer.step)

    def on_log(self, trainer, record) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=_describe(record, _device_type(trainer)))
            return
        # from the pace since this process started: a resumed run has not done its first steps here
        done_here = trainer.step - self.first_step
        elapsed = time.perf_counter() - self.started
        eta = elapsed / done_here * (trainer.max_steps - trainer.step) if done_here > 0 else float("nan")
        self.console.print(f"step {trainer.step}/{trainer.max_steps}  {_describe(record, _device_type(trainer))}  eta {eta:.0f}s",
                           highlight=False)

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
