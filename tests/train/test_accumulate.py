"""Gradient accumulation: 4 micro-batches of 8 must give the update of one batch of 32."""
import torch

from tests.conftest import tiny_config
from trainwise.rundir.layout import RunDir
from trainwise.launch.runs import build_trainer


def _first_step_update(tmp_path, micro_batch_size):
    # plain SGD at constant LR: the weight change is exactly -lr * gradient
    config = tiny_config(optim={"name": "sgd", "lr": 0.1, "momentum": 0.0},
                         schedule={"decay": "constant"},
                         train={"max_steps": 1, "batch_size": 32, "micro_batch_size": micro_batch_size,
                                "grad_clip_norm": None, "log_every": 1},
                         eval={"every_steps": None, "every_epoch": False})
    trainer = build_trainer(config, RunDir(tmp_path / f"mb{micro_batch_size}"))
    trainer.run_dir.initialise()
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit()
    after = trainer.model.state_dict()
    return {k: (after[k] - before[k]) / -0.1 for k in before}


def test_four_micro_batches_of_8_equal_one_batch_of_32(tmp_path):
    accumulated = _first_step_update(tmp_path, 8)
    whole = _first_step_update(tmp_path, 32)
    assert accumulated.keys() == whole.keys()
    for name in whole:
        assert whole[name].abs().max() > 0, f"{name} got no gradient"
        torch.testing.assert_close(accumulated[name], whole[name], rtol=1e-5, atol=1e-6)


def test_accumulation_steps_follow_the_batch_sizes():
    config = tiny_config(train={"batch_size": 64, "micro_batch_size": 16})
    assert config.train.accumulation_steps == 4
