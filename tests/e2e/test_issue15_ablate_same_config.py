"""Issue 15: `--vary` values that resolve to the same config on this machine (train.precision fp32 where `auto`
is fp32, as on a CPU) ran identical copies of the baseline. They are now found before any training, and said."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import invoke
from trainwise.evaluate.ablate import parse_vary, plan_variants


@pytest.fixture
def cpu_only(monkeypatch):
    """A machine without CUDA or MPS: `auto` trains on the CPU in fp32."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_precision_fp32_on_a_cpu_is_the_auto_baseline_and_is_left_out(cpu_only):
    variants, skipped = plan_variants("breast-cancer", parse_vary(["train.precision=fp32,bf16",
                                                                   "train.device=cpu"]))
    assert [v.name for v in variants] == ["baseline", "train.precision=bf16"]
    assert skipped == ["train.precision=fp32", "train.device=cpu"]


def test_an_ablation_of_only_such_values_stops_before_training_and_says_why(cpu_only, tmp_path, capsys):
    out = tmp_path / "ablation"
    result = invoke(capsys, "ablate", "breast-cancer", "--vary", "train.precision=fp32", "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    said = " ".join(result.stderr.split())
    assert "train.precision=fp32" in said and "runs as it on this machine" in said
    assert not (out / "baseline").exists()  # nothing trained
