import pickle
import random

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config
from trainwise.errors import RunDirError
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery.checkpoint import capture_rng, read_checkpoint, restore_rng
from trainwise.launch.runs import build_trainer


def test_checkpoints_hold_everything_and_keep_n(tmp_path):
    config = tiny_config(train={"max_steps": 30, "log_every": 5}, eval={"every_steps": 5},
                         checkpoint={"keep_last": 2})
    run = RunDir(tmp_path / "run")
    trainer = build_trainer(config, run)
    run.initialise()
    trainer.fit()
    assert [step for step, _ in run.step_checkpoints()] == [25, 30]
    state = read_checkpoint(run.checkpoint_path("last"))
    assert set(state) >= {"model", "optimizer", "scheduler", "scaler", "early_stopping", "rng",
                          "data_position", "step", "epoch"}
    assert state["step"] == 30
    assert state["data_position"] == {"epoch": trainer.epoch, "batch": trainer.batch_in_epoch}
    assert read_checkpoint(run.checkpoint_path("best"))["step"] == trainer.early_stopping.best_step
    leftovers = [p.name for p in run.checkpoints_dir.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


class Boom:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickled!')",))


def test_a_checkpoint_is_never_unpickled_blindly(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "model": Boom()}, path)  # torch.save pickles it
    with pytest.raises(RunDirError, match="cannot be read"):
        read_checkpoint(path)


def test_a_truncated_checkpoint_is_named(tmp_path):
    path = tmp_path / "cut.pt"
    torch.save({"format_version": 1, "model": {"w": torch.ones(1000)}}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(RunDirError, match="cut.pt"):
        read_checkpoint(path)


def test_rng_states_round_trip():
    state = capture_rng()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    # and the saved form needs no pickle beyond tensors and plain containers
    pickle.dumps(state)
