"""compare_runs: only the config keys that differ, beside each run's metrics."""
from __future__ import annotations

import pytest
from tests.evaluate.fake_run import make_fake_run

from trainwise.errors import RunDirError
from trainwise.evaluate.compare import compare_runs
from trainwise.recipes import load_recipe


def test_compare_shows_differences_and_metrics(tmp_path):
    a = make_fake_run(tmp_path / "a")
    b = make_fake_run(tmp_path / "b")
    b.write_config(load_recipe("breast-cancer", ["train.max_steps=200", "optim.lr=0.01", "data.augment=false"]))
    summary = b.read_summary()
    b.write_summary({**summary, "best": {"metric": "val/loss", "value": 0.25, "step": 140}})
    result = compare_runs([a.path, b.path])
    assert result["config_differences"] == {"data.augment": [True, False], "optim.lr": [0.002, 0.01]}
    assert result["metrics"]["best val/loss"] == [0.3, 0.25]
    assert result["metrics"]["best step"] == [100, 140]
    assert result["metrics"]["status"] == ["completed", "completed"]


def test_compare_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(RunDirError, match="not a run directory"):
        compare_runs([make_fake_run(tmp_path / "a").path, tmp_path / "missing"])
