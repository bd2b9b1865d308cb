"""RunDir: the run directory, the contract between stages.

This is the only module that spells file names inside a run directory. Every stage (train, telemetry,
evaluate, diagnose, report) asks a RunDir for its paths and records, so a run can be understood from its
directory alone, on another machine, after the fact.

    RUN/
      config.yaml         resolved config, written before step 1
      metrics.jsonl       {"step", "epoch", "split", "time", <metric>: value, ...} per line
      events.jsonl        {"step", "time", "kind", "severity", "message", "evidence"} per line
      system.jsonl        telemetry samples
      checkpoints/        step-<N>.pt (keep-N), last.pt, best.pt
      model.safetensors   final weights (the best ones when early stopping restored them)
      summary.json        status, steps, best and final metrics, timings
      eval/               metrics.json, confusion_matrix.csv, predictions.csv
      report.html         self-contained report
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainwise.atomic import atomic_write, atomic_write_json, atomic_write_text
from trainwise.errors import RunDirError

if TYPE_CHECKING:
    from trainwise.config import RunConfig

Severity = Literal["info", "warning", "error"]
Status = Literal["running", "completed", "stopped", "failed"]

_CHECKPOINT_PREFIX = "step-"
_CHECKPOINT_SUFFIX = ".pt"


class RunDir:
    """One training run's directory. Create it with `RunDir.create`, reopen it with `RunDir.open`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()  # trainer and telemetry thread append concurrently

    # ---- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, *, overwrite: bool = False) -> "RunDir":
        """A new, empty run directory. An existing non-empty one is refused unless `overwrite`."""
        return cls(path).initialise(overwrite=overwrite)

    def initialise(self, *, overwrite: bool = False) -> "RunDir":
        """Make this (not yet existing, or empty) directory on disk; see `create`."""
        self.refuse_existing(self.path, overwrite=overwrite)
        if self.path.is_dir() and any(self.path.iterdir()):
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    @staticmethod
    def refuse_existing(path: Path, *, overwrite: bool) -> None:
        """Raise when creating a run at `path` would replace files the user did not ask to replace."""
        if path.exists() and not path.is_dir():
            raise RunDirError(f"{path} exists and is not a directory; choose another --out.")
        if path.is_dir() and any(path.iterdir()) and not overwrite:
            raise RunDirError(
                f"{path} already holds files (a previous run?). Nothing was touched.\n"
                f"Choose another --out, `trainwise resume {path}` to continue it, or pass --overwrite "
                "to replace it.")

    @classmethod
    def open(cls, path: str | os.PathLike) -> "RunDir":
        """An existing run directory; it must hold a config.yaml."""
        run = cls(path)
        if not run.path.is_dir():
            raise RunDirError(f"{run.path} is not a run directory (it does not exist).")
        if not run.config_path.is_file():
            raise RunDirError(f"{run.path} is not a run directory: it has no config.yaml.")
        return run

    # ---- paths (the only place names are spelled) --------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def system_path(self) -> Path:
        return self.path / "system.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def model_path(self) -> Path:
        return self.path / "model.safetensors"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    @property
    def eval_metrics_path(self) -> Path:
        return self.eval_dir / "metrics.json"

    @property
    def eval_confusion_path(self) -> Path:
        return self.eval_dir / "confusion_matrix.csv"

    @property
    def eval_predictions_path(self) -> Path:
        return self.eval_dir / "predictions.csv"

    def report_path(self, fmt: Literal["html", "md"] = "html") -> Path:
        return self.path / f"report.{fmt}"

    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"

    # ---- config ------------------------------------------------------------------------------------
    def write_config(self, config: "RunConfig") -> None:
        from trainwise.config import dump_yaml

        atomic_write_text(self.config_path, dump_yaml(config))

    def read_config(self) -> "RunConfig":
        from trainwise.config import load_config

        return load_config(self.config_path)

    # ---- append-only records ---------------------------------------------------------------------
    def log_metrics(self, record: dict[str, Any]) -> None:
        self._append(self.metrics_path, {"time": time.time(), **record})

    def log_event(
        self,
        kind: str,
        message: str,
        *,
        severity: Severity = "info",
        step: int | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        event = {"step": step, "time": time.time(), "kind": kind, "severity": severity,
                 "message": message, "evidence": evidence or {}}
        self._append(self.events_path, event)
        return event

    def log_system(self, sample: dict[str, Any]) -> None:
        self._append(self.system_path, {"time": time.time(), **sample} if "time" not in sample else sample)

    def read_metrics(self, split: str | None = None) -> list[dict[str, Any]]:
        records = _read_jsonl(self.metrics_path)
        return [r for r in records if split is None or r.get("split") == split]

    def read_events(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.events_path)

    def read_system(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.system_path)

    def drop_metrics_after(self, step: int) -> None:
        """On resume: forget records past the checkpoint's step; the resumed run writes them again."""
        if not self.metrics_path.exists():
            return
        keep = [r for r in _read_jsonl(self.metrics_path) if int(r.get("step", 0)) <= step]
        text = "".join(json.dumps(r) + "\n" for r in keep)
        with self._lock:
            atomic_write_text(self.metrics_path, text)

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=_jsonable) + "\n"
        with self._lock, open(path, "a", encoding="utf-8") as f:
            f.write(line)

    # ---- summary -----------------------------------------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.summary_path, summary)

    def read_summary(self) -> dict[str, Any]:
        if not self.summary_path.exists():
            return {}
        return json.loads(self.summary_path.read_text())

    # ---- checkpoints -------------------------------------------------------------------------------
    def checkpoint_path(self, name: Literal["last", "best"] | int) -> Path:
        """`last`, `best`, or the checkpoint of an optimizer step."""
        if isinstance(name, int):
            return self.checkpoints_dir / f"{_CHECKPOINT_PREFIX}{name:08d}{_CHECKPOINT_SUFFIX}"
        return self.checkpoints_dir / f"{name}{_CHECKPOINT_SUFFIX}"

    def step_checkpoints(self) -> list[tuple[int, Path]]:
        """Step checkpoints on disk, oldest first."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for p in self.checkpoints_dir.glob(f"{_CHECKPOINT_PREFIX}*{_CHECKPOINT_SUFFIX}"):
            digits = p.name[len(_CHECKPOINT_PREFIX):-len(_CHECKPOINT_SUFFIX)]
            if digits.isdigit():
                found.append((int(digits), p))
        return sorted(found)

    def save_checkpoint(self, step: int, write, *, is_best: bool, keep_last: int) -> Path:
        """Write the checkpoint of `step` atomically, point `last` (and `best`) at it, keep the newest N."""
        path = atomic_write(self.checkpoint_path(step), write)
        _link_atomically(path, self.checkpoint_path("last"))
        if is_best:
            _link_atomically(path, self.checkpoint_path("best"))
        for _, old in self.step_checkpoints()[:-keep_last] if keep_last > 0 else []:
            old.unlink(missing_ok=True)  # `last`/`best` are hard links: their data stays
        return path

    # ---- weights -----------------------------------------------------------------------------------
    def write_model(self, state_dict: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
        from safetensors.torch import save

        tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
        data = save(tensors, metadata=metadata)
        return atomic_write(self.model_path, lambda f: f.write(data))

    def read_model(self) -> dict[str, Any]:
        from safetensors.torch import load_file

        if not self.model_path.exists():
            raise RunDirError(f"{self.path} has no model.safetensors: the run has not finished.")
        return load_file(self.model_path)


def _link_atomically(source: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # filesystems without hard links
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill; the record is written again on resume
    return records


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
