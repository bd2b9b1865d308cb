"""One run directory, one writer: a second process is refused; readers see a live run; SIGKILL frees it."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import ROOT
from trainwise.errors import RunDirError, RunInUseError
from trainwise.rundir.layout import RunDir


@pytest.fixture
def other_writer(tmp_path):
    """Another process that writes tmp_path/run and keeps it; yields (run path, process). It is forked from this
    one (no interpreter start, torch already imported) and touches nothing but the run's files."""
    path = tmp_path / "run"
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other process: take the run, say so, hold it until killed
        code = 1
        try:
            os.close(ready)
            run = RunDir(path).acquire_writer()
            run.log_metrics({"split": "train", "step": 1})
            os.write(told, b"holding")
            time.sleep(120)
            code = 0
        finally:
            os._exit(code)  # never back into pytest
    os.close(told)
    proc = psutil.Process(pid)
    try:
        with os.fdopen(ready, "rb") as said:
            assert said.read(7) == b"holding"
        yield path, proc
    finally:
        if proc.is_running():  # a zombie too: killed (a no-op) and reaped
            proc.kill()
            proc.wait()


def test_a_second_process_is_refused_and_told_who_holds_the_run(other_writer):
    path, proc = other_writer
    run = RunDir(path)
    with pytest.raises(RunInUseError, match=rf"{path} is in use by pid {proc.pid} on {socket.gethostname()} since "
                                            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"):
        run.acquire_writer()
    before = run.metrics_path.read_text()
    with pytest.raises(RunInUseError):  # every write takes the lock first: nothing lands in its files
        run.log_metrics({"split": "train", "step": 2})
    with pytest.raises(RunInUseError):
        RunDir.create(path, overwrite=True)  # --overwrite never wipes a run that is being written
    assert run.metrics_path.read_text() == before


def test_readers_do_not_take_the_lock_and_see_the_run_is_live(other_writer):
    path, proc = other_writer
    reader = RunDir(path)
    assert reader.read_metrics() == [json.loads(reader.metrics_path.read_text())]
    holder = reader.live_writer()
    assert holder.pid == proc.pid and holder.host == socket.gethostname()
    reader.summary_path.write_text(json.dumps({"status": "running"}))
    assert "still being trained (by pid" in reader.liveness_note()

    proc.send_signal(signal.SIGKILL)  # the kernel drops the lock with the process: nothing stale to clean
    proc.wait()
    assert reader.live_writer() is None
    assert "no process is writing it: it was killed" in reader.liveness_note()
    reader.acquire_writer()  # and the next writer just takes it
    reader.log_metrics({"split": "train", "step": 2})
    assert [r["step"] for r in reader.read_metrics()] == [1, 2]


def test_one_process_never_locks_itself_out(tmp_path):
    first = RunDir.create(tmp_path / "run")
    first.log_metrics({"split": "train", "step": 1})
    second = RunDir(tmp_path / "run")  # train then resume in one process (tests, notebooks)
    second.log_metrics({"split": "train", "step": 2})
    assert RunDir.create(tmp_path / "run", overwrite=True).read_metrics() == []


@pytest.mark.slow  # another interpreter, importing torch
def test_the_lock_goes_with_its_last_writer_in_the_process(tmp_path):
    run = RunDir.create(tmp_path / "run")
    code = f"from trainwise.rundir.layout import RunDir; RunDir({str(run.path)!r}).acquire_writer(); print('mine')"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    held = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert held.returncode == 1 and "RunInUseError" in held.stderr
    run.release_writer()
    free = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert free.returncode == 0 and "mine" in free.stdout


def test_the_lock_file_alone_is_not_a_previous_run(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.release_writer()
    assert [p.name for p in run.path.iterdir()] == [".lock"]
    RunDir.refuse_existing(run.path, overwrite=False)  # does not raise "already holds files"
    run.log_metrics({"step": 1})
    with pytest.raises(RunDirError, match="already holds files"):
        RunDir.refuse_existing(run.path, overwrite=False)


def test_temp_files_of_a_killed_writer_are_removed_by_the_next_writer_or_an_evaluation(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.checkpoints_dir.mkdir()
    leftover = run.checkpoints_dir / ".step-00000050.pt.k2j4h1.tmp"
    leftover.write_bytes(b"half a checkpoint")
    assert run.remove_stale_temp_files() == []  # this process is the live writer: it may be mid-write
    run.release_writer()
    assert run.remove_stale_temp_files() == [leftover] and not leftover.exists()
    leftover.write_bytes(b"half a checkpoint")
    RunDir(run.path).acquire_writer()  # resume takes the lock: every temporary file is a leftover
    assert not leftover.exists()


def test_a_reader_leaves_the_temp_files_of_a_live_writer(other_writer):
    path, _ = other_writer
    in_flight = path / ".summary.json.abc123.tmp"
    in_flight.write_text("{}")
    assert RunDir(path).remove_stale_temp_files() == [] and in_flight.exists()
