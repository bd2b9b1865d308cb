"""Sharded (train.strategy=fsdp) checkpoints are directories: the free-space check counts what they hold, and a
run directory holding only them is offered a resume, like one holding checkpoint files."""
from __future__ import annotations

from collections import namedtuple

import pytest

import trainwise.rundir.integrity
from trainwise.errors import RunDirError
from trainwise.rundir.layout import RunDir
from trainwise.rundir.integrity import bytes_held

MIB = 2**20
Usage = namedtuple("Usage", "total used free")


def _commit(run: RunDir, step: int, shard_bytes: int, *, is_best: bool = False):
    """A committed checkpoint directory whose shard file claims `shard_bytes` (sparse: no real disk used)."""
    dirs = run.checkpoint_dirs
    partial = dirs.begin(step)
    (partial / ".metadata").write_bytes(b"m")
    with open(partial / "__0_0.distcp", "wb") as shard:
        shard.truncate(shard_bytes)
    dirs.write_state(partial, lambda f: f.write(b"state"))
    return dirs.commit(step, is_best=is_best, keep_last=3)


def test_free_space_counts_the_shards_in_checkpoint_directories(tmp_path, monkeypatch):
    run = RunDir.create(tmp_path / "run")
    for step in (10, 20, 30):
        _commit(run, step, 100 * MIB, is_best=step == 10)
    # 120 MiB free: not enough for 5 new checkpoints of 100 MiB, enough once the 300 MiB held here are reused
    monkeypatch.setattr(trainwise.rundir.integrity.shutil, "disk_usage", lambda path: Usage(10**12, 0, 120 * MIB))
    assert run.check_free_space(checkpoint_bytes=80 * MIB, keep_last=3) is None
    warning = run.check_free_space(checkpoint_bytes=100 * MIB, keep_last=3)
    assert warning and "120 MiB free" in warning and "keeps 5 checkpoints" in warning


def test_bytes_held_counts_a_directory_named_twice_once(tmp_path):
    run = RunDir.create(tmp_path / "run")
    step = _commit(run, 10, 5 * MIB, is_best=True)
    pointer = run.checkpoints_dir / "last"  # a symlink to the same directory
    held = bytes_held([step, pointer, run.checkpoints_dir / "missing"])
    assert held == bytes_held([step]) and 5 * MIB < held < 5 * MIB + 1024


def test_a_run_holding_only_sharded_checkpoints_is_offered_a_resume(tmp_path):
    run = RunDir.create(tmp_path / "run")
    _commit(run, 10, 1024)
    run.write_summary({"status": "stopped"})
    run.release_writer()
    with pytest.raises(RunDirError, match=f"trainwise resume {run.path}"):
        RunDir.refuse_existing(run.path, overwrite=False)
