"""The report and `compare` as a first hour reads them (issue 26): one number format, evidence as rows, no
stale SIGTERM advice after a completed resume, the typical samples/s, ranks/strategy and no Python spellings."""
from tests.conftest import invoke, tiny_config
from trainwise.evaluate.readable import fmt, readable_evidence
from trainwise.evaluate.report import gather
from trainwise.findings import Finding
from trainwise.rundir.layout import RunDir
from trainwise.rundir.records import typical_rate


def test_one_number_format():
    assert [fmt(v) for v in (1, 0.931, 0.96431, 10300.0, 3e-05, 0.0, True, None)] == \
        ["1", "0.931", "0.9643", "10,300", "3e-05", "0", "yes", "—"]


def test_a_finding_recorded_as_evidence_reads_as_rows():
    finding = Finding("overfit_probe_slow", "warn", "one batch is not memorised", "detail",
                      {"steps": 40, "loss_ratio": 0.97123, "rule": "x"}, ("fix it",))
    rows = dict(readable_evidence(finding.to_dict()))
    assert rows == {"steps": "40", "loss_ratio": "0.9712", "rule": "x"}


def _run(path, *, ranks, strategy, flag):
    run = RunDir.create(path)
    run.write_config(tiny_config(model={"compile": flag}))
    run.log_event("started", "training", step=0, evidence={"ranks": ranks, "strategy": strategy})
    run.write_summary({"status": "completed", "steps": 30, "timings": {"wall_s": 12.0}})
    return run


def test_a_completed_resume_does_not_open_with_the_old_stop(tmp_path):
    run = _run(tmp_path / "r", ranks=1, strategy="single", flag=False)
    run.log_event("stopped", "stopped by SIGTERM after step 12; Continue with: trainwise resume r",
                  severity="warning", step=12)
    run.log_event("resumed", "resumed from step 12", step=12)
    assert not [w for w in gather(run)["warnings"] if w.get("kind") == "stopped"]
    assert any(e.get("kind") == "stopped" for e in gather(run)["events"])  # the history keeps it


def test_samples_per_s_is_the_typical_rate():
    assert typical_rate([900.0, 6000.0, 5800.0, 6100.0, 222.0]) == 5900.0
    assert typical_rate([]) is None


def test_compare_shows_ranks_and_strategy_in_yaml_spelling(tmp_path, capsys):
    a = _run(tmp_path / "a", ranks=1, strategy="single", flag=False)
    b = _run(tmp_path / "b", ranks=2, strategy="ddp", flag=True)
    result = invoke(capsys, "compare", str(a.path), str(b.path))
    assert result.returncode == 0, result.stderr
    assert "ranks" in result.stdout and "ddp" in result.stdout and "true" in result.stdout
    assert "True" not in result.stdout and "None" not in result.stdout
