"""A full disk while writing a run: a clear error, the partial file gone, the previous checkpoint intact."""
from __future__ import annotations

import errno
import os

import pytest
import torch

import trainwise.rundir.atomic
import trainwise.rundir.records
from trainwise.errors import DiskFullError
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery.checkpoint import checkpoint_writer, read_checkpoint

NO_SPACE = r"no space left on .*checkpoints \((\d+(\.\d)?) MiB free, a checkpoint needs (\d+(\.\d)?) MiB\)"


class FullDisk:
    """Stands in for os.fdopen in atomic writes: the disk takes `room` more bytes, then raises ENOSPC."""

    def __init__(self, room: int):
        self.room = room
        self._fdopen = os.fdopen

    def __call__(self, fd, *args, **kwargs):
        return _Limited(self._fdopen(fd, *args, **kwargs), self)


class _Limited:
    def __init__(self, file, disk: FullDisk):
        self._file, self._disk = file, disk

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes > self._disk.room:
            self._file.write(view[:self._disk.room])  # a real disk takes what fits, then refuses
            self._disk.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.room -= view.nbytes
        return self._file.write(view)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((250_000,), float(step))}, "step": step}  # ~1 MB


def _leftovers(run: RunDir) -> list[str]:
    return [p.name for p in run.checkpoints_dir.iterdir() if p.name.endswith(".tmp")]


def test_enospc_inside_torch_save_is_a_clear_error_and_last_stays_loadable(tmp_path, monkeypatch):
    run = RunDir.create(tmp_path / "run")
    run.save_checkpoint(10, checkpoint_writer(_state(10)), is_best=True, keep_last=3)
    monkeypatch.setattr(trainwise.rundir.atomic.os, "fdopen", FullDisk(room=300_000))
    with pytest.raises(DiskFullError, match=NO_SPACE) as caught:
        run.save_checkpoint(20, checkpoint_writer(_state(20)), is_best=False, keep_last=3)
    needed = os.path.getsize(run.checkpoint_path(10))
    assert caught.value.needed_bytes == needed  # measured exactly, not the bytes written before the failure
    assert isinstance(caught.value.__cause__, (OSError, RuntimeError))  # torch's "unexpected pos" hides ENOSPC
    assert "trainwise resume" in str(caught.value)
    monkeypatch.undo()
    assert _leftovers(run) == [] and not run.checkpoint_path(20).exists()
    run.verify(run.checkpoint_path("last"))
    assert read_checkpoint(run.checkpoint_path("last"))["step"] == 10
    assert run.latest_intact_checkpoint().notice is None


def test_a_full_disk_while_appending_leaves_no_half_record(tmp_path, monkeypatch):
    run = RunDir.create(tmp_path / "run")
    run.log_metrics({"split": "train", "step": 1})

    def write(fd, data, _write=os.write):
        _write(fd, bytes(data)[:5])  # part of the record fits
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(trainwise.rundir.records.os, "write", write)
    with pytest.raises(DiskFullError, match="a record of metrics.jsonl needs"):
        run.log_metrics({"split": "train", "step": 2})
    monkeypatch.undo()
    run.log_metrics({"split": "train", "step": 3})
    assert [r["step"] for r in run.read_metrics()] == [1, 3] and run.problems == []


def test_checkpoints_on_a_real_full_disk(tiny_disk):
    run = RunDir.create(tiny_disk / "run")
    assert "keeps 5 checkpoints" in run.check_free_space(checkpoint_bytes=1_000_000, keep_last=3)
    saved = []
    with pytest.raises(DiskFullError, match=NO_SPACE):
        for step in range(10, 100, 10):
            run.save_checkpoint(step, checkpoint_writer(_state(step)), is_best=False, keep_last=5)
            saved.append(step)
    assert saved and _leftovers(run) == []
    run.verify(run.checkpoint_path("last"))
    assert read_checkpoint(run.checkpoint_path("last"))["step"] == saved[-1]
