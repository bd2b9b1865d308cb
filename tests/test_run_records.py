"""Damaged side files of a run: readers skip and name what they cannot use; a torn last line is expected."""
from __future__ import annotations

import json

import pytest

from tests.evaluate.fake_run import make_fake_run
from trainwise.errors import DamagedFileError, RunDirWarning
from trainwise.evaluate.report import gather
from trainwise.rundir.layout import RunDir


@pytest.fixture
def run(tmp_path) -> RunDir:
    return make_fake_run(tmp_path / "run")


def _append_raw(path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_malformed_metric_lines_are_skipped_and_named_by_file_and_line(run):
    good = len(run.read_metrics())
    _append_raw(run.metrics_path, '{"step": "abc", "split": "val", "loss": 1}\n[1, 2, 3]\nnot json\n')
    lines = len(run.metrics_path.read_text().splitlines())
    with pytest.warns(RunDirWarning) as caught:
        records = run.read_metrics()
    assert len(records) == good and all(isinstance(r["step"], int) for r in records)
    messages = [str(w.message) for w in caught]
    assert messages == run.problems == [
        f"{run.metrics_path}:{lines - 2}: line skipped, it has \"step\" 'abc', not a whole number",
        f"{run.metrics_path}:{lines - 1}: line skipped, it is not a JSON object",
        f"{run.metrics_path}:{lines}: line skipped, it is not JSON (Expecting value)"]


def test_a_torn_last_line_is_skipped_silently_and_cut_off_before_the_next_append(run, recwarn):
    _append_raw(run.metrics_path, '{"split": "train", "step": 210, "lo')  # a crash mid-append
    steps = [r["step"] for r in run.read_metrics()]
    assert steps[-1] == 200 and run.problems == [] and not recwarn.list
    writer = RunDir(run.path)  # the resumed run
    writer.log_metrics({"split": "train", "step": 210, "loss": 0.1})
    assert [r["step"] for r in writer.read_metrics()][-2:] == [200, 210] and writer.problems == []
    assert run.metrics_path.read_text().endswith('"loss": 0.1}\n')


def test_bad_event_and_telemetry_lines_are_skipped(run):
    _append_raw(run.events_path, '"just a string"\n{"kind": "x", "step": 1.5, "message": "m"}\n')
    _append_raw(run.system_path, '{"time": "yesterday", "cpu_percent": 5}\n{"cpu_percent": 5}\n')
    with pytest.warns(RunDirWarning):
        events, samples = run.read_events(), run.read_system()
    assert [e["kind"] for e in events] == ["thermal"] and len(samples) == 5
    assert any("events.jsonl:2: line skipped, it is not a JSON object" in p for p in run.problems)
    assert any("events.jsonl:3: line skipped, it has \"step\" 1.5" in p for p in run.problems)
    assert any("system.jsonl:6: line skipped, it has \"time\" 'yesterday', not a finite number" in p
               for p in run.problems)
    assert any('system.jsonl:7: line skipped, it has no "time"' in p for p in run.problems)


def test_many_bad_lines_are_counted_not_listed(run):
    _append_raw(run.metrics_path, '{"step": null}\n' * 50)
    with pytest.warns(RunDirWarning):
        run.read_metrics()
    assert len(run.problems) == 4 and run.problems[-1].endswith("47 more bad lines skipped")


def test_a_truncated_summary_is_named_and_read_as_unknown(run):
    run.summary_path.write_text(run.summary_path.read_text()[:40])
    with pytest.warns(RunDirWarning, match="summary.json is damaged .*not valid JSON.*A resume rewrites it"):
        assert run.read_summary() == {}
    run.summary_path.write_text("[1, 2]")
    with pytest.warns(RunDirWarning, match="not a JSON object"):
        assert run.read_summary() == {}


def test_a_config_that_is_not_text_is_named_as_damaged(run):
    run.config_path.write_bytes(b"\xff" + run.config_path.read_bytes())
    with pytest.raises(DamagedFileError, match=r"config.yaml is damaged: byte 0xff at offset 0 is not text"):
        run.read_config()


def test_resume_drops_later_metrics_past_bad_lines(run):
    _append_raw(run.metrics_path, '{"step": "abc"}\n')
    with pytest.warns(RunDirWarning):
        run.drop_metrics_after(100)
    assert max(r["step"] for r in run.read_metrics()) == 100


def test_the_report_of_a_damaged_run_lists_what_it_skipped(run):
    _append_raw(run.metrics_path, '{"step": "abc"}\n')
    _append_raw(run.events_path, '"a string"\n')
    run.summary_path.write_text('{"status": "compl')
    run.config_path.write_bytes(b"\xff\xfe")
    with pytest.warns(RunDirWarning):
        facts = gather(run)
    skipped = [w["message"] for w in facts["warnings"] if w["source"] == "run directory"]
    assert len(skipped) == 4 and facts["status"] == "unknown"
    assert any("config.yaml is damaged" in m for m in skipped)
    assert any("metrics.jsonl:" in m for m in skipped) and any("events.jsonl:" in m for m in skipped)


def test_records_round_trip_through_the_writer(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.log_metrics({"split": "val", "step": 3, "loss": float("nan")})
    run.log_event("x", "message", step=None)
    assert json.loads(run.metrics_path.read_text().replace("NaN", "null"))["step"] == 3
    assert len(run.read_metrics()) == 1 and len(run.read_events()) == 1 and run.problems == []


def test_compare_names_a_damaged_config_instead_of_a_traceback(run, tmp_path):
    from trainwise.evaluate.compare import compare_runs
    from trainwise.errors import RunDirError

    other = make_fake_run(tmp_path / "other")
    run.config_path.write_bytes(b"\xff\xfe")
    with pytest.raises(DamagedFileError, match="config.yaml is damaged"):
        compare_runs([run.path, other.path])
    run.config_path.write_text("model: [unclosed\n")
    with pytest.raises(RunDirError, match="config.yaml is damaged: not valid YAML"):
        compare_runs([run.path, other.path])
