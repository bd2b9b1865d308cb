"""GPU hardware: temperature by telemetry's thresholds, throttling, ECC/Xid; software-first fixes."""
from __future__ import annotations

from tests.diagnose.synthetic_run import codes, gpu_samples, make_run, only
from trainwise.diagnose.run_rules import diagnose_run

ON_GPU = {"device": "cuda:0", "precision": "bf16"}


def _diagnose(tmp_path, gpu=None, events=(), overrides=()):
    return diagnose_run(make_run(tmp_path / "run", samples=gpu_samples(gpu=gpu), events=list(events),
                                 summary=ON_GPU, overrides=list(overrides)))


def test_a_hot_gpu_warns_over_80_and_fails_over_90_with_when_and_how_hot(tmp_path):
    warm = only(_diagnose(tmp_path, gpu=lambda s: {"temperature_c": 84 if s > 250 else 70}), "gpu_temperature")
    assert warm.severity == "warn" and warm.step == 260 and warm.evidence["max_temperature_c"] == 84
    assert warm.evidence["threshold_c"] == 80 and warm.evidence["hot_samples"] == 25
    assert "driver" in warm.fixes[0] and "airflow" in warm.fixes[1] and "vendor" in warm.fixes[2]
    hot = only(diagnose_run(make_run(tmp_path / "hot", samples=gpu_samples(gpu=lambda s: {"temperature_c": 93}),
                                     summary=ON_GPU)), "gpu_temperature")
    assert hot.severity == "error" and hot.evidence["threshold_c"] == 90 and hot.step == 0


def test_the_thresholds_are_the_run_s_telemetry_settings(tmp_path):
    findings = _diagnose(tmp_path, gpu=lambda s: {"temperature_c": 84},
                         overrides=["telemetry.temperature_warn_c=85", "telemetry.temperature_fail_c=95"])
    assert "gpu_temperature" not in codes(findings)


def test_hardware_slowdown_is_an_error_and_a_power_cap_under_load_is_normal(tmp_path):
    finding = only(_diagnose(tmp_path, gpu=lambda s: {"throttle_reasons": ["hw_slowdown"] if s >= 100 else [],
                                                      "sm_clock_mhz": 600 if s >= 100 else 1410}), "gpu_throttle")
    assert finding.severity == "error" and finding.step == 100 and finding.evidence["min_sm_clock_mhz"] == 600
    assert finding.evidence["reasons"] == ["hw_slowdown"] and "driver" in finding.fixes[0]
    capped = diagnose_run(make_run(tmp_path / "capped", summary=ON_GPU,
                                   samples=gpu_samples(gpu=lambda s: {"throttle_reasons": ["sw_power_cap"]})))
    assert "gpu_throttle" not in codes(capped)


def test_ecc_and_xid_events_are_errors(tmp_path):
    xid = {"kind": "gpu_fault", "message": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
           "severity": "error", "step": 340}
    finding = only(_diagnose(tmp_path, events=[xid]), "gpu_memory_errors")
    assert finding.severity == "error" and finding.step == 340 and finding.evidence["events"][0]["step"] == 340
    counted = only(diagnose_run(make_run(tmp_path / "ecc", summary=ON_GPU, samples=gpu_samples(
        gpu=lambda s: {"ecc_uncorrected_volatile": 2 if s >= 400 else 0}))), "gpu_memory_errors")
    assert counted.step == 400 and counted.evidence["counters"][0]["value"] == 2


def test_a_cool_unthrottled_card_and_unrelated_events_are_silent(tmp_path):
    events = [{"kind": "checkpoint", "message": "saved a checkpoint (recce)", "step": 100}]
    assert _diagnose(tmp_path, events=events) == []
