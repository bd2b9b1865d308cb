"""Bad values a user can hand trainwise get a message naming them (issue 17, point 7), not a torch traceback
or a run that 'completes' having learnt nothing."""
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import tiny_config
from trainwise.data.bundle import ArrayDataset, DataBundle, DataSpec, check_labels
from trainwise.check.sanity import sanity_check
from trainwise.errors import DataError, TrainingError
from trainwise.rundir.layout import RunDir
from trainwise.train.callbacks.early_stop import EarlyStopping
from trainwise.train.loop.health import StepHealth, health_problem
from trainwise.train.callbacks.nonfinite_validation import NonFiniteValidation
from trainwise.train.step.train_step import StepOutcome
from trainwise.train.loop.trainer import Trainer

SPEC = DataSpec(input_shape=(4,), num_classes=2)


def _points(rows=256, seed=0):
    x = torch.randn(rows, 4, generator=torch.Generator().manual_seed(seed))
    return x, (x.sum(dim=1) > 0).long()


def _fit(tmp_path, train_data, val_data, *, spec=SPEC, callbacks=(), **sections):
    config = tiny_config(train={"sanity": False, "max_steps": 20, "log_every": 5, **sections.pop("train", {})},
                         **sections)
    trainer = Trainer(nn.Linear(4, spec.num_classes or 1), train_data, val_data, config=config, data_spec=spec,
                      run_dir=RunDir(tmp_path / "run").initialise(), callbacks=list(callbacks))
    return trainer.fit(), trainer.run_dir


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int8])
def test_narrow_integer_labels_train_as_class_indices(tmp_path, dtype):
    x, y = _points()
    train = ArrayDataset(x, y.to(dtype))
    assert train.targets.dtype == torch.int64
    summary, _ = _fit(tmp_path, train, ArrayDataset(x[:64], y[:64].to(dtype)))
    assert summary["status"] == "completed" and summary["steps"] == 20


def test_narrow_integer_labels_of_another_dataset_are_named():
    x, y = _points()

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return x[i], y[i].int()

    with pytest.raises(DataError, match="train split: class labels are int32.*torch.long"):
        check_labels(DataBundle(Pairs(), None, None, spec=SPEC))


def test_a_bundle_without_a_train_split_is_named():
    with pytest.raises(DataError, match=r"DataBundle\(train=None\): the train split is required"):
        DataBundle(train=None, val=None, test=None, spec=SPEC)
    with pytest.raises(DataError, match=r"DataBundle\(val=...\): a PosixPath is not a dataset"):
        DataBundle(ArrayDataset(*_points()), Path("val.csv"), None, spec=SPEC)


def test_nan_never_counts_for_early_stopping():
    stop = EarlyStopping("min", patience=2)
    assert not stop.update(math.nan, 5) and not stop.update(math.nan, 10) and not stop.update(math.nan, 15)
    assert stop.best is None and not stop.should_stop  # three NaN evaluations are no reason to stop
    assert stop.update(0.7, 20) and stop.best == 0.7 and stop.best_step == 20
    assert not stop.update(math.nan, 25) and stop.evals_without_improvement == 0


def _unless_default():
    """NonFiniteValidation, when the Trainer does not already add it to every run."""
    from trainwise.train.callbacks.defaults import default_callbacks as _default_callbacks

    wired = any(isinstance(c, NonFiniteValidation) for c in _default_callbacks(tiny_config()))
    return [] if wired else [NonFiniteValidation()]


def test_an_all_nan_validation_set_keeps_training_and_says_so(tmp_path):
    x, y = _points()
    val_x = torch.full((64, 4), math.nan)
    summary, run = _fit(tmp_path, ArrayDataset(x, y), ArrayDataset(val_x, y[:64]), callbacks=_unless_default(),
                        eval={"every_steps": 5, "early_stopping": {"enabled": True, "patience": 2}})
    assert summary["steps"] == 20  # early stopping did not end it at step 10 with no best
    warnings = [e for e in run.read_events() if e["kind"] == "nonfinite_validation"]
    assert len(warnings) == 1 and warnings[0]["severity"] == "warning"  # once, not at every evaluation
    assert "val/loss" in warnings[0]["message"] and warnings[0]["evidence"]["monitor"] == "val/loss"
    assert "val/loss is the monitored metric" in warnings[0]["message"]


def test_a_nan_regression_target_is_named_by_the_sanity_checks():
    x = torch.randn(300, 30)
    y = x[:, 0].clone()
    y[[4, 9]] = math.nan
    spec = DataSpec(input_shape=(30,), num_classes=None, task="regression")
    bundle = DataBundle(ArrayDataset(x[:200], y[:200]), ArrayDataset(x[200:], y[200:]), None, spec=spec)
    findings = sanity_check(tiny_config(eval={"monitor": "val/mae"}), bundle)
    [finding] = [f for f in findings if f.code == "nonfinite_targets"]
    assert finding.severity == "error" and finding.evidence["train"] == {"rows": 2, "first_rows": [4, 9]}
    assert "targets contain NaN" in finding.title


def test_a_nan_target_in_a_step_is_named_in_the_health_failure():
    health = StepHealth(torch.device("cpu"))
    nan = torch.tensor(math.nan)
    ok = StepOutcome(loss=torch.tensor(0.5), grad_norm=torch.tensor(1.0), skipped=torch.tensor(0.0))
    health.record(1, StepOutcome(loss=nan, grad_norm=nan, skipped=torch.tensor(1.0)),
                  [(torch.randn(8, 3), torch.tensor([1.0, math.nan, 2.0, 0.0, 1.0, 1.0, 1.0, 1.0]))])
    health.record(2, ok, [(torch.randn(8, 3), torch.ones(8))])
    reading = health.read()
    assert reading.nonfinite_target_steps == 1
    problem = health_problem(reading, fp16=False, step=2, loss_scale=1.0)
    assert problem.startswith("the targets contain NaN or Inf") and "first at step 1" in problem
    # the same NaN loss with finite targets keeps the optimisation advice
    health.record(3, StepOutcome(loss=nan, grad_norm=nan, skipped=torch.tensor(1.0)), [(torch.randn(8, 3), torch.ones(8))])
    assert "Lower optim.lr" in health_problem(health.read(), fp16=False, step=3, loss_scale=1.0)


# ---- through the Trainer's own hooks ------------------------------------------------------------------------


def test_a_run_with_a_nan_regression_target_fails_naming_the_targets(tmp_path):
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))
    y = x.sum(dim=1)
    y[3] = math.nan  # in the first batch of the first epoch's order or not, some step meets it
    spec = DataSpec(input_shape=(4,), num_classes=None, task="regression")
    with pytest.raises(TrainingError, match="the targets contain NaN"):
        _fit(tmp_path, ArrayDataset(x, y), ArrayDataset(x[:64], y[:64] * 0), spec=spec,
             train={"log_every": 1, "max_steps": 8}, eval={"monitor": "val/mae"})


def test_every_run_warns_of_a_nan_validation_set(tmp_path):
    x, y = _points()
    _, run = _fit(tmp_path, ArrayDataset(x, y), ArrayDataset(torch.full((64, 4), math.nan), y[:64]),
                  eval={"every_steps": 5})
    assert any(e["kind"] == "nonfinite_validation" for e in run.read_events())


def test_a_label_beyond_the_models_outputs_is_named_with_both_numbers_and_no_traceback(tmp_path):
    from trainwise.errors import ModelCallError

    x, _ = _points()
    labels = torch.arange(len(x)) % 5  # five classes, a model with two outputs
    with pytest.raises(ModelCallError) as caught:
        _fit(tmp_path, ArrayDataset(x, labels), None)
    message = str(caught.value)
    assert "out of range" in message and "which has 2 outputs" in message and "num_classes" in message
    assert "Traceback" not in message
