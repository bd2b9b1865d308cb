"""The loop never waits for the device between log steps.

Counted on the CPU with a TorchFunctionMode that sees every Tensor method call: `.item()`, `bool(t)`,
`float(t)`, `.tolist()`, `.cpu()`, `.numpy()` on a tensor are the host syncs of a CUDA run. Calls made by
the data path (the sampler's index permutation lives on the host by nature) are not syncs and are left
out by looking at who called."""
import traceback

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tests.conftest import tiny_config
from trainwise.data.bundle import ArrayDataset, DataSpec
from trainwise.run import RunDir
from trainwise.train.callbacks import Callback
from trainwise.train.trainer import Trainer

SYNCS = {torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
         torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy}
HOST_SIDE = ("trainwise/train/sampler.py", "torch/utils/data/")


class CountSyncs(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.step = 0
        self.at_step: dict[int, list[str]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in SYNCS:
            stack = traceback.extract_stack(limit=12)
            if not any(h in frame.filename for frame in stack for h in HOST_SIDE):
                caller = next((f for f in reversed(stack[:-1]) if "trainwise" in f.filename), stack[-2])
                self.at_step.setdefault(self.step, []).append(f"{func.__name__} at {caller.filename}:"
                                                             f"{caller.lineno}")
        return func(*args, **(kwargs or {}))


class StepCounter(Callback):
    def __init__(self, mode):
        self.mode = mode

    def on_step_end(self, trainer):
        self.mode.step = trainer.step  # syncs from here on are charged to the step just ended


def _run(tmp_path, precision, **train):
    g = torch.Generator().manual_seed(0)
    data = ArrayDataset(torch.randn(512, 6, generator=g), torch.randint(0, 3, (512,), generator=g))
    config = tiny_config(train={"max_steps": 24, "batch_size": 32, "micro_batch_size": 16, "log_every": 8,
                                "precision": precision, "grad_clip_norm": 1.0, "device": "cpu", **train},
                         data={"num_workers": 0}, eval={"every_steps": None, "every_epoch": False},
                         checkpoint={"every_steps": 12})
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 3))
    mode = CountSyncs()
    trainer = Trainer(model, data, config=config, run_dir=RunDir.create(tmp_path / "run"),
                      callbacks=[StepCounter(mode)], data_spec=DataSpec(input_shape=(6,), num_classes=3))
    with mode:
        trainer.fit()
    return mode.at_step


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_no_host_sync_between_log_steps(tmp_path, precision):
    syncs = _run(tmp_path, precision)
    settle_points = {8, 12, 16, 24}  # log steps (every 8), checkpoints (every 12), the end
    between = {step: calls for step, calls in syncs.items() if 0 < step and step not in settle_points}
    assert between == {}, f"host syncs between log steps: {between}"
    assert syncs.get(8), "the log step reads the device (the count would be blind otherwise)"
