"""The loop never waits for the device between log steps, counted on the CPU by HostSyncCounter (a
TorchFunctionMode that sees every `.item()`, `bool(t)`, `float(t)`, `.tolist()`, `.cpu()`, `.numpy()`)."""
import pytest
import torch
from torch import nn

from tests.conftest import tiny_config
from trainwise.data.bundle import ArrayDataset, DataSpec
from trainwise.rundir.layout import RunDir
from trainwise.train.loop.host_syncs import HostSyncCounter
from trainwise.train.loop.trainer import Trainer


def _run(tmp_path, precision):
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(512, 6, generator=g), torch.randint(0, 3, (512,), generator=g))
    config = tiny_config(train={"max_steps": 24, "batch_size": 32, "micro_batch_size": 16, "log_every": 8,
                                "precision": precision, "grad_clip_norm": 1.0, "device": "cpu"},
                         data={"num_workers": 0}, eval={"every_steps": None, "every_epoch": False},
                         checkpoint={"every_steps": 12})
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    counter = HostSyncCounter()
    trainer = Trainer(model, data, config=config, run_dir=RunDir.create(tmp_path / "run"),
                      callbacks=[counter.step_marker()], data_spec=DataSpec(input_shape=(6,), num_classes=3))
    with counter:
        trainer.fit()
    return counter


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_no_host_sync_between_log_steps(tmp_path, precision):
    counter = _run(tmp_path, precision)
    settle_points = {8, 12, 16, 24}  # log steps (every 8), checkpoints (every 12), the end
    between = {step: calls for step, calls in counter.by_step.items() if step and step not in settle_points}
    assert between == {}, f"host syncs between log steps: {between}"
    assert counter.syncs_between(settle_points, 24) == 0
    assert counter.by_step.get(8), "the log step reads the device (the count would be blind otherwise)"


def test_the_counter_sees_a_sync_in_a_callback(tmp_path):
    from trainwise.train.callbacks.base import Callback

    class ReadsTheLoss(Callback):  # what a user's callback might do on the hot path
        def on_step_end(self, trainer):
            float(trainer._outcome.loss)

    counter = HostSyncCounter()
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))
    config = tiny_config(train={"max_steps": 3, "batch_size": 16, "log_every": 3, "device": "cpu"},
                         data={"num_workers": 0}, eval={"every_steps": None, "every_epoch": False})
    trainer = Trainer(nn.Linear(6, 3), data, config=config, run_dir=RunDir.create(tmp_path / "run"),
                      callbacks=[ReadsTheLoss(), counter.step_marker()])
    with counter:
        trainer.fit()
    assert any("__float__" in call for call in counter.by_step.get(0, []) + counter.by_step.get(1, []))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_raises_on_any_sync_between_log_steps(tmp_path, precision):
    """On a real card, CUDA itself watches: every step that follows a step without a settle point runs under
    torch.cuda.set_sync_debug_mode("error"), which raises on any synchronising call."""
    from trainwise.train.callbacks.base import Callback

    settle_points = {8, 12, 16, 24}

    class SyncGuard(Callback):
        def on_step_end(self, trainer):  # the mode holds for what runs next: the settle work, then a step
            torch.cuda.set_sync_debug_mode("default" if trainer.step in settle_points else "error")

        def on_fit_end(self, trainer, summary):
            torch.cuda.set_sync_debug_mode("default")

    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(512, 6, generator=g), torch.randint(0, 3, (512,), generator=g))
    config = tiny_config(train={"max_steps": 24, "batch_size": 32, "micro_batch_size": 16, "log_every": 8,
                                "precision": precision, "grad_clip_norm": 1.0, "device": "cuda"},
                         eval={"every_steps": None, "every_epoch": False}, checkpoint={"every_steps": 12})
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    try:
        summary = Trainer(model, data, config=config, run_dir=RunDir.create(tmp_path / "run"),
                          callbacks=[SyncGuard()], data_spec=DataSpec(input_shape=(6,), num_classes=3)).fit()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert summary["status"] == "completed"
