"""GPU health and host checks on written facts: what a user with a hot, busy or misconfigured box is told."""
import dataclasses
from pathlib import Path

import pytest

from trainwise.config import TelemetryConfig
from trainwise.doctor.facts import GpuProcess, load_facts
from trainwise.doctor.gpu_health import gpu_health_findings
from trainwise.doctor.host import host_findings, suggested_workers

FACTS = Path(__file__).parent / "facts"
GIB = 2**30


def h200(**changes):
    return dataclasses.replace(load_facts(FACTS / "h200.json").nvml.gpus[0], **changes)


def health(gpu, **thresholds):
    return {f.title.split(" ", 2)[-1]: f for f in gpu_health_findings([gpu], TelemetryConfig(**thresholds))}


@pytest.mark.parametrize("temperature, status", [(79, "ok"), (80, "warn"), (89, "warn"), (90, "fail")])
def test_temperature_thresholds(temperature, status):
    assert health(h200(temperature_c=temperature))["temperature"].status == status


def test_temperature_thresholds_are_configurable():
    assert health(h200(temperature_c=76), temperature_warn_c=75)["temperature"].status == "warn"
    assert health(h200(temperature_c=86), temperature_fail_c=85)["temperature"].status == "fail"


def test_hot_card_with_a_stopped_fan_fails():
    found = health(h200(temperature_c=82, fan_pct=0))["temperature"]
    assert found.status == "fail" and "fan is not spinning" in found.finding


def test_hot_throttling_card_from_the_two_gpu_box():
    gpus = load_facts(FACTS / "two_gpu_hot.json").nvml.gpus
    found = {f.title: f for f in gpu_health_findings(gpus, TelemetryConfig())}
    assert found["GPU 1 temperature"].status == "fail"
    assert found["GPU 1 clocks"].status == "fail" and "hw_slowdown" in found["GPU 1 clocks"].finding
    assert found["GPU 0 temperature"].status == "ok"
    assert found["GPU 0 in use"].status == "warn" and "pid 4242" in found["GPU 0 in use"].finding
    assert "GPU 0 memory errors" not in found  # GeForce: no ECC to report


@pytest.mark.parametrize("reasons, status, word", [
    (["gpu_idle"], "ok", "not throttled"), (["sw_thermal_slowdown"], "warn", "thermal"),
    (["sw_power_cap"], "warn", "power capped"), (["hw_power_brake_slowdown"], "fail", "hardware")])
def test_throttle_reasons(reasons, status, word):
    found = health(h200(throttle_reasons=reasons))["clocks"]
    assert found.status == status and word in found.finding


@pytest.mark.parametrize("changes, status, word", [
    ({}, "ok", "no uncorrectable"), ({"ecc_uncorrected_volatile": 3}, "fail", "3 uncorrectable"),
    ({"row_remap_pending": True}, "warn", "pending"), ({"row_remap_failure": True}, "fail", "RMA"),
    ({"ecc_uncorrected_aggregate": 1}, "warn", "over the card's life"), ({"ecc_enabled": False}, "ok", "ECC is off")])
def test_memory_errors(changes, status, word):
    found = health(h200(**changes))["memory errors"]
    assert found.status == status and (word in found.finding or word in (found.fix or ""))


def test_power_cap_is_normal_under_load():
    busy = health(h200(throttle_reasons=["sw_power_cap"], utilization_pct=97))["clocks"]
    assert busy.status == "ok" and "under load" in busy.finding


def test_persistence_mode_off_warns_with_the_command():
    found = health(h200(persistence_mode=False))["persistence mode"]
    assert found.status == "warn" and "nvidia-persistenced" in found.fix


def test_busy_gpu_without_visible_processes():
    found = health(h200(memory_used_bytes=60 * GIB))["in use"]
    assert found.status == "warn" and "not visible" in found.finding
    found = health(h200(processes=[GpuProcess(pid=7, name="python", used_memory_bytes=GIB)]))["in use"]
    assert found.status == "warn" and "pid 7" in found.finding


def test_fields_a_card_does_not_report_give_no_finding():
    blank = h200(temperature_c=None, throttle_reasons=None, ecc_enabled=None, row_remap_pending=None,
                 persistence_mode=None, memory_used_bytes=None)
    assert gpu_health_findings([blank], TelemetryConfig()) == []


def host(name="h200", **changes):
    return dataclasses.replace(load_facts(FACTS / f"{name}.json").host, **changes)


def by_title(found):
    return {f.title: f for f in found if f is not None}


def test_docker_defaults_warn_shm_and_open_files():
    found = by_title(host_findings(host("docker_small_shm"), gpus=1))
    shm = found["Shared memory"]
    assert shm.status == "warn" and "64 MB" in shm.finding and "--shm-size" in shm.fix
    assert found["Open files"].status == "warn" and found["Open files"].fix.startswith("ulimit -n 65536")
    assert "of 32 on the machine" in found["CPU cores"].finding
    # `auto` would start no worker on a 64 MB /dev/shm, and the doctor suggests what auto would do
    assert found["CPU cores"].evidence["suggested_workers"] == 0


def test_small_shm_outside_a_container_is_remounted():
    shm = by_title(host_findings(host(shm_total_bytes=64 * 2**20, in_container=False), gpus=1))["Shared memory"]
    assert "remount" in shm.fix


def test_cores_per_gpu():
    assert by_title(host_findings(host(cpu_usable=8), gpus=8))["CPU cores"].status == "warn"
    ok = by_title(host_findings(host(cpu_usable=64), gpus=8))["CPU cores"]
    assert ok.status == "ok" and ok.evidence["suggested_workers"] == 7
    assert suggested_workers(2, 0) == 1 and suggested_workers(1, 1) == 0 and suggested_workers(128, 1) == 8


def test_ram_against_gpu_memory_and_availability():
    assert by_title(host_findings(host(), gpus=1, gpu_memory_bytes=141 * GIB))["RAM"].status == "warn"
    assert by_title(host_findings(host(), gpus=1, gpu_memory_bytes=80 * GIB))["RAM"].status == "ok"
    assert by_title(host_findings(host(ram_available_bytes=GIB), gpus=0))["RAM"].status == "warn"


def test_low_hard_open_file_limit_says_how_to_raise_it():
    found = by_title(host_findings(host(open_files_soft=1024, open_files_hard=4096), gpus=1))["Open files"]
    assert found.fix.startswith("ulimit -n 4096") and "limits.conf" in found.fix


@pytest.mark.parametrize("temperature", [60, 79, 80, 85, 90, 95])
@pytest.mark.parametrize("reasons, utilization", [
    ([], 0), (["gpu_idle"], 0), (["sw_power_cap"], 0), (["sw_power_cap"], 97), (["sw_power_cap"], None),
    (["sw_thermal_slowdown"], 90), (["hw_slowdown"], 90), (["hw_power_brake_slowdown"], 0),
    (["sw_thermal_slowdown", "sw_power_cap"], 20)])
def test_doctor_grades_a_card_as_telemetry_alerts_on_it(temperature, reasons, utilization):
    """One judgement of temperature and clocks: a card the doctor passes raises no alert while training, and
    what alerts while training the doctor flags too."""
    from trainwise.telemetry.alerts import AlertRules

    status_of_level = {None: "ok", "info": "ok", "warning": "warn", "error": "fail"}

    gpu = h200(temperature_c=temperature, throttle_reasons=reasons, utilization_pct=utilization, fan_pct=50)
    found = health(gpu)
    alerts = {a.kind: a.severity for a in AlertRules(TelemetryConfig()).check_sample(
        {"gpus": [{"index": 0, "temperature_c": temperature, "throttle_reasons": reasons,
                   "utilization_pct": utilization}]})}
    assert found["temperature"].status == status_of_level[alerts.get("gpu_temperature")]
    assert found["clocks"].status == status_of_level[alerts.get("gpu_throttle")]
