"""The report's figures, read as matplotlib axes (limits, labels, tick text), not as pixels."""
from __future__ import annotations

import math

from tests.evaluate.fake_run import make_fake_run
from tests.evaluate.test_report import _images, _write_eval
from trainwise.evaluate.report import gather, write_report
from trainwise.evaluate.report_charts import figures, telemetry_figures
from trainwise.recipes import load_recipe
from trainwise.rundir.layout import RunDir


def _legend(figure):
    return [t.get_text() for t in figure.axes[0].get_legend().get_texts()]


def _tick_text(ax):
    ax.figure.canvas.draw()
    return [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text()]


def _host_samples(n):
    return [{"time": 100.0 + 2 * t, "cpu_percent": 40.0 + t, "ram_used_bytes": 3 * 2 ** 30,
             "ram_total_bytes": 8 * 2 ** 30, "rss_bytes": 2 ** 29, "gpus": []} for t in range(n)]


def test_two_samples_draw_no_chart_and_the_report_says_why(tmp_path):
    charts, notes = telemetry_figures(_host_samples(2))
    assert charts == [] and notes and all("only 2 samples" in note for note in notes)
    run = make_fake_run(tmp_path / "run", system=False)
    for sample in _host_samples(2):
        run.log_system(sample)
    html = write_report(run).read_text()
    assert "System telemetry" in html and "only 2 samples recorded, too few for a chart" in html
    assert len(_images(html)) == 5  # the training curves only: no telemetry chart from two points


def test_telemetry_legends_are_words_with_units_and_share_axes_start_at_zero(fake_run):
    charts, notes = telemetry_figures(fake_run.read_system())
    by_title = {figure.axes[0].get_title(): figure for figure in charts}
    assert set(by_title) == {"GPU temperature", "utilisation", "memory used", "GPU power"} and notes == []
    assert _legend(by_title["utilisation"]) == ["host CPU busy (%)", "GPU 0 utilisation (%)"]
    assert _legend(by_title["memory used"]) == ["GPU 0 memory used (GiB)"]
    assert _legend(by_title["GPU temperature"]) == ["GPU 0 temperature (°C)"]
    utilisation = by_title["utilisation"].axes[0]
    assert utilisation.get_ylim()[0] == 0 and utilisation.get_ylim()[1] >= 100
    memory = by_title["memory used"].axes[0]
    assert memory.get_ylim()[0] == 0 and memory.get_ylabel() == "GiB"
    assert not any("_" in label for figure in charts for label in _legend(figure))  # no raw field names


def test_host_ram_is_labelled_in_gib(tmp_path):
    charts, notes = telemetry_figures(_host_samples(4))
    memory = next(f for f in charts if f.axes[0].get_title() == "memory used")
    assert _legend(memory) == ["host RAM used (GiB)", "trainwise process RAM (GiB)"] and notes == []
    ys = memory.axes[0].get_lines()[0].get_ydata()
    assert all(math.isclose(y, 3.0) for y in ys)


def test_data_wait_share_axis_starts_at_zero(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.write_config(load_recipe("breast-cancer"))
    for i, step in enumerate(range(10, 100, 10)):
        run.log_metrics({"split": "train", "step": step, "loss": 0.1, "data_wait_fraction": 0.016 + 0.002 * i})
    ax = figures(gather(run))["data_wait"].axes[0]
    low, high = ax.get_ylim()
    assert low == 0 and 10 <= high < 50 and ax.get_ylabel() == "% of step time"
    assert max(ax.get_lines()[0].get_ydata()) < high / 3  # 1.6-3.2% stays low on the axis, not a spike
    assert _legend(ax.figure) == ["waiting for data (% of step time)"]


def test_log_loss_axis_has_plain_tick_labels(fake_run):
    ax = figures(gather(fake_run))["loss"].axes[0]
    assert ax.get_yscale() == "log"
    labels = _tick_text(ax)
    assert labels and not any("times" in t or "^" in t or "×" in t or "e-" in t for t in labels), labels
    assert all(float(t) > 0 for t in labels)


def test_calibration_chart_shows_bin_counts_and_ece_and_the_report_reads_it(fake_run):
    _write_eval(fake_run)
    facts = gather(fake_run)
    figure = figures(facts)["calibration"]
    reliability, counts = figure.axes
    assert reliability.get_title().startswith("calibration (ECE ")
    shown = sorted(int(t.get_text()) for t in counts.texts)
    assert shown == sorted(b["count"] for b in facts["evaluation"]["calibration_bins"]) == [5, 95]
    html = write_report(fake_run).read_text()
    # 95 samples at 0.8 confidence are right 94.7% of the time: under-confident
    assert "Calibration:</b> under-confident: accuracy above confidence in the high bins" in html
    assert "Calibration: under-confident" in write_report(fake_run, fmt="md").read_text()
