"""The model's samples/s and `trainwise data bench` end to end: a prepared table against its recipe's model."""
from __future__ import annotations

import pytest

from tests.data.conftest import _write_csv
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.errors import DataError
from trainwise.check.throughput import bench_prepared


@pytest.mark.slow  # the optimizer's first import of torch._dynamo alone takes seconds
def test_bench_measures_a_prepared_table_against_its_recipe_model(tmp_path):
    rows = [[i % 7, i % 3, "a" if i % 2 else "b"] for i in range(300)]
    source = _write_csv(tmp_path / "t.csv", ["x", "label", "kind"], rows)
    prepare(source, tmp_path / "out", PrepareOptions(), workers=1)
    result = bench_prepared(tmp_path / "out", workers=["auto", 0], seconds=0.2, batch_size=32, device="cpu")
    assert set(result.loader) == {"auto", "0"} and all(rate > 0 for rate in result.loader.values())
    assert result.model > 0 and result.recipe == "table" and result.batch_size == 32
    assert "samples/s" in result.verdict.message


def test_bench_refuses_what_is_not_a_prepared_dataset(tmp_path):
    with pytest.raises(DataError, match="not a prepared dataset"):
        bench_prepared(tmp_path)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_the_model_rate_times_the_trainers_own_step(monkeypatch, task):
    """One definition of a training step: the rate `data bench` sets the loader against is TrainStep's."""
    import torch

    from tests.conftest import tiny_config
    from trainwise.data.bundle import DataSpec
    from trainwise.train.step.train_step import TrainStep
    from trainwise.check.throughput import model_rate

    calls = []
    original = TrainStep.update
    monkeypatch.setattr(TrainStep, "update", lambda self, loss: calls.append(1) or original(self, loss))
    spec = DataSpec(input_shape=(4,), num_classes=3 if task == "classification" else None, task=task)
    config = tiny_config(model={"name": "mlp", "args": {"hidden": [8]}})
    targets = torch.randint(0, 3, (16,)) if task == "classification" else torch.randn(16)
    rate = model_rate(config, spec, (torch.randn(16, 4), targets), device=torch.device("cpu"), steps=3, warmup=1)
    assert rate > 0 and len(calls) == 4
