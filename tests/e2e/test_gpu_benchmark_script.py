"""benchmarks/gpu/run.sh is one prepared script for a lent GPU; --dry-run proves on the CPU that it runs
end to end (every section, the JSON written), so a GPU session spends its minutes measuring."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

RUN_SH = ROOT / "benchmarks" / "gpu" / "run.sh"


@pytest.mark.slow
def test_gpu_benchmark_dry_run_writes_every_section(tmp_path):
    result_path = tmp_path / "gpu.json"
    done = subprocess.run([str(RUN_SH), "--dry-run", "--output", str(result_path)], capture_output=True,
                          text=True, timeout=540, cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")})
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
    packed = result["llama_1b_packed"]  # the packed-vs-unpacked case, with the attention chosen on the machine
    assert packed["packed"]["tokens_per_s"] > 0 and packed["unpacked"]["tokens_per_s"] > 0 and packed["attention"]
    assert result["resnet50"]["telemetry"]["samples"] >= 1  # telemetry was recorded with the run
    for recipe in ("shop-sasrec", "shop-din"):  # the recommenders' training events/s through the Trainer
        figures = result["recsys"][recipe]
        assert figures["events_per_s"] > 0 and figures["precision"] == "fp32" and figures["steps"] == 3
    assert result["recsys"]["shop-din"]["events_per_sample"] == 1 / 5  # one real event per 1 + 4 negatives


def _fake_interpreter(path):
    """An executable that says it was run, and with what, instead of running the benchmark."""
    path.write_text('#!/bin/sh\necho "ran $0 $*"\n')
    path.chmod(0o755)
    return path


def test_run_sh_uses_the_interpreter_it_is_given_then_the_one_trainwise_runs_in(tmp_path):
    given = _fake_interpreter(tmp_path / "given-python")
    installed = _fake_interpreter(tmp_path / "env-python")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    console_script = bin_dir / "trainwise"  # what pip writes into an environment's bin/
    console_script.write_text(f"#!{installed}\nimport sys\nfrom trainwise.cli import main\nsys.exit(main())\n")
    console_script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHON", None)
    with_python = subprocess.run([str(RUN_SH), "--dry-run"], env={**env, "PYTHON": str(given)}, capture_output=True,
                                 text=True, timeout=30)
    assert with_python.stdout.startswith(f"ran {given} benchmarks/gpu/bench.py --dry-run"), with_python.stderr
    from_path = subprocess.run([str(RUN_SH), "--dry-run"], env=env, capture_output=True, text=True, timeout=30)
    assert from_path.stdout.startswith(f"ran {installed} benchmarks/gpu/bench.py --dry-run"), from_path.stderr
