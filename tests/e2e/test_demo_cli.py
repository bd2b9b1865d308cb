"""`trainwise demo` exits like `train`: 0 completed (evaluated, reported), 75 stopped by a signal (resumable,
not evaluated), 130 aborted by a second Ctrl-C."""
import json
import os
import signal

import pytest

import trainwise.cli.demo as demo_module
from tests.conftest import invoke
from trainwise.recipes import load_recipe
from trainwise.train.callbacks.base import Callback

SMALL = ["train.max_steps=20", "schedule.warmup_steps=2", "eval.every_steps=10", "train.log_every=5",
         "telemetry.enabled=false", "model.args.channels=[4,8]", "model.args.hidden=16"]


class SignalAt(Callback):
    """Sends this process real signals after a given step, as a scheduler or a user at the terminal would."""

    def __init__(self, step: int, *signals: int):
        self.step, self.signals = step, signals

    def on_step_end(self, trainer):
        if trainer.step == self.step:
            for sig in self.signals:
                os.kill(os.getpid(), sig)


@pytest.fixture
def small_demo(monkeypatch):
    """The demo on a smaller digits model, with `signals` sent after step 3."""
    sent: list[int] = []
    real_train_run = demo_module.train_run
    monkeypatch.setattr(demo_module, "load_recipe", lambda name: load_recipe(name, SMALL))
    monkeypatch.setattr(demo_module, "train_run", lambda config, out, overwrite=False: real_train_run(
        config, out, overwrite=overwrite, callbacks=[SignalAt(3, *sent)] if sent else []))
    return sent


@pytest.mark.slow
def test_demo_completes_evaluates_and_exits_0(tmp_path, capsys, small_demo):
    out = tmp_path / "demo"
    result = invoke(capsys, "demo", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "test accuracy" in result.stdout and (out / "report.html").is_file()


def test_demo_stopped_by_sigterm_exits_75_says_how_to_resume_and_evaluates_nothing(tmp_path, capsys, small_demo):
    small_demo.append(signal.SIGTERM)
    out = tmp_path / "demo"
    result = invoke(capsys, "demo", "--out", str(out))
    assert result.returncode == 75, (result.stdout, result.stderr)
    said = " ".join(result.stdout.split())  # as read, not as wrapped at 80 columns
    assert "stopped by SIGTERM after step 3" in said and f"trainwise resume {out}" in said
    assert json.loads((out / "summary.json").read_text())["status"] == "stopped"
    assert not (out / "eval").exists() and not (out / "report.html").exists()


def test_demo_aborted_by_a_second_ctrl_c_exits_130(tmp_path, capsys, small_demo):
    small_demo += [signal.SIGINT, signal.SIGINT]
    out = tmp_path / "demo"
    result = invoke(capsys, "demo", "--out", str(out))
    assert result.returncode == 130, (result.stdout, result.stderr)
    assert "aborted by a second Ctrl-C" in result.stdout
