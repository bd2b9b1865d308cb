"""Ablation planning and statistics (the runs themselves are in tests/e2e/test_evaluate_cli.py)."""
from __future__ import annotations

import pytest
from scipy import stats

from trainwise.errors import ConfigError
from trainwise.evaluate.ablate import parse_vary, plan_variants
from trainwise.evaluate.ablation_stats import (paired_t_p_value, sign_flip_p_value, smallest_exact_p,
                                               summarise_variants)


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
    return [{"variant": name, "ok": True, "value": v, "seed": k} for name, vs in values.items()
            for k, v in enumerate(vs)]


def test_seeds_are_compared_in_pairs_with_the_exact_test_for_few_seeds():
    # seed-to-seed spread (0.80 .. 0.95) swamps the gain for an unpaired test; every seed gains 0.01-0.02
    baseline = [0.80, 0.85, 0.90, 0.95, 0.83, 0.88]
    gain = [b + d for b, d in zip(baseline, [0.01, 0.02, 0.015, 0.01, 0.02, 0.012])]
    noise = [b + d for b, d in zip(baseline, [0.01, -0.02, 0.015, -0.01, 0.02, -0.012])]
    values = {"baseline": baseline, "gain": gain, "noise": noise}
    summary = summarise_variants(list(values), _outcomes(values), goal="max")
    rows = {r["name"]: r for r in summary["variants"]}
    assert "paired" in summary["test"] and "exact sign-flip" in summary["test"]
    assert stats.ttest_ind(gain, baseline, equal_var=False).pvalue > 0.5  # what Welch's test said: noise
    assert rows["gain"]["test_used"] == "exact sign-flip permutation test" and rows["gain"]["pairs"] == 6
    assert rows["gain"]["p_exact"] == pytest.approx(2 / 64)  # all 6 differences positive: the extreme
    assert rows["gain"]["p_paired_t"] == pytest.approx(stats.ttest_rel(gain, baseline).pvalue)
    assert rows["gain"]["p_value"] == rows["gain"]["p_exact"] and rows["gain"]["verdict"] == "better than baseline"
    assert rows["noise"]["within_noise"] is True and rows["noise"]["verdict"] == "within seed noise"
    worse = summarise_variants(list(values), _outcomes(values), goal="min")["variants"][1]
    assert worse["verdict"] == "worse than baseline"  # for a loss, the same gain is worse


def test_three_seeds_say_they_cannot_tell_instead_of_within_noise():
    values = {"baseline": [0.90, 0.91, 0.92], "big_gain": [0.97, 0.975, 0.98]}
    row = summarise_variants(list(values), _outcomes(values), goal="max")["variants"][1]
    assert row["p_exact"] == pytest.approx(0.25) and row["p_paired_t"] < 0.05
    assert row["verdict"].startswith("too few seeds to tell") and "--seeds 6" in row["verdict"]
    # what the t-tests say, and what they assume, is in the verdict: 3 seeds can reach 0.05 with them
    assert row["p_welch"] == pytest.approx(stats.ttest_ind(values["big_gain"], values["baseline"],
                                                           equal_var=False).pvalue)
    assert f"paired p = {row['p_paired_t']:.2g}, Welch p = {row['p_welch']:.2g}" in row["verdict"]
    assert "assuming normally distributed seed noise, the t-tests show a difference" in row["verdict"]
    noisy = {"baseline": [0.90, 0.95, 0.85], "small": [0.91, 0.93, 0.88]}
    row = summarise_variants(list(noisy), _outcomes(noisy), goal="max")["variants"][1]
    assert "the t-tests show no difference" in row["verdict"]


def test_many_seeds_use_the_paired_t_test():
    baseline = [0.8 + 0.01 * k for k in range(12)]
    values = {"baseline": baseline, "x": [b + 0.01 + 0.001 * (k % 3) for k, b in enumerate(baseline)]}
    row = summarise_variants(list(values), _outcomes(values), goal="max")["variants"][1]
    assert row["test_used"] == "paired t-test" and row["p_value"] == row["p_paired_t"] < 0.05


def test_pairs_are_made_on_the_seed_not_the_order():
    outcomes = [{"variant": "baseline", "ok": True, "value": v, "seed": s} for s, v in ((0, 0.5), (1, 0.9))]
    outcomes += [{"variant": "x", "ok": True, "value": v, "seed": s} for s, v in ((1, 0.91), (0, 0.51))]
    row = summarise_variants(["baseline", "x"], outcomes, goal="max")["variants"][1]
    assert row["pairs"] == 2 and row["p_paired_t"] == 0.0  # both seeds gained exactly 0.01


def test_too_few_seeds_and_failed_runs_are_reported_not_hidden():
    outcomes = [{"variant": "baseline", "ok": True, "value": 0.9, "seed": 0},
                {"variant": "x", "ok": True, "value": 0.8, "seed": 0},
                {"variant": "x", "ok": False, "value": None, "seed": 1}]
    rows = summarise_variants(["baseline", "x"], outcomes, goal="max")["variants"]
    assert rows[1]["p_value"] is None and rows[1]["verdict"].startswith("too few seeds")
    assert rows[1]["failed_runs"] == 1 and rows[1]["n"] == 1
    assert paired_t_p_value([1.0, 1.0], [1.0, 1.0]) == 1.0 and paired_t_p_value([2.0, 2.0], [1.0, 1.0]) == 0.0
    assert sign_flip_p_value([0.0, 0.0]) == 1.0 and smallest_exact_p(3) == 0.25


def test_a_metric_the_runs_will_not_record_is_refused_before_any_run(tmp_path):
    from trainwise.evaluate.ablate import ablate

    out = tmp_path / "a"
    with pytest.raises(ConfigError, match=r"no test metric 'acuracy'. Did you mean test/accuracy\?"):
        ablate("breast-cancer", ["dropout"], out=out, metric="test/acuracy")
    with pytest.raises(ConfigError, match="no val metric 'roc_auc'.*val/balanced_accuracy"):
        ablate("breast-cancer", ["dropout"], out=out, metric="val/roc_auc")
    assert not out.exists()  # nothing trained


def test_vary_values_that_resolve_to_the_same_config_are_left_out_before_training():
    variants, skipped = plan_variants("breast-cancer", parse_vary(["optim.lr=0.01,1e-2,0.1"]))
    assert [v.name for v in variants] == ["baseline", "optim.lr=0.01", "optim.lr=0.1"]
    assert skipped == ["optim.lr=1e-2"]


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


def test_one_class_metric_is_an_ablation_metric_checked_before_any_run(tmp_path):
    from trainwise.evaluate.ablate import _config, check_metric

    config = _config("breast-cancer", [])
    check_metric(config, "test/malignant/recall")  # the metric the README says matters
    check_metric(config, "test/benign/f1")
    with pytest.raises(ConfigError, match=r"Did you mean test/malignant/recall\?.*per class, test/<class>/"
                                          r"<precision\|recall\|f1> for the classes 'benign', 'malignant'"):
        check_metric(config, "test/malignant/recal")
    with pytest.raises(ConfigError, match="no val metric 'malignant/recall'"):
        check_metric(config, "val/malignant/recall")  # validation logs no per-class metrics


def test_one_class_metric_is_read_from_the_evaluation(tmp_path):
    import json

    from trainwise.evaluate.ablate import _metric_value
    from trainwise.rundir.layout import RunDir

    run = RunDir(tmp_path)
    run.eval_dir.mkdir()
    run.eval_metrics_path.write_text(json.dumps({"split": "test", "accuracy": 0.9, "per_class": [
        {"class": "malignant", "precision": 0.8, "recall": 0.75, "f1": 0.77},
        {"class": "benign", "precision": 0.95, "recall": 0.97, "f1": 0.96}]}))
    assert _metric_value(run, "test", "malignant/recall") == 0.75
    assert _metric_value(run, "test", "benign/precision") == 0.95
    with pytest.raises(ConfigError, match="no class 'cat'"):
        _metric_value(run, "test", "cat/recall")
