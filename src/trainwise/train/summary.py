"""summary.json as the Trainer writes it: when training starts, at every checkpoint, and at the end.

While a run trains its summary says `running` with the steps checkpointed so far, the wall time so far and
the last train and validation metrics, so a run killed outright (SIGKILL, a lost machine) still shows its
real progress; readers call such a run `interrupted` (RunDir.status). `updated` is the time of the write:
with the lock file's pid and host it says when the writer was last heard from.
"""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from trainwise.rundir import records as run_records

if TYPE_CHECKING:
    from trainwise.rundir.layout import RunDir
    from trainwise.train.trainer import Trainer

# what a train record says about the model and optimizer; its timing fields are summarised under `timings`
_TRAIN_FIELDS = ("step", "epoch", "loss", "lr", "grad_norm", "skipped_steps")


class RunSummary:
    """Writes one session's summaries (a resumed run is a new session that counts the earlier ones' time).
    It follows metrics.jsonl as it grows, so a summary at every checkpoint never re-reads the whole file."""

    def __init__(self) -> None:
        self.started: float | None = None  # when this session's fit began
        self.wall_before = 0.0  # what the earlier sessions of a resumed run spent
        self._last: dict[str, dict[str, Any]] = {}  # split -> its newest metrics record
        self._read_up_to = 0  # bytes of metrics.jsonl already read

    def write(self, trainer: "Trainer", status: str, started: float, *, message: str | None = None,
              restored_best: bool = False) -> dict[str, Any]:
        if self.started is None:  # the first write of this session: a resumed run adds its past time
            self.started = started
            self.wall_before = wall_before(trainer.run_dir) if trainer._last_checkpoint_step is not None else 0.0
        summary = build_summary(trainer, status, wall_s=self.wall_before + time.time() - started,
                                last=self._newest_records(trainer.run_dir), message=message,
                                restored_best=restored_best)
        trainer.run_dir.write_summary(summary)
        return summary

    def _newest_records(self, run_dir: "RunDir") -> dict[str, dict[str, Any]]:
        try:
            with open(run_dir.metrics_path, "rb") as f:
                size = f.seek(0, 2)
                if size < self._read_up_to:  # rewritten shorter (a resume drops records): read it again
                    self._last, self._read_up_to = {}, 0
                f.seek(self._read_up_to)
                data = f.read()
        except FileNotFoundError:
            return self._last
        whole = data.rfind(b"\n") + 1  # a line still being appended is read next time
        for line in data[:whole].splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a torn line (RunDir.read_metrics names it): not the newest record
                continue
            if isinstance(record, dict) and run_records.metric_problem(record) is None:
                self._last[record["split"]] = record
        self._read_up_to += whole
        return self._last


def build_summary(trainer: "Trainer", status: str, *, wall_s: float, last: dict[str, dict[str, Any]],
                  message: str | None = None, restored_best: bool = False) -> dict[str, Any]:
    """The summary of `trainer`'s run as it stands now; `last`: the newest metrics record of each split."""
    val, train = last.get("val") or {}, last.get("train") or {}
    stopping = trainer.early_stopping
    return {
        "status": status, "steps": trainer.step, "max_steps": trainer.max_steps, "epoch": trainer.epoch,
        # the step a resume continues from (None before the first checkpoint)
        "last_checkpoint_step": trainer._last_checkpoint_step,
        "best": {"metric": trainer.config.eval.monitor, "value": stopping.best, "step": stopping.best_step},
        "final": val,  # the last validation record
        "last_train": {k: train[k] for k in _TRAIN_FIELDS if k in train},
        "restored_best": restored_best,
        "timings": {"wall_s": wall_s, "samples_per_s": train.get("samples_per_s")},
        "device": str(trainer.device), "precision": trainer.precision, "tf32": trainer.tf32,
        "skipped_steps": trainer.skipped_steps, "message": message, "updated": time.time(),
    }


def wall_before(run_dir: "RunDir") -> float:
    """The wall time the run's earlier sessions spent (a resumed run's summary counts the whole run)."""
    timings = run_dir.read_summary().get("timings") or {}
    wall = timings.get("wall_s") if isinstance(timings, dict) else None
    return float(wall) if isinstance(wall, (int, float)) and wall >= 0 else 0.0


def stopped_message(trainer: "Trainer") -> str:
    return (f"stopped by {trainer._stop_reason.split(':')[-1]} after step {trainer.step}; checkpoint written. "
            f"Continue with: trainwise resume {trainer.run_dir.path}")


def early_stop_message(trainer: "Trainer", restored: bool) -> str:
    stopping = trainer.early_stopping
    return (f"stopped early at step {trainer.step} of {trainer.max_steps} ({trainer.config.eval.monitor} did not "
            f"improve for {stopping.patience} evaluations); best step {stopping.best_step} "
            + ("restored" if restored else "kept"))
