"""Ablation planning and statistics (the runs themselves are in tests/e2e/test_evaluate_cli.py)."""
from __future__ import annotations

import pytest
from scipy import stats

from trainwise.errors import ConfigError
from trainwise.evaluate.ablate import parse_vary, plan_variants
from trainwise.evaluate.ablation_stats import summarise_variants, welch_p_value


def test_parse_vary_values_lists_and_switch_names():
    assert parse_vary(["optim.lr=1e-3,3e-3", "model.args.hidden=[64,32],[128]", "dropout"]) == [
        ("optim.lr", ["1e-3", "3e-3"]), ("model.args.hidden", ["[64,32]", "[128]"]),
        ("model.args.dropout", ["0"])]
    with pytest.raises(ConfigError, match="name a switch: augmentation"):
        parse_vary(["dropuot"])
    with pytest.raises(ConfigError, match="at least one value"):
        parse_vary(["optim.lr="])


def test_one_at_a_time_skips_values_equal_to_the_baseline():
    # breast-cancer has data.augment=true and weight_decay=0.01 already
    variants, skipped = plan_variants("breast-cancer", parse_vary(["data.augment=true,false",
                                                                    "optim.weight_decay=0.01,0"]))
    assert [v.name for v in variants] == ["baseline", "data.augment=false", "optim.weight_decay=0"]
    assert skipped == ["data.augment=true", "optim.weight_decay=0.01"]
    assert variants[1].directory == "data.augment-false"
    with pytest.raises(ConfigError, match="nothing to compare"):
        plan_variants("breast-cancer", parse_vary(["label_smoothing"]))  # the recipe has none to turn off


def test_grid_is_every_combination():
    variants, _ = plan_variants("breast-cancer", parse_vary(["augmentation", "optim.lr=0.001,0.01"]), mode="grid")
    assert [v.name for v in variants] == ["baseline", "data.augment=false,optim.lr=0.001",
                                          "data.augment=false,optim.lr=0.01"]


def test_a_bad_key_fails_before_any_run():
    with pytest.raises(ConfigError, match="unknown key 'optim.learning_rate'"):
        plan_variants("breast-cancer", parse_vary(["optim.learning_rate=0.1"]))
    with pytest.raises(ConfigError, match="one-at-a-time or grid"):
        plan_variants("breast-cancer", parse_vary(["dropout"]), mode="random")


def _outcomes(values):
    return [{"variant": name, "ok": True, "value": v} for name, vs in values.items() for v in vs]


def test_summary_uses_welch_t_test_and_says_which_way():
    values = {"baseline": [0.90, 0.91, 0.92], "big_gain": [0.97, 0.975, 0.98], "noise": [0.89, 0.93, 0.91]}
    summary = summarise_variants(list(values), _outcomes(values), goal="max")
    rows = {r["name"]: r for r in summary["variants"]}
    assert "Welch" in summary["test"]
    assert rows["baseline"]["mean"] == pytest.approx(0.91) and rows["baseline"]["std"] == pytest.approx(0.01)
    expected = stats.ttest_ind(values["big_gain"], values["baseline"], equal_var=False).pvalue
    assert rows["big_gain"]["p_value"] == pytest.approx(expected)
    assert rows["big_gain"]["delta"] == pytest.approx(0.065)
    assert rows["big_gain"]["verdict"] == "better than baseline"
    assert rows["noise"]["within_noise"] is True and rows["noise"]["verdict"] == "within seed noise"
    # for a loss, the same gain is worse
    worse = summarise_variants(list(values), _outcomes(values), goal="min")["variants"][1]
    assert worse["verdict"] == "worse than baseline"


def test_too_few_seeds_and_failed_runs_are_reported_not_hidden():
    outcomes = [{"variant": "baseline", "ok": True, "value": 0.9},
                {"variant": "x", "ok": True, "value": 0.8}, {"variant": "x", "ok": False, "value": None}]
    rows = summarise_variants(["baseline", "x"], outcomes, goal="max")["variants"]
    assert rows[1]["p_value"] is None and rows[1]["verdict"].startswith("too few seeds")
    assert rows[1]["failed_runs"] == 1 and rows[1]["n"] == 1
    assert welch_p_value([1.0, 1.0], [1.0, 1.0]) == 1.0 and welch_p_value([1.0, 1.0], [2.0, 2.0]) == 0.0


def test_parallel_runs_share_the_usable_cores(monkeypatch):
    import torch

    import trainwise.data.loader as loader
    from trainwise.evaluate.ablate import _child_env, default_workers

    monkeypatch.setattr(loader, "usable_cores", lambda: 3)  # of a bigger machine's os.cpu_count()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_workers(jobs=12) == 3
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _child_env(0, workers=3)["OMP_NUM_THREADS"] == "1"
    assert _child_env(0, workers=1)["OMP_NUM_THREADS"] == "3"
