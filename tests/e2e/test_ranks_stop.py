"""Ctrl-C (or a scheduler's SIGTERM) to `trainwise train --nproc N` stops the job as it stops one process: the
launcher passes the signal on, every rank finishes its step and checkpoints, and the job exits 75 with rank 0's
outcome and the command that continues it on as many ranks, never a torch traceback (issue 35)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ONE_THREAD, ROOT, finish_job
from trainwise.launch.torchrun import exit_code_after_signal
from trainwise.train.parallel.distributed import resume_command

LONG = ["digits", "train.max_steps=5000", "train.epochs=null", "schedule.warmup_steps=0",
        "schedule.warmup_fraction=null", "train.log_every=2", "eval.every_steps=null", "eval.every_epoch=false",
        "eval.early_stopping.enabled=false", "telemetry.enabled=false", "train.sanity=false"]


def logged_steps(out) -> int:
    metrics = out / "metrics.jsonl"
    return metrics.read_text().count('"split": "train"') if metrics.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_stops_the_ranks_and_exits_75(tmp_path, sig):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "60", **ONE_THREAD}  # a narrow terminal
    job = subprocess.Popen([sys.executable, "-m", "trainwise", "train", *LONG, "--out", str(out), "--nproc", "2"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    deadline = time.monotonic() + 120
    while logged_steps(out) < 2 and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    job.send_signal(sig)  # the launcher only, as a terminal's Ctrl-C reaches it (the ranks run in sessions of their own)
    code, output = finish_job(job)
    assert code == 75, output[-3000:]
    assert "Traceback" not in output and "SignalException" not in output, output[-3000:]
    hint = [line for line in output.splitlines() if "Continue with:" in line]
    assert len(hint) == 1 and hint[0].endswith(f"trainwise resume {out} --nproc 2"), output[-3000:]


def test_the_resume_command_carries_the_launch(monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert resume_command("runs/a") == "trainwise resume runs/a"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert resume_command("runs/a") == "trainwise resume runs/a --nproc 4"
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert resume_command("runs/a").startswith("trainwise resume runs/a --nproc 4 --nnodes 2 --node-rank I "
                                               "--rdzv-endpoint HOST:PORT")


def test_the_exit_code_after_a_signal_follows_what_rank_0_recorded(tmp_path):
    assert exit_code_after_signal(signal.SIGINT, tmp_path) == 130  # stopped before any step was kept
    assert exit_code_after_signal(signal.SIGTERM, tmp_path) == 143
    (tmp_path / "summary.json").write_text('{"status": "stopped", "updated": 1000.0}')
    assert exit_code_after_signal(signal.SIGTERM, tmp_path, since=999.0) == 75
    assert exit_code_after_signal(signal.SIGTERM, tmp_path, since=1001.0) == 143  # an earlier run's summary
