"""Preemption and Ctrl-C: finish the step, checkpoint, mark the run stopped, say how to resume."""
import os
import signal

import pytest

from tests.conftest import tiny_config
from trainwise.rundir.layout import RunDir
from trainwise.train.callbacks.base import Callback
from trainwise.train.recovery.checkpoint import read_checkpoint
from trainwise.launch.runs import build_trainer, resume_run


class SendSignal(Callback):
    def __init__(self, at_step, signum, times=1):
        self.at_step, self.signum, self.times = at_step, signum, times

    def on_step_end(self, trainer):
        if trainer.step == self.at_step:
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)


def _trainer(tmp_path, callback):
    run = RunDir(tmp_path / "run")
    trainer = build_trainer(tiny_config(train={"max_steps": 40, "log_every": 5}), run, [callback])
    run.initialise()
    return trainer


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
def test_signal_stops_after_the_step_with_a_checkpoint(tmp_path, signum):
    trainer = _trainer(tmp_path, SendSignal(7, signum))
    summary = trainer.fit()
    assert summary["status"] == "stopped"
    assert summary["steps"] == 7
    assert f"trainwise resume {trainer.run_dir.path}" in summary["message"]
    assert read_checkpoint(trainer.run_dir.checkpoint_path("last"))["step"] == 7
    kinds = [e["kind"] for e in trainer.run_dir.read_events()]
    assert "signal" in kinds and "stopped" in kinds
    assert signal.getsignal(signum) is not trainer._stop._handle  # handlers restored

    resumed = resume_run(trainer.run_dir.path)
    assert resumed.read_summary()["status"] == "completed"
    assert resumed.read_summary()["steps"] == 40


def test_second_ctrl_c_aborts_at_once(tmp_path):
    trainer = _trainer(tmp_path, SendSignal(3, signal.SIGINT, times=2))
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    summary = trainer.run_dir.read_summary()
    assert summary["status"] == "stopped" and "second Ctrl-C" in summary["message"]
