"""Diagnosis while training: the run rules name a problem in events.jsonl while the run goes on; a healthy
run stays silent; the sanity checks run before `train` and stop a run that cannot learn."""
import pytest
import torch

from trainwise.data.bundle import ArrayDataset, DataBundle, DataSpec

from tests.conftest import tiny_config
from trainwise.errors import DataError
from trainwise.rundir.layout import RunDir
from trainwise.launch.runs import build_trainer


def _fit(tmp_path, **sections):
    run = RunDir(tmp_path / "run")
    trainer = build_trainer(tiny_config(**sections), run)
    run.initialise()
    trainer.fit()
    return run


def test_a_flat_loss_is_named_during_the_run(tmp_path):
    run = _fit(tmp_path, optim={"lr": 1e-9}, train={"max_steps": 60, "log_every": 5, "sanity": False},
               eval={"every_steps": 30, "early_stopping": {"enabled": False}})
    diagnosed = [e for e in run.read_events() if e["kind"] == "diagnosis"]
    assert [e["evidence"]["code"] for e in diagnosed] == ["loss_flat"]  # named once, not every check
    assert diagnosed[0]["severity"] == "warning" and diagnosed[0]["step"] <= 60


def test_a_healthy_run_has_no_live_finding(tmp_path):
    run = _fit(tmp_path, train={"max_steps": 60, "log_every": 5})
    assert [e for e in run.read_events() if e["kind"] == "diagnosis"] == []


def nan_inputs(seed: int):
    """A data factory whose training inputs hold NaN: no model can learn from them."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(200, 5, generator=g), torch.randint(0, 2, (200,), generator=g)
    x[7, 2] = float("nan")
    spec = DataSpec(input_shape=(5,), num_classes=2)
    return DataBundle(ArrayDataset(x[:160], y[:160]), ArrayDataset(x[160:], y[160:]), None, spec=spec)


def test_train_runs_the_sanity_checks_first_and_refuses_what_cannot_learn(tmp_path):
    data = {"name": None, "factory": "tests.train.test_live_diagnosis:nan_inputs"}
    with pytest.raises(DataError, match="train.sanity=false"):
        build_trainer(tiny_config(data=data), RunDir(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # nothing written
    trainer = build_trainer(tiny_config(data=data, train={"sanity": False}), RunDir(tmp_path / "run"))
    assert trainer.max_steps == 30  # the check is the user's to turn off
