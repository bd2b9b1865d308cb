"""The report's headline is the held-out test split, whatever `eval` ran last; other splits appear labelled."""
from __future__ import annotations

import re
import shutil

import pytest

from tests.evaluate.test_report import _write_eval
from trainwise.evaluate.report import write_report
from trainwise.evaluate.run_eval import eval_files, evaluate_run, read_eval, read_evals
from trainwise.rundir.layout import RunDir


def _copy(run: RunDir, path) -> RunDir:
    """The session's trained run without its evaluations (other modules evaluate it in place)."""
    shutil.copytree(run.path, path, ignore=lambda folder, names: ["eval"] if folder == str(run.path) else [])
    return RunDir(path)


@pytest.mark.slow  # evaluates the session's tiny trained run
def test_eval_test_then_train_keeps_the_test_headline(trained_run, tmp_path):
    run = _copy(trained_run, tmp_path / "run")
    test = evaluate_run(run, split="test")
    train = evaluate_run(run, split="train")
    assert read_eval(run)["split"] == "train"  # metrics.json: the latest, as before
    assert read_eval(run, "test") == {k: v for k, v in test.items() if k != "files"}
    assert list(read_evals(run)) == ["test", "train"]
    assert eval_files(run, "test")["split_metrics"].name == "metrics-test.json"

    html = write_report(run).read_text()
    assert "No test evaluation yet" not in html
    assert "<th>test (held out)</th>" in html and "<th>train</th>" in html
    row = re.search(r"<tr><td>accuracy</td>(.*?)</tr>", html, re.S).group(1)
    cells = re.findall(r"<td[^>]*>(?:<b>)?([^<]*)", row)
    assert cells[0] == f"{test['accuracy']:.4g}" and cells[-1] == f"{train['accuracy']:.4g}"
    assert f"{test['samples']} samples" in html and f"{train['samples']} samples" in html

    text = write_report(run, fmt="md").read_text()
    assert "| metric | test | compare with | train |" in text
    assert f"| samples | {test['samples']} |  | {train['samples']} |" in text


@pytest.mark.slow
def test_without_a_test_evaluation_the_report_says_so_and_labels_what_there_is(trained_run, tmp_path):
    run = _copy(trained_run, tmp_path / "run")
    val = evaluate_run(run, split="val")
    html = write_report(run).read_text()
    assert f"No test evaluation yet:</b> run <code>trainwise eval {run.path}</code>" in html
    assert "<th>val</th>" in html and "test (held out)" not in html and "Per class" not in html
    assert f"{val['samples']} samples" in html
    text = write_report(run, fmt="md").read_text()
    assert f"No test evaluation yet: run `trainwise eval {run.path}`" in text and "| metric | val |" in text


def test_an_old_metrics_json_still_counts_for_its_split(fake_run):
    _write_eval(fake_run)  # writes only eval/metrics.json, as trainwise did before splits were kept apart
    assert read_eval(fake_run, "test")["split"] == "test" and read_eval(fake_run, "train") is None
    assert list(read_evals(fake_run)) == ["test"]
