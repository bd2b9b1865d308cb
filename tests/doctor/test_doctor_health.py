"""GPU health and host checks on written facts: what a user with a hot, busy or misconfigured box is told."""
import dataclasses
from pathlib import Path

import pytest

from trainwise.config import TelemetryConfig
from trainwise.doctor.facts import load_facts
from trainwise.doctor.gpu_facts import GpuProcess
from trainwise.doctor.gpu_health import gpu_health_findings
from trainwise.doctor.host import host_findings, suggested_workers

FACTS = Path(__file__).parent / "facts"
GIB = 2**30


def h200(**changes):
    return dataclasses.replace(load_facts(FACTS / "h200.json").nvml.gpus[0], **changes)


def health(gpu, **thresholds):
    return {f.title.split(" ", 2)[-1]: f for f in gpu_health_findings([gpu], TelemetryConfig(**thresholds))}


@pytest.mark.parametrize("temperature, status", [(79, "info"), (80, "warn"), (89, "warn"), (90, "error")])
def test_temperature_thresholds(temperature, status):
    assert health(h200(temperature_c=temperature))["temperature"].severity == status


def test_temperature_thresholds_are_configurable():
    assert health(h200(temperature_c=76), temperature_warn_c=75)["temperature"].severity == "warn"
    assert health(h200(temperature_c=86), temperature_fail_c=85)["temperature"].severity == "error"


def test_hot_card_with_a_stopped_fan_fails():
    found = health(h200(temperature_c=82, fan_pct=0))["temperature"]
    assert found.severity == "error" and "fan is not spinning" in found.detail


def test_hot_throttling_card_from_the_two_gpu_box():
    gpus = load_facts(FACTS / "two_gpu_hot.json").nvml.gpus
    found = {f.title: f for f in gpu_health_findings(gpus, TelemetryConfig())}
    assert found["GPU 1 temperature"].severity == "error"
    assert found["GPU 1 clocks"].severity == "error" and "hw_slowdown" in found["GPU 1 clocks"].detail
    assert found["GPU 0 temperature"].severity == "info"
    assert found["GPU 0 in use"].severity == "warn" and "pid 4242" in found["GPU 0 in use"].detail
    assert "GPU 0 memory errors" not in found  # GeForce: no ECC to report


@pytest.mark.parametrize("reasons, status, word", [
    (["gpu_idle"], "info", "not throttled"), (["sw_thermal_slowdown"], "warn", "thermal"),
    (["sw_power_cap"], "warn", "power capped"), (["hw_power_brake_slowdown"], "error", "hardware")])
def test_throttle_reasons(reasons, status, word):
    found = health(h200(throttle_reasons=reasons))["clocks"]
    assert found.severity == status and word in found.detail


@pytest.mark.parametrize("changes, status, word", [
    ({}, "info", "no uncorrectable"), ({"ecc_uncorrected_volatile": 3}, "error", "3 uncorrectable"),
    ({"row_remap_pending": True}, "warn", "pending"), ({"row_remap_failure": True}, "error", "RMA"),
    ({"ecc_uncorrected_aggregate": 1}, "warn", "over the card's life"), ({"ecc_enabled": False}, "info", "ECC is off")])
def test_memory_errors(changes, status, word):
    found = health(h200(**changes))["memory errors"]
    assert found.severity == status and (word in found.detail or word in " ".join(found.fixes))


def test_power_cap_is_normal_under_load():
    busy = health(h200(throttle_reasons=["sw_power_cap"], utilization_pct=97))["clocks"]
    assert busy.severity == "info" and "under load" in busy.detail


def test_persistence_mode_off_warns_with_the_command():
    found = health(h200(persistence_mode=False))["persistence mode"]
    assert found.severity == "warn" and "nvidia-persistenced" in found.fixes[0]


def test_busy_gpu_without_visible_processes():
    found = health(h200(memory_used_bytes=60 * GIB))["in use"]
    assert found.severity == "warn" and "not visible" in found.detail
    found = health(h200(processes=[GpuProcess(pid=7, name="python", used_memory_bytes=GIB)]))["in use"]
    assert found.severity == "warn" and "pid 7" in found.detail


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
    assert shm.severity == "warn" and "64 MB" in shm.detail and "--shm-size" in shm.fixes[0]
    assert found["Open files"].severity == "warn" and found["Open files"].fixes[0].startswith("ulimit -n 65536")
    assert "of 32 on the machine" in found["CPU cores"].detail
    # `auto` would start no worker on a 64 MB /dev/shm, and the doctor suggests what auto would do
    assert found["CPU cores"].evidence["suggested_workers"] == 0


def test_small_shm_outside_a_container_is_remounted():
    shm = by_title(host_findings(host(shm_total_bytes=64 * 2**20, in_container=False), gpus=1))["Shared memory"]
    assert "remount" in shm.fixes[0]


def test_cores_per_gpu():
    assert by_title(host_findings(host(cpu_usable=8), gpus=8))["CPU cores"].severity == "warn"
    ok = by_title(host_findings(host(cpu_usable=64), gpus=8))["CPU cores"]
    assert ok.severity == "info" and ok.evidence["suggested_workers"] == 7
    assert suggested_workers(2, 0) == 1 and suggested_workers(1, 1) == 0 and suggested_workers(128, 1) == 8


def test_ram_against_gpu_memory_and_availability():
    assert by_title(host_findings(host(), gpus=1, gpu_memory_bytes=141 * GIB))["RAM"].severity == "warn"
    assert by_title(host_findings(host(), gpus=1, gpu_memory_bytes=80 * GIB))["RAM"].severity == "info"
    assert by_title(host_findings(host(ram_available_bytes=GIB), gpus=0))["RAM"].severity == "warn"


def test_low_hard_open_file_limit_says_how_to_raise_it():
    found = by_title(host_findings(host(open_files_soft=1024, open_files_hard=4096), gpus=1))["Open files"]
    assert found.fixes[0].startswith("ulimit -n 4096") and "limits.conf" in found.fixes[0]


@pytest.mark.parametrize("temperature", [60, 79, 80, 85, 90, 95])
@pytest.mark.parametrize("reasons, utilization", [
    ([], 0), (["gpu_idle"], 0), (["sw_power_cap"], 0), (["sw_power_cap"], 97), (["sw_power_cap"], None),
    (["sw_thermal_slowdown"], 90), (["hw_slowdown"], 90), (["hw_power_brake_slowdown"], 0),
    (["sw_thermal_slowdown", "sw_power_cap"], 20)])
def test_doctor_grades_a_card_as_telemetry_alerts_on_it(temperature, reasons, utilization):
    """One judgement of temperature and clocks: a card the doctor passes raises no alert while training, and
    what alerts while training the doctor flags too."""
    from trainwise.telemetry.alerts import AlertRules

    gpu = h200(temperature_c=temperature, throttle_reasons=reasons, utilization_pct=utilization, fan_pct=50)
    found = health(gpu)
    alerts = {a.code: a.severity for a in AlertRules(TelemetryConfig()).check_sample(
        {"gpus": [{"index": 0, "temperature_c": temperature, "throttle_reasons": reasons,
                   "utilization_pct": utilization}]})}
    # the same record and the same codes: a silent alert rule is a doctor check that passed (info)
    assert found["temperature"].code == "gpu_temperature" and found["clocks"].code == "gpu_throttle"
    assert found["temperature"].severity == alerts.get("gpu_temperature", "info")
    assert found["clocks"].severity == alerts.get("gpu_throttle", "info")
