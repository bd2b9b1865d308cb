"""The report: one self-contained file, built from the run directory alone, readable in a browser."""
from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image, ImageStat

from tests.evaluate.fake_run import make_fake_run
from trainwise.rundir.atomic import atomic_write_json
from trainwise.errors import ConfigError
from trainwise.evaluate.metric_warnings import metric_warnings
from trainwise.evaluate.metrics import classification_metrics
from trainwise.evaluate.report import write_report
from trainwise.evaluate.run_eval import eval_files

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def _write_eval(run):
    targets = np.array([0] * 90 + [1] * 10)
    probabilities = np.tile([0.8, 0.2], (100, 1))
    probabilities[95:] = [0.3, 0.7]  # finds half the malignant cases
    m = classification_metrics(targets, probabilities, ["benign", "malignant"])
    atomic_write_json(eval_files(run)["metrics"], {"split": "test", "checkpoint": "best", "step": 100, **m,
                                                   "warnings": metric_warnings(m)})


def _images(html):
    return [Image.open(io.BytesIO(base64.b64decode(data)))
            for data in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


def _not_blank(image):
    stat = ImageStat.Stat(image.convert("L"))
    return stat.stddev[0] > 5 and len(image.convert("L").getcolors(1 << 16) or []) > 10


def test_html_report_is_self_contained_with_every_section(fake_run):
    _write_eval(fake_run)
    path = write_report(fake_run)
    assert path == fake_run.report_path("html")
    html = path.read_text()
    assert not re.search(r'(src|href)="(https?:)?//', html), "the report must not fetch anything"
    for section in ("Warnings and diagnoses", "Evaluation", "Per class", "Training curves", "System telemetry",
                    "Events", "Resolved config"):
        assert section in html
    # curve finding, evaluation warning and the run's own warning event are all shown
    assert "overfitting" in html and "never_predicts_minority" not in html and "weak_class" in html
    assert "GPU 0 reached 83 °C" in html and "always &#39;benign&#39;: 0.9" in html
    images = _images(html)
    # loss, val metrics, lr, throughput, data wait, confusion, calibration, 4 telemetry charts
    assert len(images) == 11 and all(_not_blank(image) for image in images)


def test_report_without_evaluation_says_how_to_get_one(tmp_path):
    run = make_fake_run(tmp_path / "bare", system=False)
    html = write_report(run).read_text()
    assert f"trainwise eval {run.path}" in html and "System telemetry" not in html


def test_markdown_report_has_tables(fake_run):
    _write_eval(fake_run)
    text = write_report(fake_run, fmt="md").read_text()
    assert "| accuracy | 0.95 | always 'benign': 0.9 |" in text
    assert "| malignant | 1 | 0.5 | 0.6667 | 10 | 5 |" in text
    assert "| true \\ predicted | benign | malignant |" in text and "```yaml" in text
    with pytest.raises(ConfigError, match="html or md"):
        write_report(fake_run, fmt="pdf")


@pytest.fixture(scope="session")
def chromium():
    """A headless chromium, installed by set-up (`make test` installs it where apt-get and root allow); a
    test never installs anything."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no chromium on PATH: `make browser` installs it (needs root and apt-get), or "
                    "`sudo apt-get install chromium`")
    return found


@pytest.mark.slow
def test_report_renders_in_headless_chromium(fake_run, chromium, tmp_path):
    _write_eval(fake_run)
    report = write_report(fake_run)
    # a copy that records, once loaded, the size each image decoded to
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", (
        "<script>window.addEventListener('load', () => document.body.setAttribute('data-images',"
        " Array.from(document.images).map(i => i.naturalWidth + 'x' + i.naturalHeight).join(',')));"
        "</script></body>")))
    common = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,2000"]
    dom = subprocess.run([*common, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    sizes = re.search(r'data-images="([^"]*)"', dom).group(1).split(",")
    assert len(sizes) == 11 and all(int(w) > 100 and int(h) > 100 for w, h in (s.split("x") for s in sizes))

    shot = tmp_path / "shot.png"
    subprocess.run([*common, f"--screenshot={shot}", report.as_uri()], capture_output=True, timeout=120)
    page = Image.open(shot)
    assert page.size == (1200, 2000) and _not_blank(page)
    # the top of the page (title, status, warnings) and the curves further down both carry content
    assert _not_blank(page.crop((0, 0, 1200, 400))) and _not_blank(page.crop((0, 1000, 1200, 2000)))


def test_report_of_a_run_that_logged_nothing(tmp_path):
    from trainwise.recipes import load_recipe
    from trainwise.rundir.layout import RunDir

    run = RunDir.create(tmp_path / "empty")
    run.write_config(load_recipe("digits"))
    run.write_summary({"status": "failed", "steps": 0, "message": "CUDA out of memory at step 0"})
    html = write_report(run).read_text()
    assert "status-failed" in html and "CUDA out of memory at step 0" in html
    assert "metrics.jsonl is empty" in html and _images(html) == []


def test_no_test_installs_software():
    """Installing is set-up (the Makefile's `browser` step), never something a test does behind the user's back."""
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    needle = "apt-get" + '", "install'
    offenders = [str(p) for p in tests.rglob("*.py") if needle in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_make_browser_never_fails_where_chromium_cannot_be_installed(tmp_path):
    """No chromium and no apt-get on PATH: one line says how to install it, and the step still succeeds."""
    from pathlib import Path

    make = shutil.which("make")
    if not make:
        pytest.skip("no `make` on this machine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "id"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([make, "--no-print-directory", "-C", str(root), "browser"], capture_output=True,
                          text=True, env={"PATH": str(bin_dir)}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        "no chromium: the report's browser test will skip (install it with: sudo apt-get install chromium)"]
