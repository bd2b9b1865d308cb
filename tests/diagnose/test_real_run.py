"""A real healthy run of the breast-cancer MLP, diagnosed from its directory: nothing to warn about."""
from __future__ import annotations

from tests.conftest import tiny_config
from trainwise.diagnose.run_rules import diagnose_run, live_findings
from trainwise.launch import train_run


def test_a_real_healthy_run_gives_no_warning_or_error(tmp_path):
    run = train_run(tiny_config(train={"max_steps": 40, "log_every": 4}), tmp_path / "run")
    findings = diagnose_run(run.path)
    assert [f for f in findings if f.severity != "info"] == [], [f.to_dict() for f in findings]
    assert [f for f in live_findings(run.read_metrics()) if f.severity != "info"] == []
