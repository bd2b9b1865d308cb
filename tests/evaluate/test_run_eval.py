"""evaluate_run on a real (tiny) trained run: rebuilt from its config, numbers equal to scikit-learn's."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from sklearn import metrics as sk

from trainwise.errors import DataError, RunDirError
from trainwise.evaluate.run_eval import eval_files, evaluate_run, read_eval
from trainwise.rundir.layout import RunDir

pytestmark = pytest.mark.slow  # the session's tiny training run takes ~5 s of CPU


def test_evaluate_run_writes_metrics_confusion_and_predictions(trained_run):
    result = evaluate_run(trained_run.path)
    files = eval_files(trained_run)
    assert read_eval(trained_run) == {k: v for k, v in result.items() if k != "files"}
    assert result["split"] == "test" and result["checkpoint"] == "best"
    assert result["step"] == trained_run.read_summary()["best"]["step"]

    with open(files["predictions"]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == result["samples"] == 114  # 20% of the 569 cases
    names = ["benign", "malignant"]
    targets = np.array([names.index(r["target"]) for r in rows])
    predicted = np.array([names.index(r["predicted"]) for r in rows])
    malignant = np.array([float(r["p_malignant"]) for r in rows])
    assert result["accuracy"] == pytest.approx(sk.accuracy_score(targets, predicted))
    assert result["balanced_accuracy"] == pytest.approx(sk.balanced_accuracy_score(targets, predicted))
    assert result["roc_auc"] == pytest.approx(sk.roc_auc_score(targets, malignant), abs=1e-4)
    assert result["confusion_matrix"]["counts"] == sk.confusion_matrix(targets, predicted).tolist()

    with open(files["confusion_matrix"]) as f:
        table = list(csv.reader(f))
    assert table[0] == ["true \\ predicted", "benign", "malignant"]
    assert [[int(x) for x in row[1:]] for row in table[1:]] == result["confusion_matrix"]["counts"]


def test_evaluate_other_splits_and_weights(trained_run):
    val = evaluate_run(trained_run, split="val", checkpoint="last")
    assert val["split"] == "val" and val["samples"] == 86 and val["step"] == 30
    final = evaluate_run(trained_run, checkpoint="final")
    assert final["weights"].endswith("model.safetensors")
    assert json.loads(eval_files(trained_run)["metrics"].read_text())["checkpoint"] == "final"


def test_bad_requests_name_the_fix(trained_run, tmp_path):
    with pytest.raises(DataError, match="choose one of train, val, test"):
        evaluate_run(trained_run, split="holdout")
    with pytest.raises(RunDirError, match="choose best, last or final"):
        evaluate_run(trained_run, checkpoint="newest")
    with pytest.raises(RunDirError, match="not a run directory"):
        evaluate_run(tmp_path / "nothing")


def test_missing_checkpoint_lists_what_is_there(trained_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trained_run.path, copy)
    run = RunDir(copy)
    for _, path in run.step_checkpoints():
        path.unlink()
    run.checkpoint_path("last").unlink()
    with pytest.raises(RunDirError, match="no `last` checkpoint.*--checkpoint best / final"):
        evaluate_run(copy, checkpoint="last")


def test_a_run_without_best_is_evaluated_on_its_last_checkpoint_with_a_note(trained_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trained_run.path, copy)
    RunDir(copy).checkpoint_path("best").unlink()  # as when every validation metric was NaN
    result = evaluate_run(copy, checkpoint="best")
    assert result["step"] == evaluate_run(trained_run, checkpoint="last")["step"]
    notes = [w["message"] for w in result["warnings"] if w["kind"] == "checkpoint_fallback"]
    assert notes and "no `best` checkpoint" in notes[0] and "evaluating the last weights" in notes[0]


def test_weights_that_do_not_fit_the_config_are_refused(trained_run, tmp_path):
    import shutil

    copy = tmp_path / "edited"
    shutil.copytree(trained_run.path, copy)
    config = RunDir(copy).config_path
    config.write_text(config.read_text().replace("- 64\n", "- 16\n", 1))  # hidden sizes edited after training
    with pytest.raises(RunDirError, match="does not fit the model built from"):
        evaluate_run(copy)
