"""What a run is, decided once before its first step: the config it records (the caller's own model and data
when it was not built from the config, train/loop/python_run.py), its data spec (read off the targets when none is
given), its task profile (what chance is, diagnose/task_profile.py; a monitor typo fails here) and its steps
(none for a model fitted by counting, the popularity baseline)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainwise.config import RunConfig
from trainwise.data.spec_inference import infer_spec
from trainwise.diagnose.task_profile import TaskProfile, run_profile
from trainwise.train.callbacks.base import Callback
from trainwise.train.loop.python_run import python_run_config


@dataclass(frozen=True)
class RunTask:
    config: RunConfig
    data_spec: Any
    profile: TaskProfile | None
    eval_kind: str
    """Which metrics validation logs (diagnose/task_profile.py VALIDATION_METRICS)."""


def run_task(model: Any, train_data: Any, val_data: Any, config: RunConfig, data_spec: Any,
             built_from_config: bool) -> RunTask:
    config = config if built_from_config else python_run_config(config, model, train_data, val_data)
    spec = data_spec or infer_spec(train_data)  # float targets, one per sample: regression
    profile, kind = run_profile(spec, model, None if val_data is None else config.eval.monitor)
    return RunTask(config, spec, profile, kind)


def planned_steps(model: Any, config: RunConfig, num_train: int) -> int:
    """The run's optimizer steps: none for a model fitted by counting (it is validated once, as built)."""
    return 0 if getattr(model, "counted", False) else config.train.total_steps(num_train)


class ValidateAsBuilt(Callback):
    """A model fitted by counting trains no step: it is validated (and checkpointed as `best`) once, as built."""

    def on_fit_start(self, trainer) -> None:
        if trainer.max_steps == 0 and trainer.val_data is not None and trainer.step == 0:
            trainer.evaluate_and_checkpoint()  # the same record, checkpoint and terminal line as any evaluation
