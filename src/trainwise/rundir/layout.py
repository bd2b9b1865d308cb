"""RunDir, the contract between stages: the only module that spells file names inside a run directory. Every
stage asks it for paths and records, so a run can be understood from its directory alone, after the fact.

    RUN/
      config.yaml         resolved config, written before step 1
      metrics.jsonl       {"step", "epoch", "split", "time", <metric>: value, ...} per line
      events.jsonl        {"step", "time", "kind", "severity", "message", "evidence"} per line
      system.jsonl        telemetry samples
      checkpoints/        step-<N>.pt (keep-N), last.pt, best.pt; sharded (fsdp): step-<N>/, last, best symlinks
      model.safetensors   final weights (the best ones when early stopping restored them); format: weights_format.py
      summary.json        status, steps, best and final metrics, timings; rewritten at every checkpoint; what
                          readers make of it (interrupted, still training): status.py
      eval/               metrics.json (latest), metrics-<split>.json (each split's latest), confusion_matrix.csv,
                          predictions.csv, answers.jsonl (a fine-tune's every held-out answer, tuned and base)
      lr_find.json/.png   the LR range test, when `trainwise lr-find --out RUN` ran
      report.html         self-contained report (report.md with --format md)
      error.log           the full traceback of a run that failed
      tokenizer/          text runs: the tokenizer the data was made with, and the sequence length
      adapter/            LoRA runs: the adapter in peft's format (adapter.py)
      tensorboard/        TensorBoard event files mirroring metrics.jsonl, when tensorboard is installed
      checksums.json      SHA-256 and size of each checkpoint and of the final weights (integrity.py)
      .lock               held by the one process writing the run; says which (lock.py)
"""
from __future__ import annotations

import json
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainwise.errors import RunDirError, RunDirWarning
from trainwise.rundir import checkpoint_files
from trainwise.rundir import lock as run_lock, records as run_records, replace as run_replace, status as run_status
from trainwise.rundir.atomic import atomic_write_digest, atomic_write_json, atomic_write_text, remove_temp_files
from trainwise.rundir.checkpoint_dirs import SHARDED_STATE_FILE, CheckpointDirs, numbered
from trainwise.rundir.integrity import (CheckpointChoice, Ledger, check_loadable, config_not_text, damaged_file_advice,
                                        disk_full_advice, free_space_warning, load_weights_file, newest_intact)
from trainwise.rundir.lock import Holder
from trainwise.rundir.status import ReadStatus
from trainwise.rundir.weights_format import safetensors_bytes

if TYPE_CHECKING:
    from trainwise.config import RunConfig

Severity = Literal["info", "warning", "error"]

_CHECKPOINT_PREFIX = "step-"
_CHECKPOINT_SUFFIX = ".pt"
_LOCK_FILE = ".lock"


class RunDir:
    """One training run's directory. Create it with `RunDir.create`, reopen it with `RunDir.open`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()  # trainer and telemetry thread append concurrently
        self._writer_guard = threading.Lock()  # the first write may come from the trainer or the telemetry thread
        self._writer: weakref.finalize | None = None  # gives the run's lock back when this object goes
        self._sealed: set[Path] = set()  # record files whose torn tail (if any) was cut off
        self.problems: list[str] = []  # what readers skipped (bad lines, a damaged summary), for the report

    # ---- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, *, overwrite: bool = False, inputs: Iterable[Path] = ()) -> "RunDir":
        """A new, empty run directory. An existing non-empty one is refused unless `overwrite` and it is an
        earlier run (see `initialise`)."""
        return cls(path).initialise(overwrite=overwrite, inputs=inputs)

    def initialise(self, *, overwrite: bool = False, inputs: Iterable[Path] = ()) -> "RunDir":
        """Make this (not yet existing, or empty) directory on disk and hold its lock. With `overwrite`, an
        earlier run here is replaced: moved aside first, deleted once the new directory exists and is locked.
        Anything that is not a run, and places replace.py protects (`inputs`: what the new run reads),
        are refused before anything is touched."""
        inputs = tuple(inputs)
        self.refuse_existing(self.path, overwrite=overwrite, inputs=inputs)
        aside = None
        if self.path.is_dir() and any(child.name != _LOCK_FILE for child in self.path.iterdir()):
            self.acquire_writer()  # a run another process is writing is never replaced
            aside = run_replace.move_aside(self.path)
            self.release_writer()  # its lock moved with it
        self.acquire_writer()
        if aside is not None:
            kept = run_replace.remove_aside(aside)
            if kept:
                warnings.warn(kept, RunDirWarning, stacklevel=2)
        return self

    @staticmethod
    def refuse_existing(path: Path, *, overwrite: bool, inputs: Iterable[Path] = ()) -> None:
        """Raise when creating a run at `path` would replace files the user did not ask to replace."""
        run_status.refuse_existing(RunDir(path), overwrite=overwrite, inputs=inputs)

    @staticmethod
    def entry_names() -> frozenset[str]:
        """The top-level names a run directory may hold: what --overwrite may replace."""
        run = RunDir(".")
        paths = [run.config_path, run.metrics_path, run.events_path, run.system_path, run.checkpoints_dir,
                 run.model_path, run.adapter_dir(), run.summary_path, run.eval_dir, run.lock_path,
                 run.report_path("html"), run.report_path("md"), run.tensorboard_dir(), *run.lr_find_paths,
                 run.error_log_path, run.checksums_path, run.tokenizer_dir()]
        return frozenset(path.name for path in paths)

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
        """The latest evaluation, whichever split it measured."""
        return self.eval_dir / "metrics.json"

    def eval_split_metrics_path(self, split: str) -> Path:
        """The latest evaluation of one split, kept when another split is evaluated after it."""
        return self.eval_dir / f"metrics-{split}.json"

    @property
    def eval_confusion_path(self) -> Path:
        return self.eval_dir / "confusion_matrix.csv"

    @property
    def eval_predictions_path(self) -> Path:
        return self.eval_dir / "predictions.csv"

    @property
    def eval_answers_path(self) -> Path:
        return self.eval_dir / "answers.jsonl"

    def report_path(self, fmt: Literal["html", "md"] = "html") -> Path:
        return self.path / f"report.{fmt}"

    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"

    def tokenizer_dir(self) -> Path:
        return self.path / "tokenizer"

    def adapter_dir(self) -> Path:
        """A LoRA run's adapter in peft's format (adapter_model.safetensors + adapter_config.json): adapter.py."""
        return self.path / "adapter"

    @property
    def lr_find_paths(self) -> tuple[Path, Path]:
        """(lr_find.json, lr_find.png): `trainwise lr-find --out` writes them, into a run or any directory."""
        return self.path / "lr_find.json", self.path / "lr_find.png"

    @property
    def error_log_path(self) -> Path:
        return self.path / "error.log"

    def write_error_log(self, text: str) -> None:
        """The full traceback of a run that failed (the terminal and events.jsonl get the diagnosis)."""
        atomic_write_text(self.error_log_path, text)

    @property
    def lock_path(self) -> Path:
        return self.path / _LOCK_FILE

    @property
    def checksums_path(self) -> Path:
        return self.path / "checksums.json"

    # ---- one writer --------------------------------------------------------------------------------
    def acquire_writer(self) -> "RunDir":
        """Hold the run's lock for as long as this object lives (or until `release_writer`).

        Every write method calls it, so the first write takes the lock; call it earlier to fail fast.
        RunInUseError (exit 2) when another live process holds it. Taking it also removes the temporary
        files a killed writer left behind.
        """
        if self._writer is not None and self._writer.alive:
            return self
        with self._writer_guard:
            if self._writer is None or not self._writer.alive:
                self.path.mkdir(parents=True, exist_ok=True)
                key, first = run_lock.acquire(self.lock_path, self.path)
                self._writer = weakref.finalize(self, run_lock.release, key)
                if first:  # nothing of this process is mid-write here: every temporary file is a leftover
                    self._remove_temp_files()
        return self

    def release_writer(self) -> None:
        """Give the lock back now (it also goes when this object is collected or the process ends)."""
        if self._writer is not None:
            self._writer()

    def live_writer(self) -> Holder | None:
        """The live process writing this run (pid, host, since), or None. Readers never take the lock."""
        return run_lock.holder(self.lock_path)

    def liveness_note(self) -> str | None:
        """Still training, or interrupted, when the summary says `running` (status.py)."""
        return run_status.liveness_note(self)

    def has_checkpoint(self) -> bool:
        """Whether any checkpoint (file or sharded directory) is on disk: something `trainwise resume` can use."""
        return bool(self.checkpoint_path("last").is_file() or self.step_checkpoints() or self.checkpoint_dirs.steps())

    def status(self) -> ReadStatus:
        """The run's status as readers say it, `interrupted` for a killed writer (status.py)."""
        return run_status.status(self)

    def remove_stale_temp_files(self) -> list[Path]:
        """For readers (eval, report): remove the temporary files of a killed writer, unless one is live."""
        with run_lock.quiet(self.lock_path) as quiet:
            return self._remove_temp_files() if quiet else []

    def _remove_temp_files(self) -> list[Path]:
        return remove_temp_files([self.path, self.checkpoints_dir, self.eval_dir])

    # ---- config ------------------------------------------------------------------------------------
    def write_config(self, config: "RunConfig") -> None:
        from trainwise.config import dump_yaml

        self.acquire_writer()
        atomic_write_text(self.config_path, dump_yaml(config))

    def read_config(self) -> "RunConfig":
        from trainwise.config import load_config

        self.read_config_text()  # a damaged file is named as such, not as a decoding traceback
        return load_config(self.config_path)

    def read_config_text(self) -> str:
        try:
            return self.config_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise config_not_text(self.config_path, error) from None

    # ---- append-only records ---------------------------------------------------------------------
    def log_metrics(self, record: dict[str, Any]) -> None:
        self._append(self.metrics_path, {"time": time.time(), **record})

    def log_event(self, kind: str, message: str, *, severity: Severity = "info", step: int | None = None,
                  evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        event = {"step": step, "time": time.time(), "kind": kind, "severity": severity,
                 "message": message, "evidence": evidence or {}}
        self._append(self.events_path, event)
        return event

    def log_system(self, sample: dict[str, Any]) -> None:
        self._append(self.system_path, {"time": time.time(), **sample} if "time" not in sample else sample)

    def read_metrics(self, split: str | None = None) -> list[dict[str, Any]]:
        """Every usable record (an int `step`); bad lines are skipped and named in `problems`."""
        records = run_records.read_jsonl(self.metrics_path, run_records.metric_problem, self._problem)
        return [r for r in records if split is None or r.get("split") == split]

    def read_events(self) -> list[dict[str, Any]]:
        return run_records.read_jsonl(self.events_path, run_records.event_problem, self._problem)

    def read_system(self) -> list[dict[str, Any]]:
        return run_records.read_jsonl(self.system_path, run_records.sample_problem, self._problem)

    def drop_metrics_after(self, step: int) -> None:
        """On resume: forget records past the checkpoint's step; the resumed run writes them again."""
        self.acquire_writer()
        if not self.metrics_path.exists():
            return
        keep = [r for r in self.read_metrics() if r["step"] <= step]
        with self._lock:
            atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in keep))

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        self.acquire_writer()
        line = run_records.encode(record)
        with self._lock:
            if path not in self._sealed:  # a record torn by a crash would swallow this one
                run_records.seal(path)
                self._sealed.add(path)
            run_records.append(path, line, advice=self._disk_advice())

    def _problem(self, message: str) -> None:
        if message not in self.problems:
            self.problems.append(message)
            warnings.warn(message, RunDirWarning, stacklevel=3)

    # ---- summary -----------------------------------------------------------------------------------
    def write_summary(self, summary: dict[str, Any]) -> None:
        self.acquire_writer()
        atomic_write_json(self.summary_path, summary)

    def read_summary(self) -> dict[str, Any]:
        """The summary, or {} when there is none yet or it is damaged (then named in `problems`): the
        status and timings are then unknown, but metrics, checkpoints and weights can still be read."""
        return run_status.read_summary(self.summary_path, self._problem)

    # ---- checkpoints -------------------------------------------------------------------------------
    def checkpoint_path(self, name: Literal["last", "best"] | int) -> Path:
        """`last`, `best`, or the checkpoint of an optimizer step."""
        if isinstance(name, int):
            return self.checkpoints_dir / f"{_CHECKPOINT_PREFIX}{name:08d}{_CHECKPOINT_SUFFIX}"
        return self.checkpoints_dir / f"{name}{_CHECKPOINT_SUFFIX}"

    def step_checkpoints(self) -> list[tuple[int, Path]]:
        """Step checkpoints on disk, oldest first."""
        return numbered(self.checkpoints_dir, _CHECKPOINT_PREFIX, _CHECKPOINT_SUFFIX)

    def save_checkpoint(self, step: int, write, *, is_best: bool, keep_last: int) -> Path:
        """Write the checkpoint of `step` atomically with its checksum, point `last` (and `best`) at it,
        keep the newest N. On a full disk: DiskFullError, the partial file removed, `last` untouched."""
        self.acquire_writer()
        return checkpoint_files.save(self, step, write, is_best=is_best, keep_last=keep_last)

    def latest_intact_checkpoint(self) -> CheckpointChoice:
        """The checkpoint to resume from: `last` when its checksum verifies, else the newest step checkpoint
        that does (`.notice` then says which were skipped and why). RunDirError when there is none."""
        return newest_intact(self.path, self.checkpoint_path("last"), self.step_checkpoints(), self._ledger)

    def verify(self, path: Path) -> None:
        """DamagedFileError when `path` (a checkpoint or the final weights) is not the file written there.
        A file written before checksums were recorded cannot be checked and passes."""
        problem = self._ledger.problem(path)
        if problem is not None:
            weights = {"best": self.checkpoint_path("best"), "last": self.checkpoint_path("last"),
                       "final": self.model_path}
            others = [name for name, there in weights.items() if there != path and there.exists()]
            resumable = self.has_checkpoint() and self.read_summary().get("status") != "completed"
            check_loadable(problem, path.name, damaged_file_advice(self.path, others, resumable=resumable))

    def check_free_space(self, checkpoint_bytes: int, keep_last: int) -> str | None:
        """A warning (for `train`, before training) when the disk cannot hold the checkpoints this run keeps
        at once, else None. Checkpoints already here count as space a resumed run reuses."""
        existing = list(self.checkpoints_dir.glob(f"*{_CHECKPOINT_SUFFIX}")) if self.checkpoints_dir.is_dir() else []
        existing += [directory for _, directory in self.checkpoint_dirs.steps()]  # sharded (fsdp) checkpoints
        return free_space_warning(self.path, existing, checkpoint_bytes, keep_last)

    @property
    def checkpoint_dirs(self) -> CheckpointDirs:
        """Sharded checkpoints (train.strategy=fsdp): `step-<N>/` directories, `last`/`best` symlinks."""
        return CheckpointDirs(self.checkpoints_dir, _CHECKPOINT_PREFIX, SHARDED_STATE_FILE, writer=self.acquire_writer)

    @property
    def _ledger(self) -> Ledger:
        return Ledger(self.checksums_path, self.path)

    def _disk_advice(self) -> str:
        return disk_full_advice(self.path)

    # ---- weights -----------------------------------------------------------------------------------
    def write_model(self, state_dict: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
        """The final weights as safetensors (tied weights each saved whole), written atomically with their checksum."""
        self.acquire_writer()
        data = safetensors_bytes(state_dict, metadata)
        written = atomic_write_digest(self.model_path, lambda f: f.write(data), what="the final weights",
                                      expected_bytes=len(data), advice=self._disk_advice())
        self._ledger.record({self.model_path: written})
        return written.path

    def read_model(self) -> dict[str, Any]:
        """The final weights, verified against their checksum; DamagedFileError when they are not intact."""
        if not self.model_path.exists():
            raise RunDirError(f"{self.path} has no model.safetensors: the run has not finished.")
        self.verify(self.model_path)
        return load_weights_file(self.model_path, verified=self._ledger.digest(self.model_path) is not None)
