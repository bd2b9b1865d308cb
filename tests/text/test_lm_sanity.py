"""The sanity checks on a language model: the run's micro-batch, a time bound, -100 labels accepted."""
from __future__ import annotations

import time

import pytest
import torch

from tests.text.lm_helpers import tiny_gpt, token_batches
from trainwise.data.bundle import ArrayDataset, DataBundle, DataSpec, check_labels
from trainwise.check import overfit_one_batch as sanity_probe
from trainwise.check.sanity import sanity_check
from trainwise.errors import DataError
from trainwise.recipes import load_recipe


def test_lm_recipe_probes_one_micro_batch_of_tokens(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    config = load_recipe("lm-gpt", ["train.micro_batch_size=4", "model.args.layers=1", "model.args.width=32",
                                    "train.max_steps=200", "train.device=cpu", "train.precision=fp32"])
    findings = {f.code: f for f in sanity_check(config)}
    probe = next(f for code, f in findings.items() if code.startswith("overfit_probe"))
    assert probe.evidence["rows"] == 4  # the run's micro-batch, not the batch of 12
    assert probe.severity != "error", probe.to_dict()
    assert not any(f.severity == "error" for f in findings.values())


def test_probe_stops_at_its_time_bound(monkeypatch):
    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = tiny_gpt()

        def forward(self, **batch):
            time.sleep(0.05)
            return self.inner(**batch)

    monkeypatch.setattr(sanity_probe, "MIN_PROBE_S", 0.1)
    model = Slow()
    finding = sanity_probe.overfit_one_batch(model, token_batches(rows=2), None, loss_fn=None,
                                             optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                             planned_steps=20)  # 10% of 20 steps: 2 steps' time
    assert finding.code == "overfit_probe_skipped" and finding.evidence["steps"] < sanity_probe.MIN_STEPS


def test_minus_100_targets_pass_the_label_check_and_bad_ones_are_named():
    inputs = torch.randint(0, 10, (6, 5))
    targets = torch.randint(0, 10, (6, 5))
    targets[:, :2] = -100  # a prompt mask
    spec = DataSpec(input_shape=(5,), num_classes=10)
    check_labels(DataBundle(ArrayDataset(inputs, targets), None, None, spec=spec))  # no traceback, no error
    targets[3, 4] = 12
    with pytest.raises(DataError, match=r"label 12 at sample \(3, 4\)"):
        check_labels(DataBundle(ArrayDataset(inputs, targets), None, None, spec=spec))
