"""Alert rules: thresholds, one event per episode, escalation, re-arming, and data starvation."""
import pytest

from trainwise.config import TelemetryConfig
from trainwise.errors import ConfigError
from trainwise.telemetry.alerts import (AlertRules, is_starved, temperature_level, thresholds_from,
                                        throttle_level)

SETTINGS = TelemetryConfig()


def sample(*gpus):
    return {"time": 0.0, "gpus": [{"index": i, **g} for i, g in enumerate(gpus)]}


@pytest.mark.parametrize("temperature, level", [(None, None), (79.9, None), (80, "warning"), (90, "error")])
def test_temperature_level(temperature, level):
    assert temperature_level(temperature, SETTINGS) == level


@pytest.mark.parametrize("reasons, level", [
    (None, None), (["gpu_idle", "sync_boost"], None), (["sw_power_cap"], ("info", ["sw_power_cap"])),
    (["sw_thermal_slowdown", "sw_power_cap"], ("warning", ["sw_thermal_slowdown"])),
    (["hw_slowdown", "sw_thermal_slowdown"], ("error", ["hw_slowdown"]))])
def test_throttle_level(reasons, level):
    assert throttle_level(reasons) == level


@pytest.mark.parametrize("utilization, level", [(None, "info"), (97, "info"), (50, "info"), (10, "warning")])
def test_a_power_cap_is_normal_under_load_and_suspicious_when_idle(utilization, level):
    assert throttle_level(["sw_power_cap"], utilization) == (level, ["sw_power_cap"])


def test_a_hot_episode_is_reported_once_escalates_and_rearms():
    rules = AlertRules(SETTINGS)
    first = rules.check_sample(sample({"temperature_c": 82}))
    assert [(a.code, a.severity) for a in first] == [("gpu_temperature", "warn")]
    assert "82 °C" in first[0].title and first[0].evidence["threshold_c"] == 80 and "nvidia-smi" in first[0].fixes[0]
    assert rules.check_sample(sample({"temperature_c": 84})) == []  # same episode
    worse = rules.check_sample(sample({"temperature_c": 91}))
    assert [(a.code, a.severity) for a in worse] == [("gpu_temperature", "error")]
    assert rules.check_sample(sample({"temperature_c": 85})) == []  # still hot, not new
    assert rules.check_sample(sample({"temperature_c": 60})) == []  # cleared
    assert len(rules.check_sample(sample({"temperature_c": 81}))) == 1  # a new episode


def test_each_gpu_has_its_own_episodes():
    rules = AlertRules(SETTINGS)
    alerts = rules.check_sample(sample({"temperature_c": 50}, {"temperature_c": 92, "throttle_reasons":
                                                               ["hw_thermal_slowdown"]}))
    assert {(a.code, a.evidence["gpu"]) for a in alerts} == {("gpu_temperature", 1), ("gpu_throttle", 1)}


def test_configured_thresholds_are_used():
    rules = AlertRules(TelemetryConfig(temperature_warn_c=70, temperature_fail_c=75))
    assert rules.check_sample(sample({"temperature_c": 76}))[0].severity == "error"


@pytest.mark.parametrize("wait, utils, starved", [
    (0.2, [10.0], False), (0.6, [95.0], False), (0.6, [20.0, 30.0], True), (0.6, [], True), (0.3, [], False)])
def test_is_starved(wait, utils, starved):
    assert is_starved(wait, utils, SETTINGS) is starved


def test_starvation_needs_two_high_readings_in_a_row_and_is_reported_once():
    rules = AlertRules(SETTINGS)
    assert rules.check_starvation(0.8, [12.0]) == []  # could be worker start-up
    assert rules.check_starvation(0.1, [90.0]) == []
    assert rules.check_starvation(0.8, [12.0]) == []
    alerts = rules.check_starvation(0.7, [15.0])
    assert [a.code for a in alerts] == ["data_starvation"] and "70%" in alerts[0].title
    assert alerts[0].severity == "warn" and "num_workers" in alerts[0].fixes[0]
    assert alerts[0].evidence["data_wait_fraction"] == 0.7
    assert rules.check_starvation(0.9, [10.0]) == []
    rules.check_starvation(0.05, [99.0])  # recovered: re-armed
    rules.check_starvation(0.8, [12.0])
    assert len(rules.check_starvation(0.8, [12.0])) == 1


def test_thresholds_from_names_the_bad_value():
    assert thresholds_from(temperature_warn_c=70, temperature_fail_c=85).temperature_fail_c == 85
    with pytest.raises(ConfigError, match="must be below"):
        thresholds_from(temperature_warn_c=90, temperature_fail_c=90)
    with pytest.raises(ConfigError, match="interval_s"):
        thresholds_from(interval_s=0)


def test_alerts_are_the_products_one_finding_record():
    from trainwise.findings import Finding

    rules = AlertRules(SETTINGS)
    found = rules.check_sample(sample({"temperature_c": 95, "throttle_reasons": ["sw_power_cap"],
                                       "utilization_pct": 5}))
    assert all(isinstance(f, Finding) and f.title and f.evidence and f.fixes for f in found)
    assert {f.code: f.severity for f in found} == {"gpu_temperature": "error", "gpu_throttle": "warn"}
    assert Finding.from_dict(found[0].to_dict()) == found[0]
