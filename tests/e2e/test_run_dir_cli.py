"""A run directory as the user meets it after damage: one line and exit 2 where nothing can go on, a warning
and a result where something can, and never a traceback."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT, invoke
from trainwise.cli import app
from trainwise.errors import RunDirWarning
from trainwise.rundir.layout import RunDir

FAST = ["train.max_steps=12", "schedule.warmup_steps=2", "eval.every_steps=4", "train.log_every=3",
        "telemetry.enabled=false", "eval.early_stopping.enabled=false", "checkpoint.keep_last=2"]
pytestmark = [pytest.mark.slow,  # a training run, and `python -m trainwise` started with torch
              pytest.mark.usefixtures("wide_terminal")]  # one error line is one line, as run_cli's


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "bc"
    done = CliRunner().invoke(app, ["train", "breast-cancer", *FAST, "--out", str(out)])  # in this process
    assert done.exit_code == 0, done.output
    return out


@pytest.fixture
def run(trained, tmp_path) -> RunDir:
    copy = tmp_path / "bc"
    shutil.copytree(trained, copy)  # hard links become copies: each file keeps its own checksum entry
    return RunDir(copy)


def _one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after any progress lines of a training run
    assert last.startswith("error: ") and result.stderr.count("error: ") == 1, result.stderr
    for needle in needles:
        assert needle in last, last


def test_eval_of_a_run_whose_config_is_not_text_exits_2_in_one_line(run, capsys):
    run.config_path.write_bytes(b"\xff" + run.config_path.read_bytes())
    _one_line_error(invoke(capsys, "eval", str(run.path)), "config.yaml is damaged", "not text")


def test_eval_of_overwritten_final_weights_exits_2_in_one_line(run, capsys):
    raw = bytearray(run.model_path.read_bytes())
    raw[300:4300] = b"\xff" * 4000
    run.model_path.write_bytes(bytes(raw))
    _one_line_error(invoke(capsys, "eval", str(run.path), "--checkpoint", "final"), "model.safetensors is damaged",
                    "--checkpoint best")


def test_eval_of_a_damaged_last_uses_the_newest_intact_checkpoint_and_says_so(run, capsys):
    last = run.checkpoint_path("last")
    last.write_bytes(last.read_bytes()[:-200])
    result = invoke(capsys, "eval", str(run.path), "--checkpoint", "last", "--json")
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    # the copy made `last` a file of its own, so the step checkpoint it was linked to is still intact
    assert metrics["step"] == 12 and metrics["weights"].endswith("step-00000012.pt")
    assert any(w["kind"] == "checkpoint_fallback" and "last.pt is damaged" in w["message"]
               for w in metrics["warnings"])


def test_report_of_a_run_with_damaged_side_files_still_writes_and_lists_them(run, capsys):
    run.summary_path.write_text(run.summary_path.read_text()[:25])
    with open(run.metrics_path, "a") as f:
        f.write('{"step": "abc"}\n[1, 2, 3]\n')
    with open(run.events_path, "a") as f:
        f.write('"a string"\n')
    with pytest.warns(RunDirWarning):  # what the terminal shows besides the report
        result = invoke(capsys, "report", str(run.path), "--format", "md")
    assert result.returncode == 0 and "Traceback" not in result.stderr
    text = run.report_path("md").read_text()
    assert "summary.json is damaged" in text and "metrics.jsonl:" in text and "events.jsonl:" in text


def test_training_into_a_full_disk_fails_cleanly(tiny_disk, capsys):
    out = tiny_disk / "run"
    big = ["model.args.hidden=[256,256]", "train.max_steps=40", "eval.every_steps=5", "checkpoint.keep_last=5",
           "telemetry.enabled=false", "eval.early_stopping.enabled=false"]  # ~0.9 MB checkpoints, 3 MiB disk
    result = invoke(capsys, "train", "breast-cancer", *big, "--out", str(out))
    _one_line_error(result, "no space left on", "MiB free, a checkpoint needs", "trainwise resume")
    run = RunDir(out)
    summary = run.read_summary()
    assert summary["status"] == "failed" and "no space left on" in summary["message"]
    assert [p for p in run.checkpoints_dir.iterdir() if p.name.endswith(".tmp")] == []
    run.verify(run.checkpoint_path("last"))
    choice = run.latest_intact_checkpoint()
    assert choice.notice is None and choice.step is not None and choice.step > 0
    shutil.rmtree(out)  # the tmpfs is unmounted lazily; leave it empty


def test_a_second_resume_of_a_run_being_resumed_is_refused(trained, tmp_path, capsys):
    copy = tmp_path / "bc"
    shutil.copytree(trained, copy)
    run = RunDir(copy)
    run.config_path.write_text(run.config_path.read_text().replace("max_steps: 12", "max_steps: 1000000"))
    summary = run.read_summary()
    run.summary_path.write_text(json.dumps({**summary, "status": "stopped"}))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    first = subprocess.Popen([sys.executable, "-m", "trainwise", "resume", str(copy),
                              "--allow-config-change"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        # it holds the run, and has said so in summary.json (the refusal below comes at once, in this process)
        while (run.live_writer() is None or run.read_summary().get("status") != "running") \
                and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert run.live_writer().pid == first.pid
        second = invoke(capsys, "resume", str(copy))  # here: another process than the one that holds the run
        _one_line_error(second, f"is in use by pid {first.pid} on", "since")
        assert "still being trained" in run.liveness_note()
    finally:
        first.kill()
        first.wait()
