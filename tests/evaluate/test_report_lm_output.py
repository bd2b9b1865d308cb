"""A language model's numbers in its own words (issue 35): tokens where tokens are counted, the typical
tokens/s rather than the last interval's, and validation metrics on axes their scales fit."""
from __future__ import annotations

from types import SimpleNamespace

from trainwise.evaluate.report import counted, headline
from trainwise.evaluate.report_charts import val_metric_axes
from trainwise.evaluate.report_lm import language_model_section
from trainwise.rundir import RunDir

LM_EVAL = {"task": "causal_lm", "perplexity": 20.5, "token_accuracy": 0.41, "loss": 3.02, "tokens": 53264,
           "samples": 53264}


def test_an_evaluation_counts_tokens_answer_tokens_or_samples():
    assert counted(LM_EVAL) == ("tokens", "53,264")
    assert counted({**LM_EVAL, "finetune": {"exact_match": 0.5}}) == ("answer tokens", "53,264")
    assert counted({"task": "classification", "samples": 360}) == ("samples", "360")
    assert headline(LM_EVAL)[-1] == ("tokens", "53,264", "")


def test_validation_metrics_are_parted_by_scale_and_token_counts_are_not_metrics():
    records = [{"split": "val", "step": s, "loss": 4.0, "perplexity": 80.0 - s, "token_accuracy": 0.2,
                "tokens": 16_000} for s in (10, 20)]
    records += [{"split": "val", "step": 10, "accuracy": 0.9, "balanced_accuracy": 0.88}]
    assert val_metric_axes(records) == (["accuracy", "balanced_accuracy", "token_accuracy"], ["perplexity"])


def test_the_throughput_sentence_is_the_median_not_the_last_interval(tmp_path):
    rates = [900.0, 2100.0, 1900.0, 2000.0, 20089.0]  # start-up first, an outlier last
    records = [{"split": "train", "step": 10 * i, "tokens_per_s": r, "loss": 3.0} for i, r in enumerate(rates, 1)]
    section = language_model_section(RunDir(tmp_path), records, None, None)
    assert section["throughput"].startswith("Training ran at 2,050 tokens/s per rank, the median of its logged")
    assert "20,089" not in section["throughput"]
