"""Memory leaks: steady growth after warm-up, with the growth per 100 steps; warm-up, a one-off jump and
noise stay silent."""
from __future__ import annotations

import pytest

from tests.diagnose.synthetic_run import GIB, codes, gpu_samples, make_run, only
from trainwise.diagnose.memory import memory_leak
from trainwise.diagnose.run_rules import diagnose_run

MIB = 2**20


def test_host_ram_growing_every_step_is_a_leak_with_its_rate(tmp_path):
    samples = gpu_samples(name="", ram=lambda s: 8 * GIB + s * 20 * MIB)
    finding = only(diagnose_run(make_run(tmp_path / "run", samples=samples)), "memory_leak")
    assert finding.severity == "warn" and finding.step == 100  # the first 20% of steps are warm-up
    assert finding.evidence["growth_per_100_steps_bytes"] == pytest.approx(2000 * MIB, rel=0.01)
    assert finding.evidence["r2"] > 0.99 and "whole machine" in finding.evidence["source"]
    assert "2,000.0 MiB per 100 steps" in finding.title and any(".item()" in fix for fix in finding.fixes)


def test_gpu_memory_that_will_not_fit_by_the_last_step_is_an_error(tmp_path):
    samples = gpu_samples(gpu=lambda s: {"memory_used_bytes": 20 * GIB + s * 200 * MIB})
    finding = only(diagnose_run(make_run(tmp_path / "run", samples=samples, summary={"device": "cuda:0",
                                                                                    "precision": "bf16"})),
                   "memory_leak")
    assert finding.severity == "error" and finding.evidence["source"] == "GPU 0 memory used"
    assert finding.evidence["projected_at_max_steps_bytes"] > finding.evidence["total_bytes"] == 80 * GIB


def test_the_allocator_s_own_numbers_win_when_the_engine_logs_them(tmp_path):
    run = make_run(tmp_path / "run", train_extra=lambda s: {"cuda_allocated_bytes": 2 * GIB + s * MIB})
    finding = only(diagnose_run(run), "memory_leak")
    assert finding.evidence["source"] == "CUDA allocated memory"


@pytest.mark.parametrize("ram", [
    lambda s: 8 * GIB,                                     # flat
    lambda s: 8 * GIB + min(s, 80) * 50 * MIB,             # grows during warm-up only, then flat
    lambda s: 8 * GIB + (2 * GIB if s >= 250 else 0),      # one jump (first evaluation), then flat
    lambda s: 8 * GIB + s * 10_000,                        # a few MiB over the run: noise, not a leak
])
def test_warm_up_a_single_jump_and_noise_are_not_leaks(tmp_path, ram):
    assert "memory_leak" not in codes(diagnose_run(make_run(tmp_path / "run", samples=gpu_samples(name="", ram=ram))))


def test_too_few_samples_prove_nothing():
    assert memory_leak("process RSS", [(s, 1e9 + s * 1e8) for s in range(0, 50, 10)]) is None
