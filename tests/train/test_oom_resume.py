"""The micro-batch an out-of-memory recovery chose is the run's from then on: a resume starts with it (no
second out-of-memory error, no second recovery) and ends where an uninterrupted run ends."""
import torch

from tests.conftest import tiny_config
from tests.train.test_oom_recovery import SPEC, OutOfMemoryAbove, _data
from trainwise.rundir.layout import RunDir
from trainwise.train.callbacks.base import Callback
from trainwise.train.loop.trainer import Trainer


class StopAfter(Callback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, trainer):
        if trainer.step == self.step:
            trainer.request_stop("signal:test")


def _trainer(run_dir, callbacks=()):
    config = tiny_config(train={"max_steps": 12, "batch_size": 32, "micro_batch_size": 32, "log_every": 3,
                                "device": "cpu", "grad_clip_norm": 1.0},
                         data={"num_workers": 0}, eval={"every_steps": None, "every_epoch": False},
                         checkpoint={"every_steps": 6})
    return Trainer(OutOfMemoryAbove(limit=8), _data(), config=config, run_dir=run_dir, callbacks=callbacks,
                   data_spec=SPEC)


def test_resume_keeps_the_recovered_micro_batch(tmp_path):
    run = RunDir.create(tmp_path / "run")
    first = _trainer(run, [StopAfter(6)])
    assert first.fit()["status"] == "stopped" and first.micro_batch_size == 8
    resumed = _trainer(RunDir(run.path))  # the config still says 32: the checkpoint's 8 wins
    assert resumed.fit(resume=True)["status"] == "completed"
    assert resumed.micro_batch_size == 8 and resumed.accumulation_steps == 4
    recoveries = [e for e in run.read_events() if e["kind"] == "oom_recovered"]
    assert [e["step"] for e in recoveries] == [1, 1]  # both in the first session, none after the resume
    straight = _trainer(RunDir.create(tmp_path / "straight"))
    straight.fit()
    for name, weight in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], weight, rtol=1e-6, atol=1e-7, msg=name)
