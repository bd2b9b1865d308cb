"""summary.json as the Trainer writes it: when training starts, at every checkpoint, and at the end.

While a run trains its summary says `running` with the steps checkpointed so far, the wall time so far and
the last train and validation metrics, so a run killed outright (SIGKILL, a lost machine) still shows its
real progress; readers call such a run `interrupted` (RunDir.status). `updated` is the time of the write:
with the lock file's pid and host it says when the writer was last heard from.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainwise.rundir import records as run_records
from trainwise.train.parallel.distributed import resume_command

if TYPE_CHECKING:
    from trainwise.rundir.layout import RunDir
    from trainwise.train.callbacks.early_stop import EarlyStopping
    from trainwise.train.step.state import TrainState

# what a train record says about the model and optimizer; its timing fields are summarised under `timings`
_TRAIN_FIELDS = ("step", "epoch", "loss", "lr", "grad_norm", "skipped_steps")
_RATE_FIELDS = ("samples_per_s", "tokens_per_s")  # a language model logs both; summarised as typical_rate


@dataclass(frozen=True)
class RunFacts:
    """What a summary says about the run besides its metrics, as the engine's parts stand at one write."""

    run_dir: "RunDir"
    state: "TrainState"
    early_stopping: "EarlyStopping"
    max_steps: int
    monitor: str
    """eval.monitor: the metric `best` is judged by."""
    last_checkpoint_step: int | None
    """The step a resume continues from (None before the first checkpoint of the run)."""
    device: str
    precision: str
    tf32: bool
    task: dict[str, Any] | None
    """What chance is for this run and which metrics it validates with (diagnose/task_profile.py)."""


class RunSummary:
    """Writes one session's summaries (a resumed run is a new session that counts the earlier ones' time).
    It follows metrics.jsonl as it grows, so a summary at every checkpoint never re-reads the whole file."""

    def __init__(self) -> None:
        self.started: float | None = None  # when this session's fit began
        self.wall_before = 0.0  # what the earlier sessions of a resumed run spent
        self._last: dict[str, dict[str, Any]] = {}  # split -> its newest metrics record
        # samples/s and tokens/s of every train log so far (a resumed run's earlier ones too)
        self._rates: dict[str, list[float]] = {field: [] for field in _RATE_FIELDS}
        self._read_up_to = 0  # bytes of metrics.jsonl already read

    def write(self, run: RunFacts, status: str, started: float, *, message: str | None = None,
              restored_best: bool = False) -> dict[str, Any]:
        if self.started is None:  # the first write of this session: a resumed run adds its past time
            self.started = started
            self.wall_before = wall_before(run.run_dir) if run.last_checkpoint_step is not None else 0.0
        last = self._newest_records(run.run_dir)
        summary = build_summary(run, status, wall_s=self.wall_before + time.time() - started, last=last,
                                message=message, restored_best=restored_best,
                                typical_rates={field: run_records.typical_rate(rates) for field, rates in self._rates.items()})
        run.run_dir.write_summary(summary)
        return summary

    def _newest_records(self, run_dir: "RunDir") -> dict[str, dict[str, Any]]:
        try:
            with open(run_dir.metrics_path, "rb") as f:
                size = f.seek(0, 2)
                if size < self._read_up_to:  # rewritten shorter (a resume drops records): read it again
                    self._last, self._read_up_to = {}, 0
                    self._rates = {field: [] for field in _RATE_FIELDS}
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
                for field, rates in self._rates.items():
                    rate = record.get(field) if record["split"] == "train" else None
                    if isinstance(rate, (int, float)) and rate > 0:
                        rates.append(float(rate))
        self._read_up_to += whole
        return self._last


def build_summary(run: RunFacts, status: str, *, wall_s: float, last: dict[str, dict[str, Any]],
                  message: str | None = None, restored_best: bool = False,
                  typical_rates: dict[str, float | None] | None = None) -> dict[str, Any]:
    """The summary of the run as it stands now; `last`: the newest metrics record of each split;
    `typical_rates`: the median samples/s (and tokens/s, a language model's) of its train logs (the last
    interval's rate when not given)."""
    val, train = last.get("val") or {}, last.get("train") or {}
    stopping, state = run.early_stopping, run.state
    return {
        "status": status, "steps": state.step, "max_steps": run.max_steps, "epoch": state.epoch,
        # the step a resume continues from (None before the first checkpoint)
        "last_checkpoint_step": run.last_checkpoint_step,
        "best": {"metric": run.monitor, "value": stopping.best, "step": stopping.best_step},
        "final": val,  # the last validation record
        "last_train": {k: train[k] for k in _TRAIN_FIELDS if k in train},
        "restored_best": restored_best,
        "timings": _timings(wall_s, train, typical_rates or {}),
        "device": run.device, "precision": run.precision, "tf32": run.tf32,
        "skipped_steps": state.skipped_steps, "message": message, "updated": time.time(),
        # what chance is for this run and which metrics it validates with: the diagnosis rules read it
        "task": run.task,
    }


def _timings(wall_s: float, train: dict[str, Any], typical: dict[str, float | None]) -> dict[str, Any]:
    """Wall time and the run's typical rates (typical_rate); tokens/s only for a language model."""
    timings: dict[str, Any] = {"wall_s": wall_s}
    for field in _RATE_FIELDS:
        rate = typical.get(field) if typical.get(field) is not None else train.get(field)
        if rate is not None or field == "samples_per_s":
            timings[field] = rate
    timings["last_samples_per_s"] = train.get("samples_per_s")
    return timings


def wall_before(run_dir: "RunDir") -> float:
    """The wall time the run's earlier sessions spent (a resumed run's summary counts the whole run)."""
    timings = run_dir.read_summary().get("timings") or {}
    wall = timings.get("wall_s") if isinstance(timings, dict) else None
    return float(wall) if isinstance(wall, (int, float)) and wall >= 0 else 0.0


def stopped_message(reason: str, run: RunFacts) -> str:
    return (f"stopped by {reason.split(':')[-1]} after step {run.state.step}; checkpoint written. "
            f"Continue with: {resume_command(run.run_dir.path)}")


def early_stop_message(run: RunFacts, restored: bool) -> str:
    stopping = run.early_stopping
    return (f"stopped early at step {run.state.step} of {run.max_steps} ({run.monitor} did not "
            f"improve for {stopping.patience} evaluations); best step {stopping.best_step} "
            + ("restored" if restored else "kept"))
