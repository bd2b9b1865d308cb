"""Slow training: each cause found from the run's records with its numbers and the fix; a fast run is silent."""
from __future__ import annotations

from tests.diagnose.synthetic_run import codes, gpu_samples, make_run, only
from trainwise.diagnose.run_rules import diagnose_run

ON_GPU = {"device": "cuda:0", "precision": "bf16"}


def _diagnose(tmp_path, **kwargs):
    return diagnose_run(make_run(tmp_path / "run", **kwargs))


def test_data_starved_quotes_the_wait_the_utilisation_and_the_loader(tmp_path):
    finding = only(_diagnose(tmp_path, data_wait=lambda s: 0.6, summary=ON_GPU,
                             samples=gpu_samples(gpu=lambda s: {"utilization_pct": 20.0})), "data_starved")
    assert finding.severity == "warn" and finding.step == 20  # the first log (worker start-up) is skipped
    assert finding.evidence["data_wait_fraction"] == 0.6 and finding.evidence["gpu_utilization_pct"] == 20.0
    assert finding.evidence["num_workers"] == 0 and finding.evidence["data_wait_s"] > finding.evidence["compute_s"]
    assert "data.num_workers" in finding.fixes[0] and any("trainwise data bench" in fix for fix in finding.fixes)


def test_not_starved_when_the_gpu_is_busy_or_the_wait_is_short(tmp_path):
    busy = _diagnose(tmp_path, data_wait=lambda s: 0.6, summary=ON_GPU, samples=gpu_samples())
    assert "data_starved" not in codes(busy)
    short = diagnose_run(make_run(tmp_path / "short", summary=ON_GPU,
                                  samples=gpu_samples(gpu=lambda s: {"utilization_pct": 20.0})))
    assert "data_starved" not in codes(short)


def test_without_a_gpu_the_data_wait_alone_decides(tmp_path):
    assert "data_starved" in codes(_diagnose(tmp_path, data_wait=lambda s: 0.6, samples=gpu_samples(name="")))


def test_cpu_training_while_a_gpu_exists(tmp_path):
    finding = only(_diagnose(tmp_path, samples=gpu_samples(), summary={"device": "cpu"},
                             overrides=["train.device=cpu"]), "not_on_gpu")
    assert finding.evidence["gpus"] == ["NVIDIA A100-SXM4-80GB"] and finding.evidence["train_device"] == "cpu"
    assert finding.step == 10 and "train.device=auto" in finding.fixes[0]
    assert "not_on_gpu" not in codes(diagnose_run(make_run(tmp_path / "cpu_only", samples=gpu_samples(name=""))))


def test_fp32_on_a_card_with_tensor_cores(tmp_path):
    finding = only(_diagnose(tmp_path, samples=gpu_samples(), summary={"device": "cuda:0", "precision": "fp32"}),
                   "fp32_on_tensor_cores")
    assert finding.severity == "warn" and finding.evidence["gpus"] == ["NVIDIA A100-SXM4-80GB"]
    assert "train.precision" in finding.fixes[0]
    old_card = diagnose_run(make_run(tmp_path / "gtx", samples=gpu_samples(name="NVIDIA GeForce GTX 1080"),
                                     summary={"device": "cuda:0", "precision": "fp32"}))
    assert "fp32_on_tensor_cores" not in codes(old_card)
    with_tf32 = diagnose_run(make_run(tmp_path / "tf32", samples=gpu_samples(),
                                      summary={"device": "cuda:0", "precision": "fp32", "tf32": True}))
    assert only(with_tf32, "fp32_on_tensor_cores").severity == "info"


def test_tiny_batches_leave_the_gpu_idle(tmp_path):
    idle = gpu_samples(gpu=lambda s: {"utilization_pct": 15.0})
    finding = only(_diagnose(tmp_path, samples=idle, summary=ON_GPU, overrides=["train.batch_size=8"]),
                   "tiny_batches")
    assert finding.evidence["batch_size"] == 8 and finding.evidence["gpu_utilization_pct"] == 15.0
    assert "train.batch_size" in finding.fixes[0] and "32" in finding.fixes[0]
    big = diagnose_run(make_run(tmp_path / "big", samples=idle, summary=ON_GPU, overrides=["train.batch_size=256"]))
    assert "tiny_batches" not in codes(big)


def test_unpinned_copies_on_a_gpu_run(tmp_path):
    finding = only(_diagnose(tmp_path, samples=gpu_samples(), summary=ON_GPU, overrides=["data.pin_memory=false"]),
                   "unpinned_copies")
    assert finding.severity == "info" and finding.evidence["pin_memory"] is False
    assert "unpinned_copies" not in codes(diagnose_run(make_run(tmp_path / "auto", samples=gpu_samples(),
                                                                summary=ON_GPU)))
