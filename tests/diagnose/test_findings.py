"""The one Finding record: validation, the JSON round trip, and worst-first ordering."""
import dataclasses
import json

import pytest

from trainwise.diagnose import Finding, worst, worst_first


def finding(code="gpu_temperature", severity="warn", step=None, **fields):
    return Finding(code=code, severity=severity, title=fields.pop("title", "GPU 0 at 84 °C"), step=step, **fields)


def test_round_trip_through_json_keeps_everything():
    original = finding(detail="Above the warning threshold.", evidence={"temperature_c": 84, "gpu": 0},
                       fixes=["Check the fans: `nvidia-smi -q -d TEMPERATURE`", "Lower the power limit"], step=120)
    raw = json.loads(json.dumps(original.to_dict()))
    assert raw == {"code": "gpu_temperature", "severity": "warn", "title": "GPU 0 at 84 °C",
                   "detail": "Above the warning threshold.", "evidence": {"temperature_c": 84, "gpu": 0},
                   "fixes": ["Check the fans: `nvidia-smi -q -d TEMPERATURE`", "Lower the power limit"],
                   "step": 120}
    assert Finding.from_dict(raw) == original
    assert isinstance(original.fixes, tuple)   # a list given is stored as a tuple: the record is frozen


def test_the_dict_is_a_copy():
    original = finding(evidence={"lines": [{"line": 1, "text": "x"}]})
    raw = original.to_dict()
    raw["evidence"]["lines"].append("changed")
    assert original.evidence["lines"] == [{"line": 1, "text": "x"}]
    with pytest.raises(dataclasses.FrozenInstanceError):
        original.severity = "error"


@pytest.mark.parametrize("legacy, severity", [("ok", "info"), ("warning", "warn"), ("fail", "error")])
def test_the_old_severity_words_are_read_as_the_new_ones(legacy, severity):
    assert finding(severity=legacy).severity == severity
    assert Finding.from_dict({"code": "x", "severity": legacy, "title": "t"}).severity == severity


@pytest.mark.parametrize("bad", [dict(severity="critical"), dict(code=""), dict(title=""), dict(title="two\nlines")])
def test_invalid_records_are_refused(bad):
    with pytest.raises(ValueError):
        finding(**bad)


def test_worst_first_orders_by_severity_then_step_then_given_order():
    info, late_warn, early_warn, error, warn_without_step = (
        finding("a", "info", 1), finding("b", "warn", 50), finding("c", "warn", 10), finding("d", "error", 99),
        finding("e", "warn"))
    ordered = worst_first([info, late_warn, warn_without_step, early_warn, error])
    assert [f.code for f in ordered] == ["d", "c", "b", "e", "a"]
    assert worst([info, late_warn]) == "warn" and worst([]) is None and worst([error, info]) == "error"
