"""Sanity checks before training: each fault injected into real data (or the model) is found with its
numbers; the built-in recipes pass (benchmarks/sanity_check.py times them)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import tiny_config
from trainwise.data.bundle import ArrayDataset, DataBundle
from trainwise.check.sanity import sanity_check
from trainwise.diagnose.sanity_data import SplitData, data_findings
from trainwise.check.overfit_one_batch import overfit_one_batch
from trainwise.recipes import load_recipe
from trainwise.recipes.factories import build_data


def _codes(findings):
    return [f.code for f in findings]


def _only(findings, code):
    [found] = [f for f in findings if f.code == code]
    return found


def _problems(findings):
    return [f for f in findings if f.severity != "info"]


def _bundle(change) -> DataBundle:
    """The breast-cancer splits as tensors, with `change(splits)` applied (a dict name -> [inputs, targets])."""
    real = build_data(tiny_config())
    splits = {name: [getattr(real, name).inputs.clone(), getattr(real, name).targets.clone()]
              for name in ("train", "val", "test")}
    change(splits)
    return DataBundle(*(ArrayDataset(*splits[name]) for name in ("train", "val", "test")), spec=real.spec)


@pytest.mark.parametrize("recipe", ["breast-cancer", "digits"])
def test_the_built_in_recipes_pass_with_a_40_step_probe(recipe):
    # the checks' cost is their work, counted here (one 40-step probe); their seconds are
    # benchmarks/sanity_check.py's (a timing in a test fails on a busy machine, not on a slow change)
    findings = sanity_check(load_recipe(recipe))
    assert _problems(findings) == [], [f.to_dict() for f in findings]
    probe = _only(findings, "overfit_probe")
    assert probe.evidence["share_kept"] < 0.5 and probe.evidence["steps"] == 40
    assert _only(findings, "label_distribution").evidence["counts"]["train"]


def test_nan_inputs_are_an_error_naming_the_rows():
    def poison(splits):
        splits["train"][0][[3, 7], 5] = float("nan")
        splits["test"][0][0, 0] = float("inf")
    finding = _only(sanity_check(tiny_config(), _bundle(poison)), "nonfinite_inputs")
    assert finding.severity == "error"
    assert finding.evidence["train"] == {"rows": 2, "first_rows": [3, 7]} and finding.evidence["test"]["rows"] == 1


def test_train_rows_copied_into_test_are_leakage():
    def leak(splits):
        splits["test"][0][:20] = splits["train"][0][:20]
    finding = _only(sanity_check(tiny_config(), _bundle(leak)), "train_test_leakage")
    assert finding.severity == "error" and finding.evidence["test"]["rows"] == 20
    assert finding.evidence["test"]["first_rows"] == [0, 1, 2, 3, 4] and "val" not in finding.evidence


def test_labels_all_one_class_are_an_error_even_though_the_probe_fits_them():
    def one_class(splits):
        for split in splits.values():
            split[1][:] = 0
    findings = sanity_check(tiny_config(), _bundle(one_class))
    finding = _only(findings, "single_class_labels")
    assert finding.severity == "error" and findings[0].code == "single_class_labels"
    assert finding.evidence["rows"] == len(build_data(tiny_config()).train)


def test_extreme_imbalance_and_a_class_missing_from_val():
    targets = torch.zeros(420, dtype=torch.long)
    targets[:10] = 1
    inputs = torch.randn(420, 4)
    splits = [SplitData("train", inputs, targets),
              SplitData("val", torch.randn(30, 4), torch.zeros(30, dtype=torch.long))]
    findings = data_findings(splits, num_classes=2, class_names=("ok", "fault"))
    imbalance = _only(findings, "class_imbalance")
    assert imbalance.evidence["ratio"] == 41 and imbalance.evidence["minority_class"] == "fault"
    assert _only(findings, "classes_missing_from_split").evidence["missing"] == {"val": ["fault"]}


def test_constant_and_unscaled_features():
    def raw(splits):
        for split in splits.values():
            split[0][:, 2] = 1.0
            split[0][:, 4] = split[0][:, 4] * 1000 + 5000
    findings = sanity_check(tiny_config(), _bundle(raw))
    assert _only(findings, "constant_features").evidence["features"] == [2]
    unscaled = _only(findings, "unnormalised_inputs")
    assert unscaled.severity == "warn" and unscaled.evidence["feature"] == 4 and unscaled.evidence["max_abs"] > 1000


class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(30, 2)

    def forward(self, x):
        return self.layer(x).detach()


def _batch():
    data = build_data(tiny_config())
    return data.train.inputs[:32], data.train.targets[:32]


def _loss(outputs, targets):
    return nn.functional.cross_entropy(outputs.float(), targets)


def test_the_probe_catches_a_detached_output():
    model = Detached()
    finding = overfit_one_batch(model, *_batch(), optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                loss_fn=_loss)
    assert finding.code == "overfit_probe_failed" and finding.severity == "error"
    assert "does not require grad" in finding.evidence["error"] and ".detach()" in finding.fixes[0]


def test_the_probe_catches_a_learning_rate_of_zero():
    model = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2))
    finding = overfit_one_batch(model, *_batch(), optimizer=torch.optim.AdamW(model.parameters(), lr=0.0),
                                loss_fn=_loss)
    assert finding.code == "overfit_probe_failed" and finding.evidence["share_kept"] == pytest.approx(1.0)
    assert finding.evidence["lr"] == 0.0 and finding.evidence["largest_weight_change"] == 0.0
    # the same model with a working LR memorises the batch
    working = overfit_one_batch(model, *_batch(), optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                loss_fn=_loss)
    assert working.code == "overfit_probe" and working.evidence["share_kept"] < 0.5


def test_the_probe_calls_a_low_lr_slow_not_broken():
    finding = _only(sanity_check(tiny_config(optim={"lr": 1e-4})), "overfit_probe_slow")
    assert finding.severity == "warn" and 0.5 < finding.evidence["share_kept"] < 1
    assert finding.evidence["largest_weight_change"] > 0 and "optim.lr" in finding.fixes[0]


def test_an_optimizer_holding_other_parameters_is_broken_wiring():
    model = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2))
    elsewhere = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=1e-2)
    finding = overfit_one_batch(model, *_batch(), optimizer=elsewhere, loss_fn=_loss)
    assert finding.code == "overfit_probe_failed" and "not one weight changed" in finding.title


def test_the_check_leaves_the_random_state_alone_and_train_refuses_errors():
    from trainwise.check.sanity import raise_for_errors
    from trainwise.errors import DataError

    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    findings = sanity_check(tiny_config())
    assert torch.equal(torch.rand(3), expected)
    raise_for_errors(findings)  # info only: passes

    def leak(splits):
        splits["test"][0][:] = splits["train"][0][: len(splits["test"][0])]
    with pytest.raises(DataError, match="(?s)train_test_leakage.*train.sanity=false"):
        raise_for_errors(sanity_check(tiny_config(), _bundle(leak)))


def test_a_loss_of_zero_from_the_start_is_nothing_to_learn_not_a_loss_that_became_zero():
    # one class and one output: cross-entropy is 0 whatever the weights (issue 28: "cannot overfit one batch:
    # the loss became 0.0" contradicted itself)
    model = nn.Linear(30, 1)
    inputs, _ = _batch()
    finding = overfit_one_batch(model, inputs, torch.zeros(len(inputs), dtype=torch.long),
                                optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), loss_fn=_loss)
    assert finding.code == "overfit_probe_nothing_to_learn" and finding.severity == "error"
    assert finding.title == "the loss is 0 from the first step: nothing to learn" and "became" not in finding.detail
    assert "at least two classes" in finding.fixes[0]
