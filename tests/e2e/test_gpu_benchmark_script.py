"""benchmarks/gpu/run.sh is one prepared script for a lent GPU; --dry-run proves on the CPU that it runs
end to end (every section, the JSON written), so a GPU session spends its minutes measuring."""
import json
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_gpu_benchmark_dry_run_writes_every_section(tmp_path):
    result_path = tmp_path / "gpu.json"
    done = subprocess.run([str(ROOT / "benchmarks" / "gpu" / "run.sh"), "--dry-run", "--output", str(result_path)],
                          capture_output=True,
                          text=True, timeout=540, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert result["dry_run"] is True and result["meets_targets"] is None
    assert {strategy: run["exit_code"] for strategy, run in result["smoke"].items()} == {"ddp": 0, "fsdp": 0}
    assert result["resnet50"]["status"] == "completed" and result["resnet50"]["images_per_s"] > 0
    assert result["gpt2"]["status"] == "completed" and result["gpt2"]["tokens_per_s"] > 0
    assert result["gpt2"]["model_flops_per_token"] > 6 * result["gpt2"]["setup"]["parameters"] * 0.5
    assert result["llama_1b"]["status"] == "completed" and result["llama_1b"]["tokens_per_s"] > 0
    assert result["llama_1b"]["setup"]["weights"] == "bf16" and result["llama_1b"]["flops_per_token"] > 0
    assert 0 <= result["resnet50"]["data_wait_fraction"] <= 1
    assert result["resnet50"]["telemetry"]["samples"] >= 1  # telemetry was recorded with the run
    for recipe in ("shop-sasrec", "shop-din"):  # the recommenders' training events/s through the Trainer
        figures = result["recsys"][recipe]
        assert figures["events_per_s"] > 0 and figures["precision"] == "fp32" and figures["steps"] == 3
    assert result["recsys"]["shop-din"]["events_per_sample"] == 1 / 5  # one real event per 1 + 4 negatives
