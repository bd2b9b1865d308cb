"""The report's Diagnosis section lists the diagnose stage's findings, worst first, with step and fixes."""
from __future__ import annotations

import math

from tests.diagnose.synthetic_run import gpu_samples, make_run
from trainwise.evaluate.report import write_report


def test_the_report_lists_the_findings_worst_first(tmp_path):
    run = make_run(tmp_path / "run", train_loss=lambda s: math.exp(-s / 80),
                   val_loss=lambda s: 0.3 + (s - 200) ** 2 / 1e5, overrides=["eval.early_stopping.enabled=false"],
                   samples=gpu_samples(gpu=lambda s: {"temperature_c": 93 if s > 300 else 70}),
                   summary={"device": "cuda:0", "precision": "bf16"})
    html = write_report(run).read_text()
    section = html[html.index("<h2>Diagnosis</h2>"):]
    section = section[:section.index("</section>")]
    assert section.index("gpu_temperature") < section.index("overfitting")  # the error first
    assert "(step 200)" in section and "early_stopping" in section  # evidence as rows, not a Python dump:
    assert "<td>max_temperature_c</td><td>93</td>" in section
    markdown = write_report(run, "md").read_text()
    assert "## Diagnosis" in markdown and "**warn** `overfitting` at step 200" in markdown


def test_a_healthy_run_s_report_says_so(tmp_path):
    html = write_report(make_run(tmp_path / "run")).read_text()
    assert "No findings: the curves, throughput, memory and GPUs look healthy." in html
