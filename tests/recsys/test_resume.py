"""A click model stopped mid-run and resumed ends with the same weights, bit for bit, as one trained straight
through: its sampled negatives, dropout and data order all pick up where they were."""
import torch
from safetensors.torch import load_file

from trainwise.recipes import load_recipe
from trainwise.train.callbacks.base import Callback
from trainwise.launch.runs import resume_run, train_run

OVERRIDES = ["data.args.users=120", "data.args.items=80", "data.args.events=3000", "data.args.categories=4",
             "data.args.negatives=3", "model.args.dropout=0.2", "train.max_steps=24", "train.batch_size=32",
             "eval.every_steps=8", "checkpoint.every_steps=8", "eval.early_stopping.enabled=false",
             "telemetry.enabled=false", "train.sanity=false"]


class StopAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer) -> None:
        if trainer.step == self.step:
            trainer.request_stop("test")


def test_stopped_and_resumed_din_matches_a_straight_run(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = load_recipe("shop-din", OVERRIDES)
        train_run(config, tmp_path / "straight")
        stopped = train_run(config, tmp_path / "stopped", callbacks=[StopAt(11)])  # mid-epoch, off a checkpoint
        assert stopped.read_summary()["status"] == "stopped"
        resume_run(tmp_path / "stopped")
    finally:
        torch.set_num_threads(threads)
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "stopped" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
