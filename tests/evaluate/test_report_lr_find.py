"""A run directory holding `trainwise lr-find`'s output gets an "LR range test" section in its report."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.evaluate.fake_run import make_fake_run
from tests.evaluate.test_report import _images
from trainwise.cli import app
from trainwise.evaluate.report import write_report


@pytest.mark.slow  # a real 20-step sweep of the breast-cancer recipe
def test_report_shows_the_lr_range_test_when_lr_find_wrote_into_the_run(tmp_path):
    run = make_fake_run(tmp_path / "run", system=False)
    before = len(_images(write_report(run).read_text()))
    result = CliRunner().invoke(app, ["lr-find", "breast-cancer", "--out", str(run.path), "--overwrite",
                                      "--steps", "20"])
    assert result.exit_code == 0, result.output
    found = json.loads((run.path / "lr_find.json").read_text())

    html = write_report(run).read_text()
    assert "<h2>LR range test</h2>" in html
    assert f"Suggested learning rate <b>{found['suggestion']:.3g}</b>" in html
    assert f"<code>{found['override']}</code>" in html and "this run used" in html
    assert len(_images(html)) == before + 1  # the curve
    text = write_report(run, fmt="md").read_text()
    assert "## LR range test" in text and f"`{found['override']}`" in text


def test_no_lr_find_no_section_and_a_damaged_one_is_named(fake_run):
    assert "LR range test" not in write_report(fake_run).read_text()
    (fake_run.path / "lr_find.json").write_text("{not json")
    html = write_report(fake_run).read_text()
    assert "LR range test" not in html and "lr_find.json is not an lr-find result" in html
