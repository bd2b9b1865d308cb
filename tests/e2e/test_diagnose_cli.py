"""`trainwise diagnose RUN [--json]` as a user runs it: findings worst first, one JSON line, exit 2 on bad
input with one clear line and no traceback."""
from __future__ import annotations

import json
import math

import pytest

from tests.conftest import invoke
from tests.diagnose.synthetic_run import make_run

pytestmark = pytest.mark.usefixtures("wide_terminal")


def _faulty(path):
    return make_run(path, train_loss=lambda s: float("nan") if s >= 300 else 1 / s,
                    data_wait=lambda s: 0.6)


def test_json_is_one_line_with_every_finding_worst_first(tmp_path, capsys):
    run = _faulty(tmp_path / "run")
    result = invoke(capsys, "diagnose", str(run.path), "--json")
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.strip().splitlines()
    report = json.loads(line)  # strict JSON: a NaN loss in the evidence is written as a string
    assert report["run"] == str(run.path)
    assert [f["code"] for f in report["findings"]][:2] == ["loss_nonfinite", "data_starved"]
    nonfinite = report["findings"][0]
    assert nonfinite["severity"] == "error" and nonfinite["step"] == 300 and nonfinite["evidence"]["loss"] == "nan"
    assert set(nonfinite) == {"code", "severity", "title", "detail", "evidence", "fixes", "step"}


def test_table_and_exit_0_with_or_without_findings(tmp_path, capsys):
    result = invoke(capsys, "diagnose", str(_faulty(tmp_path / "bad").path))
    assert result.returncode == 0 and "loss_nonfinite" in result.stdout and "300" in result.stdout
    healthy = make_run(tmp_path / "good", train_loss=lambda s: 0.1 + math.exp(-s / 50))
    result = invoke(capsys, "diagnose", str(healthy.path))
    assert result.returncode == 0 and "no findings" in result.stdout


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    result = invoke(capsys, "diagnose", str(tmp_path / "missing"), "--json")
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stdout == "", result
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "missing" in line and "not a run directory" in line, result.stderr
    assert not (tmp_path / "missing").exists()
    run = make_run(tmp_path / "run")
    run.metrics_path.unlink()
    before = sorted(p.name for p in run.path.iterdir())
    result = invoke(capsys, "diagnose", str(run.path))
    assert result.returncode == 2 and "no metrics yet" in result.stderr and "Traceback" not in result.stderr, result
    assert sorted(p.name for p in run.path.iterdir()) == before


def test_check_prints_one_json_line_and_exits_0_on_a_sound_recipe(capsys):
    result = invoke(capsys, "check", "breast-cancer", "train.batch_size=16", "--json")
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["recipe"] == "breast-cancer"
    probe = next(f for f in report["findings"] if f["code"] == "overfit_probe")
    assert probe["evidence"]["rows"] == 16 and all(f["severity"] == "info" for f in report["findings"])


def test_check_an_unknown_recipe_exits_2_with_one_line(capsys):
    result = invoke(capsys, "check", "no-such-recipe")
    assert result.returncode == 2 and "unknown recipe" in result.stderr and "Traceback" not in result.stderr
