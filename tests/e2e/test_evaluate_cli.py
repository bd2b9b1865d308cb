"""`trainwise eval / report / compare / ablate` as a user runs them."""
from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from tests.conftest import invoke
from trainwise.cli import app
from trainwise.errors import TrainwiseError

FAST = ["train.max_steps=12", "schedule.warmup_steps=2", "eval.every_steps=6", "train.log_every=3",
        "telemetry.enabled=false"]
runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "bc"
    done = runner.invoke(app, ["train", "breast-cancer", *FAST, "--out", str(out)])
    assert done.exit_code == 0, done.output
    return out


@pytest.mark.slow
def test_eval_report_compare(run_dir, tmp_path):
    result = runner.invoke(app, ["eval", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "balanced accuracy" in result.output and "malignant" in result.output and "ROC-AUC" in result.output

    result = runner.invoke(app, ["eval", str(run_dir), "--split", "val", "--checkpoint", "last", "--json"])
    metrics = json.loads(result.output)
    assert metrics["split"] == "val" and metrics["checkpoint"] == "last" and 0 <= metrics["accuracy"] <= 1

    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0 and (run_dir / "report.html").is_file()
    assert "report.html" in result.output
    result = runner.invoke(app, ["report", str(run_dir), "--format", "md"])
    assert "| accuracy |" in (run_dir / "report.md").read_text()

    result = runner.invoke(app, ["compare", str(run_dir), str(run_dir), "--json"])
    comparison = json.loads(result.output)
    assert comparison["config_differences"] == {} and comparison["metrics"]["status"] == ["completed"] * 2


def test_bad_input_exits_2_with_the_reason(tmp_path, capsys):
    done = invoke(capsys, "eval", str(tmp_path / "missing"))  # cli.main, as `trainwise` runs it
    assert done.returncode == 2 and "not a run directory" in done.stderr and "Traceback" not in done.stderr
    # the same error family, in process (cli.main turns each into exit code 2)
    result = runner.invoke(app, ["ablate", "breast-cancer", "--vary", "optim.learning_rate=1", "--out",
                                 str(tmp_path / "a")])
    assert isinstance(result.exception, TrainwiseError)
    assert "unknown key 'optim.learning_rate'" in str(result.exception) and not (tmp_path / "a").exists()
    result = runner.invoke(app, ["report", str(tmp_path), "--format", "pdf"])
    assert isinstance(result.exception, TrainwiseError)


@pytest.mark.slow
def test_ablate_runs_each_variant_then_resumes(tmp_path):
    out = tmp_path / "ablation"
    args = ["ablate", "breast-cancer", *FAST, "--vary", "augmentation", "--seeds", "1", "--out", str(out),
            "--metric", "test/balanced_accuracy"]
    result = runner.invoke(app, args)  # in process; each run is its own `python -m trainwise train`
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "ablation.json").read_text())
    assert [v["name"] for v in summary["variants"]] == ["baseline", "data.augment=false"]
    assert all(v["n"] == 1 and 0 < v["mean"] <= 1 for v in summary["variants"]) and "paired" in summary["test"]
    assert (out / "data.augment-false" / "seed0" / "eval").is_dir()
    assert "train.max_steps=12" in (out / "logs" / "baseline-seed0.log").read_text()
    html = (out / "ablation.html").read_text()
    assert "data.augment=false" in html and "data:image/png;base64," in html
    said = " ".join(result.output.split())  # as read, whatever the terminal's width folded
    assert "data.augment=false: too few seeds to tell (need 2+ seeds" in said and "p exact / paired t / Welch" in html

    # an interrupted ablation: one run lost its summary and trains again; the other had finished training
    # but not its evaluation: its weights are reused and only the evaluation runs
    lost = out / "baseline" / "seed0" / "summary.json"
    lost.unlink()
    trained = out / "data.augment-false" / "seed0"
    shutil.rmtree(trained / "eval")
    kept = (trained / "model.safetensors").stat().st_mtime_ns
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    runs = json.loads((out / "ablation.json").read_text())["runs"]
    assert [r["reused"] for r in runs] == [False, True] and lost.is_file()
    assert (trained / "model.safetensors").stat().st_mtime_ns == kept and (trained / "eval").is_dir()
    assert "(reused)" in result.output
