"""The engine on the GPU's terms: what replaced the per-step host checks still catches what they caught,
validation cannot OOM for want of sizing, ranks land on their own cards, worker randomness resumes exactly,
and a signal can never deadlock the loop."""
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.conftest import stop_at, ROOT, tiny_config
from trainwise.data.bundle import ArrayDataset, DataSpec
from trainwise.errors import ConfigError, TrainingError
from trainwise.rundir.layout import RunDir
from trainwise.runtime.device import resolve_device
from trainwise.runtime.inference import predict
from trainwise.train.loop.health import FP16_MAX_SKIPS_IN_A_ROW
from trainwise.train.loop.trainer import Trainer

SPEC = DataSpec(input_shape=(6,), num_classes=3)


def _data(n=256):
    g = torch.Generator().manual_seed(0)
    return ArrayDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def _config(**train):
    return tiny_config(train={"max_steps": 60, "batch_size": 16, "log_every": 5, "device": "cpu", **train},
                       eval={"every_steps": None, "every_epoch": False})


def test_fp16_that_keeps_overflowing_stops_instead_of_completing(tmp_path):
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    model[0].weight.register_hook(lambda grad: grad * float("inf"))  # every backward overflows
    trainer = Trainer(model, _data(), config=_config(precision="fp16"), run_dir=RunDir.create(tmp_path / "r"),
                      data_spec=SPEC)
    with pytest.raises(TrainingError, match="in a row") as error:
        trainer.fit()
    assert "bf16" in str(error.value) and "optim.lr" in str(error.value)
    assert trainer.step == 20  # the log step where the streak reached 20
    assert trainer.run_dir.read_summary()["status"] == "failed"
    event = [e for e in trainer.run_dir.read_events() if e["kind"] == "nonfinite"][0]
    assert event["evidence"]["longest_skip_streak"] >= FP16_MAX_SKIPS_IN_A_ROW


def test_fp16_with_a_few_overflows_still_completes(tmp_path):
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    calls = {"n": 0}

    def poison_some(grad):
        calls["n"] += 1
        return grad * float("inf") if calls["n"] <= FP16_MAX_SKIPS_IN_A_ROW - 2 else grad

    model[0].weight.register_hook(poison_some)
    trainer = Trainer(model, _data(), config=_config(precision="fp16"), run_dir=RunDir.create(tmp_path / "r"),
                      data_spec=SPEC)
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["skipped_steps"] == FP16_MAX_SKIPS_IN_A_ROW - 2


class OutOfMemoryAbove(nn.Module):
    """Raises the allocator's error for batches larger than `limit`, as a card would."""

    def __init__(self, limit):
        super().__init__()
        self.limit, self.linear = limit, nn.Linear(6, 3)

    def forward(self, x):
        if len(x) > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate for {len(x)} samples")
        return self.linear(x)


def test_prediction_halves_the_batch_on_out_of_memory_and_keeps_the_order():
    data = _data(100)
    model = OutOfMemoryAbove(limit=12)
    outputs, targets = predict(model, data, device="cpu", batch_size=64)
    assert len(outputs) == 100 and torch.equal(targets, data.targets)
    torch.testing.assert_close(outputs, model.linear(data.inputs).detach())


def test_validation_batch_is_sized_from_training_not_a_floor_of_256(tmp_path):
    model = OutOfMemoryAbove(limit=40)  # training micro-batches of 16 fit; 256 would not
    config = tiny_config(train={"max_steps": 4, "batch_size": 16, "log_every": 2, "device": "cpu"},
                         eval={"every_steps": 2, "every_epoch": False})
    trainer = Trainer(model, _data(), _data(90), config=config, run_dir=RunDir.create(tmp_path / "r"),
                      data_spec=SPEC)
    assert trainer.eval_batch_size == 32
    assert trainer.fit()["status"] == "completed"


def test_each_torchrun_rank_trains_on_its_local_card(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for name in ("auto", "cuda", "cuda:0"):
        assert resolve_device(name, local_rank=3) == torch.device("cuda", 3)
    with pytest.raises(ConfigError, match="LOCAL_RANK"):
        resolve_device("cuda:2", local_rank=3)
    assert resolve_device("cuda:2") == torch.device("cuda", 2)  # one process: as asked


class NoisyDataset(Dataset):
    """Random noise drawn in __getitem__, as random augmentations do, in loader workers."""

    def __init__(self, n=96):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(6), self.y[i] + 0 * torch.randint(0, 5, ())


def _worker_run(path, callbacks=(), resume=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    config = tiny_config(train={"max_steps": 20, "batch_size": 16, "log_every": 5, "device": "cpu"},
                         data={"num_workers": 2}, eval={"every_steps": None, "every_epoch": False})
    run = RunDir.open(path) if resume else RunDir.create(path)
    trainer = Trainer(model, NoisyDataset(), config=config, run_dir=run, callbacks=callbacks, data_spec=SPEC)
    trainer.fit(resume=resume)
    return model.state_dict()


@pytest.mark.slow
def test_random_transforms_in_loader_workers_resume_bit_identical(tmp_path):
    straight = _worker_run(tmp_path / "straight")
    _worker_run(tmp_path / "stopped", [stop_at(9)])  # mid-epoch: 6 steps per epoch
    resumed = _worker_run(tmp_path / "stopped", resume=True)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


SIGNAL_IN_LOG_WRITE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from tests.conftest import tiny_config
    from trainwise.rundir.layout import RunDir
    from trainwise.launch.runs import build_trainer

    class LockThatSignals:
        # the run directory's lock; SIGTERM arrives just after its 6th acquisition, while it is held
        def __init__(self, lock):
            self.lock, self.entered = lock, 0

        def __enter__(self):
            self.lock.acquire()
            self.entered += 1
            if self.entered == 6:
                os.kill(os.getpid(), signal.SIGTERM)
            return self

        def __exit__(self, *exc):
            self.lock.release()

    run = RunDir({out!r})
    trainer = build_trainer(tiny_config(train={{"max_steps": 40, "log_every": 1}},
                                        eval={{"every_steps": None}}), run)
    run.initialise()
    run._lock = LockThatSignals(run._lock)
    print(trainer.fit()["status"], trainer.step)
""")


def test_a_signal_inside_a_log_write_stops_the_run_instead_of_deadlocking(tmp_path):
    script = SIGNAL_IN_LOG_WRITE.format(root=str(ROOT), out=str(tmp_path / "run"))
    # the old handler logged through the same non-reentrant lock and waited on itself for ever
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    status, step = done.stdout.split()[-2:]
    assert status == "stopped" and 0 < int(step) < 40
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["steps"] == int(step)
    assert (tmp_path / "run" / "checkpoints").is_dir()
