"""What a run tells the person afterwards: why it failed (diagnosed, traceback kept), why it stopped early,
where a resume starts."""
import io

import pytest
import torch
from rich.console import Console
from torch import nn

from tests.conftest import stop_at, tiny_config
from trainwise.data.bundle import ArrayDataset, DataSpec
from trainwise.errors import ModelCallError
from trainwise.rundir.layout import RunDir
from trainwise.train.loop.progress import ProgressDisplay
from trainwise.launch.runs import build_trainer, resume_run
from trainwise.train.loop.trainer import Trainer


class WrongDevice(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 3)

    def forward(self, x):  # the error text torch gives for tensors on two devices
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                           "cuda:0 and cpu!")


def test_a_failure_is_diagnosed_and_its_traceback_kept(tmp_path):
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))
    config = tiny_config(train={"max_steps": 3, "batch_size": 16, "device": "cpu"},
                         eval={"every_steps": None, "every_epoch": False})
    trainer = Trainer(WrongDevice(), data, config=config, run_dir=RunDir.create(tmp_path / "r"),
                      data_spec=DataSpec(input_shape=(6,), num_classes=3))
    with pytest.raises(ModelCallError):  # the model's own error, reported as the user's to fix
        trainer.fit()
    run = trainer.run_dir
    assert "Traceback" in run.error_log_path.read_text() and "forward" in run.error_log_path.read_text()
    summary = run.read_summary()
    assert summary["status"] == "failed" and "device_mismatch" in summary["message"]
    event = [e for e in run.read_events() if e["kind"] == "failed"][0]
    assert event["severity"] == "error" and event["evidence"]["code"] == "device_mismatch"


def test_early_stopping_says_why_and_which_step_was_restored(tmp_path):
    run = RunDir(tmp_path / "run")
    config = tiny_config(optim={"lr": 1e-9}, train={"max_steps": 200, "log_every": 10},
                         eval={"every_steps": 10, "early_stopping": {"enabled": True, "patience": 2}})
    trainer = build_trainer(config, run)
    run.initialise()
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["steps"] < 200
    message = summary["message"]
    assert message.startswith(f"stopped early at step {summary['steps']} of 200 (")
    assert "did not improve for 2 evaluations" in message and f"best step {summary['best']['step']}" in message


def test_resume_says_where_it_starts(tmp_path):
    run = RunDir(tmp_path / "run")
    trainer = build_trainer(tiny_config(train={"max_steps": 30, "log_every": 5}), run, [stop_at(12)])
    run.initialise()
    trainer.fit()
    out = io.StringIO()
    resume_run(run.path, [ProgressDisplay(Console(file=out, force_terminal=False, width=200))])
    assert "resuming from step 12 of 30 (epoch" in out.getvalue()


def test_the_eta_after_a_resume_comes_from_the_pace_since_then(monkeypatch):
    """Resumed at step 12 of 30, 3 steps took 3 s here: 15 steps remain, so 15 s (not 0 s as if the first
    12 steps had cost nothing)."""
    import trainwise.train.loop.progress as progress

    clock = {"now": 100.0}
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock["now"])
    out = io.StringIO()
    display = ProgressDisplay(Console(file=out, force_terminal=False, width=200))

    class Resumed:  # what the display reads of a trainer
        step, max_steps, epoch, device, precision = 12, 30, 1, "cpu", "fp32"
        run_dir = RunDir("runs/x")

    trainer = Resumed()
    display.on_fit_start(trainer)
    trainer.step, clock["now"] = 15, 103.0
    display.on_log(trainer, {"loss": 0.5, "lr": 1e-3, "samples_per_s": 100.0, "data_wait_fraction": 0.0})
    assert "eta 15s" in out.getvalue()


def test_the_outcome_lines_that_hold_a_path_are_never_cut(monkeypatch, tmp_path):
    """A narrow terminal wrapped "run directory:" away from its path (issue 35, the stop message's annoyance)."""
    import importlib

    app = importlib.import_module("trainwise.cli.app")  # the module (the package exports the Typer app by this name)
    out = io.StringIO()
    monkeypatch.setattr(app, "console", Console(file=out, width=40))
    run = tmp_path / "a-rather-long-directory-name" / "run"
    app._print_outcome({"status": "stopped", "steps": 3,
                        "message": f"stopped by SIGINT. Continue with: trainwise resume {run}"}, run)
    lines = out.getvalue().splitlines()
    assert f"run directory: {run}" in lines and any(line.endswith(f"trainwise resume {run}") for line in lines)
