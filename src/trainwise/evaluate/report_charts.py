"""The report's charts (matplotlib, imported only when drawing): training curves from metrics.jsonl, the
validation metrics on the axes their scales need, the confusion matrix and calibration of an evaluation,
telemetry, the LR range test; encoded as PNG data URIs for the self-contained HTML."""
from __future__ import annotations

import base64
from typing import Any

from trainwise.diagnose.curves import series

_NOT_METRICS = {"step", "epoch", "time", "split", "loss", "tokens"}  # tokens: what a text split counted
# telemetry charts: (title, y-axis label, {sample field: its legend, in the user's words}, scale from the
# recorded unit to the axis's, axis from 0, top the axis reaches at least). GPU fields get "GPU n " before.
TELEMETRY_CHARTS = (
    ("GPU temperature", "°C", {"temperature_c": "temperature (°C)"}, 1.0, False, None),
    ("utilisation", "% busy", {"utilization_pct": "utilisation (%)", "cpu_percent": "host CPU busy (%)"},
     1.0, True, 100.0),
    ("memory used", "GiB", {"memory_used_bytes": "memory used (GiB)", "ram_used_bytes": "host RAM used (GiB)",
                            "rss_bytes": "trainwise process RAM (GiB)"}, 2.0 ** -30, True, None),
    ("GPU power", "W", {"power_w": "power (W)"}, 1.0, True, None),
)
DATA_WAIT_AXIS_MIN_PERCENT = 10.0  # a 2% wait drawn on a 0-10% axis reads as small, which it is
MIN_TELEMETRY_SAMPLES = 3  # two points draw a straight line that says nothing about the run


def figures(facts: dict[str, Any]) -> dict[str, Any]:
    """The report's matplotlib figures, built but not encoded (None where there is nothing to draw)."""
    from trainwise.evaluate import plots  # matplotlib: only when drawing

    records, best = facts["records"], facts["analysis"].best
    best_step = best["step"] if best else None
    charts = {"loss": plots.line_chart("loss", {"train": series(records, "train", "loss"),
                                                "val": series(records, "val", "loss")},
                                       best_step=best_step, log_y=True)}
    shares, scaled = val_metric_axes(records)  # an accuracy beside a perplexity of 80 would be a flat line at 0
    for key, names, title in (("val_metrics", shares, "validation metrics"),
                              ("val_scaled", scaled, "validation metrics, own scale" if shares else "validation metrics")):
        charts[key] = plots.line_chart(title, {f"val {k.replace('_', ' ')}": series(records, "val", k) for k in names},
                                       best_step=best_step, log_y=key == "val_scaled")
    charts["lr"] = plots.line_chart("learning rate", {"train lr": series(records, "train", "lr")})
    rate = "tokens_per_s" if series(records, "train", "tokens_per_s") else "samples_per_s"
    unit = rate.replace("_per_s", "/s")
    charts["throughput"] = plots.line_chart("throughput", {f"train {unit}": series(records, "train", rate)},
                                            ylabel=unit, from_zero=True)
    charts["data_wait"] = plots.line_chart("share of step time waiting for data", {
        "waiting for data (% of step time)": [(x, 100 * y) for x, y in series(records, "train",
                                                                             "data_wait_fraction")]},
        ylabel="% of step time", from_zero=True, y_max=DATA_WAIT_AXIS_MIN_PERCENT)
    evaluation = facts["evaluation"] or {}
    matrix = evaluation.get("confusion_matrix")
    charts["confusion"] = (plots.confusion_heatmap(matrix["labels"], matrix["counts"], matrix["normalized"])
                           if matrix else None)
    charts["calibration"] = (plots.reliability_diagram(evaluation["calibration_bins"], evaluation["ece"])
                             if evaluation.get("calibration_bins") else None)
    charts["telemetry"], charts["telemetry_notes"] = telemetry_figures(facts["system"])
    return charts


def val_metric_axes(records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The validation metrics, parted by axis: shares (every value within 0..1: accuracies, AUC, NDCG) and
    the rest (perplexity, MAE, RMSE), drawn on a chart of their own."""
    values: dict[str, list[float]] = {}
    for record in records:
        if record.get("split") == "val":
            for key, value in record.items():
                if key not in _NOT_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    values.setdefault(key, []).append(float(value))
    shares = sorted(k for k, v in values.items() if all(0.0 <= x <= 1.0 for x in v))
    return shares, sorted(set(values) - set(shares))


def encoded_figures(facts: dict[str, Any]) -> dict[str, Any]:
    """figures(), each encoded as a PNG data URI for the HTML, and the lr-find curve from its JSON."""
    from trainwise.evaluate import plots

    charts = figures(facts)
    encoded = {key: plots.data_uri(figure) if figure is not None else None for key, figure in charts.items()
               if key not in ("telemetry", "telemetry_notes")}
    encoded["telemetry"] = [plots.data_uri(figure) for figure in charts["telemetry"]]
    encoded["telemetry_notes"] = charts["telemetry_notes"]
    encoded["lr_find"] = _lr_find_uri(facts["lr_find"]) if facts["lr_find"] else None
    return encoded


def telemetry_figures(samples: list[dict[str, Any]]) -> tuple[list[Any], list[str]]:
    """(figures, notes): one chart per TELEMETRY_CHARTS row that has a series of at least
    MIN_TELEMETRY_SAMPLES samples; a note saying why for each one that has fewer."""
    from trainwise.evaluate import plots

    if not samples:
        return [], []
    flat = [_flatten(s) for s in samples if isinstance(s.get("time"), (int, float))]
    start = min((s["time"] for s in flat), default=0.0)
    charts, notes = [], []
    for title, axis, fields, scale, from_zero, y_max in TELEMETRY_CHARTS:
        keys = sorted({k for s in flat for k, v in s.items() if k.rsplit(".", 1)[-1] in fields
                       and isinstance(v, (int, float)) and not isinstance(v, bool)})
        lines = {_telemetry_label(k, fields): [(s["time"] - start, s[k] * scale) for s in flat
                                               if isinstance(s.get(k), (int, float))] for k in keys}
        enough = {label: points for label, points in lines.items() if len(points) >= MIN_TELEMETRY_SAMPLES}
        if enough:
            charts.append(plots.line_chart(title, enough, xlabel="seconds since the first sample", ylabel=axis,
                                           from_zero=from_zero, y_max=y_max))
        elif lines:
            most = max(len(points) for points in lines.values())
            notes.append(f"{title}: only {most} sample{'s' if most != 1 else ''} recorded, too few for a chart "
                         f"(at least {MIN_TELEMETRY_SAMPLES}); a longer run, or a shorter "
                         "telemetry.interval_s, draws one.")
    return charts, notes


def _telemetry_label(key: str, fields: dict[str, str]) -> str:
    """"gpu0.memory_used_bytes" -> "GPU 0 memory used (GiB)"; host fields keep their own words."""
    prefix, _, field = key.rpartition(".")
    device = prefix.removeprefix("gpu")
    return f"GPU {device} {fields[field]}" if prefix.startswith("gpu") else fields[field]


def _lr_find_uri(data: dict[str, Any]) -> str | None:
    """The lr-find curve, drawn by lr-find's own renderer from the JSON it wrote."""
    from trainwise.diagnose.lr_curve import LrFindResult, SweepSettings, render_png

    try:
        result = LrFindResult(lrs=[float(x) for x in data["lrs"]], losses=[float(x) for x in data["losses"]],
                              smoothed=[float(x) for x in data["smoothed"]], suggestion=float(data["suggestion"]),
                              steps_planned=int(data.get("steps_planned", len(data["lrs"]))),
                              diverged=bool(data.get("diverged")),
                              settings=SweepSettings(**(data.get("settings") or {})), note=data.get("note", ""))
    except (KeyError, TypeError, ValueError):  # the numbers are shown in the section all the same
        return None
    return "data:image/png;base64," + base64.b64encode(render_png(result)).decode("ascii")


def _flatten(sample: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"gpus": [{"index": 0, "temperature_c": 60}]} -> {"gpu0.temperature_c": 60}."""
    out: dict[str, Any] = {}
    for key, value in sample.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for position, item in enumerate(value):
                index = item.get("index", position)
                out.update(_flatten({k: v for k, v in item.items() if k != "index"},
                                    f"{name.removesuffix('s')}{index}."))
        else:
            out[name] = value
    return out
