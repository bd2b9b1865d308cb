"""`trainwise report RUN`: one self-contained file built from the run directory alone.

HTML (inline PNG figures and CSS, nothing fetched) or Markdown (for terminals and pull requests). Sections:
summary and status, warnings, diagnosis (the diagnose stage's findings), evaluation (headline metrics of the
held-out test split beside their baseline, other evaluated splits labelled beside it, per-class table,
confusion matrix, calibration with its verdict), the LR range test when `trainwise lr-find` wrote into the
run, training curves, system telemetry, events, the resolved config.
"""
from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path
from typing import Any, Literal

from trainwise.rundir.atomic import atomic_write_text
from trainwise.errors import ConfigError, TrainwiseError
from trainwise.diagnose.run_rules import RunFacts, diagnose
from trainwise.evaluate.curves import CurveAnalysis, best_point, series
from trainwise.evaluate.calibration import calibration_verdict
from trainwise.evaluate.report_recsys import recsys_section
from trainwise.evaluate.run_eval import read_evals
from trainwise.rundir.layout import RunDir

TEMPLATE = Path(__file__).with_name("report_template.html")
_NOT_METRICS = {"step", "epoch", "time", "split", "loss"}
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


def write_report(run_dir: str | os.PathLike | RunDir, fmt: Literal["html", "md"] = "html") -> Path:
    """Write RUN/report.html (or .md) and return its path."""
    if fmt not in ("html", "md"):
        raise ConfigError(f"--format {fmt!r}: choose html or md.")
    run = run_dir if isinstance(run_dir, RunDir) else RunDir.open(run_dir)
    facts = gather(run)
    text = render_html(facts) if fmt == "html" else render_markdown(facts)
    return atomic_write_text(run.report_path(fmt), text)


def gather(run: RunDir) -> dict[str, Any]:
    """Everything the report says, read from the run directory; no figures yet. What cannot be read (a
    damaged summary, malformed records) is left out and listed among the warnings."""
    damaged: list[str] = []
    try:
        config_text = run.read_config_text()
    except TrainwiseError as e:  # a damaged config.yaml: the rest of the run can still be reported
        config_text, damaged = "", [str(e)]
    try:
        config = run.read_config()
    except TrainwiseError:  # an older or hand-edited config still gets a report, from defaults
        config = None
    eval_config = config.eval if config else None
    records = run.read_metrics()
    evaluations = read_evals(run)  # the headline is the held-out test split; the others appear beside it
    evaluation = evaluations.get("test")
    events = run.read_events()
    warnings = [{"source": f"evaluation ({split} split)", **w}
                for split, e in evaluations.items() for w in e.get("warnings", [])]
    warnings += [{"source": "training", **e} for e in events if e.get("severity") in ("warning", "error")]
    summary = run.read_summary()
    system = run.read_system()
    # the Diagnosis section: the diagnose stage's findings over the same records (it owns the rules)
    diagnosis = diagnose(RunFacts(metrics=records, events=events, system=system, summary=summary, config=config))
    analysis = CurveAnalysis(best=best_point(records, eval_config.monitor if eval_config else "val/loss",
                                             eval_config.monitor_mode if eval_config else "auto"),
                             findings=diagnosis)
    lr_find, lr_find_problem = read_lr_find(run)
    live = run.liveness_note()
    warnings += [{"source": "run directory", "kind": "run_in_progress", "severity": "warning", "message": live}
                 ] if live else []
    warnings += [{"source": "run directory", "kind": "unreadable_record", "severity": "warning", "message": p}
                 for p in damaged + run.problems + ([lr_find_problem] if lr_find_problem else [])]
    calibration = (calibration_verdict(evaluation["calibration_bins"], evaluation["ece"])[1]
                   if evaluation and evaluation.get("calibration_bins") else None)
    return {
        "run": run, "name": (config.name if config and config.name else run.path.name), "path": str(run.path),
        "summary": summary, "status": run.status(), "config_text": config_text,
        "records": records, "analysis": analysis, "diagnosis": diagnosis, "evaluation": evaluation, "events": events,
        "warnings": sorted(warnings, key=lambda w: {"error": 0, "warning": 1}.get(w.get("severity"), 2)),
        "system": system, "headline": headline(evaluation) if evaluation else [],
        "evaluations": evaluations, "split_table": split_table(evaluations), "calibration_verdict": calibration,
        "lr_find": lr_find, "configured_lr": config.optim.lr if config else None,
        "recommender": recsys_section(run),  # None unless a recommender run (evaluate/report_recsys.py)
    }


def split_table(evaluations: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, str], str]]:
    """(metric, {split: value}, what to compare the test value with): the headline rows of every evaluated
    split, the test split first."""
    rows: dict[str, tuple[dict[str, str], str]] = {}
    for split, evaluation in evaluations.items():
        for metric, value, compare in headline(evaluation):
            values, _ = rows.setdefault(metric, ({}, compare if split == "test" else ""))
            values[split] = value
    return [(metric, values, compare) for metric, (values, compare) in rows.items()]


def read_lr_find(run: RunDir) -> tuple[dict[str, Any] | None, str | None]:
    """RUN/lr_find.json (written by `trainwise lr-find ... --out RUN`) and a problem to report when it is
    there but unreadable."""
    path = run.lr_find_paths[0]
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        float(data["suggestion"]), str(data["override"]), list(data["lrs"])
    except (ValueError, KeyError, TypeError) as e:
        return None, (f"{path} is not an lr-find result ({type(e).__name__}: {e}); run `trainwise lr-find` "
                      f"again with --out {run.path} --overwrite.")
    return data, None


def headline(evaluation: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, value, what to compare it with) rows for the top of the evaluation section."""
    task = evaluation.get("task")
    rows: list[tuple[str, str, str]] = []
    if task == "classification":
        base = evaluation["majority_baseline"]
        rows += [("accuracy", _fmt(evaluation["accuracy"]), f"always {base['class']!r}: {_fmt(base['accuracy'])}"),
                 ("balanced accuracy", _fmt(evaluation["balanced_accuracy"]),
                  f"chance: {_fmt(base['balanced_accuracy'])}"),
                 ("macro F1", _fmt(evaluation["macro"]["f1"]), ""),
                 ("weighted F1", _fmt(evaluation["weighted"]["f1"]), "")]
        if "roc_auc" in evaluation:
            rows += [("ROC-AUC", _fmt(evaluation["roc_auc"]), "random: 0.5"),
                     ("PR-AUC", _fmt(evaluation["pr_auc"]),
                      f"random: {_fmt(evaluation.get('pr_auc_baseline'))}")]
        rows += [("calibration error (ECE)", _fmt(evaluation["ece"]), "0 = confidence matches accuracy"),
                 ("log loss", _fmt(evaluation["log_loss"]), "")]
    elif task == "regression":
        base = evaluation["mean_baseline"]
        rows += [("MAE", _fmt(evaluation["mae"]), f"predict the mean: {_fmt(base['mae'])}"),
                 ("RMSE", _fmt(evaluation["rmse"]), f"predict the mean: {_fmt(base['rmse'])}"),
                 ("R²", _fmt(evaluation["r2"]), "predict the mean: 0")]
    elif task == "ranking":
        chance = evaluation.get("random_baseline", {})
        rows.append(("MRR", _fmt(evaluation["mrr"]), ""))
        for key in sorted(k for k in evaluation if k.startswith(("hr@", "ndcg@"))):
            rows.append((key.upper(), _fmt(evaluation[key]),
                         f"random: {_fmt(chance[key])}" if key in chance else ""))
    rows.append(("samples", str(evaluation.get("samples")), ""))
    return rows


def figures(facts: dict[str, Any]) -> dict[str, Any]:
    """The report's matplotlib figures, built but not encoded (None where there is nothing to draw)."""
    from trainwise.evaluate import plots  # matplotlib: only when drawing

    records, best = facts["records"], facts["analysis"].best
    best_step = best["step"] if best else None
    charts = {"loss": plots.line_chart("loss", {"train": series(records, "train", "loss"),
                                                "val": series(records, "val", "loss")},
                                       best_step=best_step, log_y=True)}
    val_metrics = sorted({k for r in records if r.get("split") == "val" for k, v in r.items()
                          if k not in _NOT_METRICS and isinstance(v, (int, float))})
    charts["val_metrics"] = plots.line_chart("validation metrics", {
        f"val {k.replace('_', ' ')}": series(records, "val", k) for k in val_metrics}, best_step=best_step)
    charts["lr"] = plots.line_chart("learning rate", {"train lr": series(records, "train", "lr")})
    charts["throughput"] = plots.line_chart("throughput", {"train samples/s": series(records, "train",
                                                                                      "samples_per_s")},
                                            ylabel="samples/s", from_zero=True)
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


def render_html(facts: dict[str, Any]) -> str:
    import jinja2

    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    environment.filters["fmt"] = _fmt
    template = environment.from_string(TEMPLATE.read_text(encoding="utf-8"))
    return template.render(**facts, charts=encoded_figures(facts))


def render_markdown(facts: dict[str, Any]) -> str:
    summary, best = facts["summary"], facts["analysis"].best
    lines = [f"# Report: {facts['name']}", "", f"`{facts['path']}` — status **{facts['status']}** after "
             f"{summary.get('steps', 0)} steps"]
    if best:
        lines[-1] += f"; best {best['metric']} = {_fmt(best['value'])} at step {best['step']}"
    if summary.get("message"):
        lines += ["", f"> {summary['message']}"]
    lines += ["", "## Warnings and diagnoses", ""]
    lines += [f"- **{w.get('severity', 'info')}** ({w['source']}, {w.get('kind')}): {w.get('message')}"
              + (f" — *{w['recommendation']}*" if w.get("recommendation") else "")
              for w in facts["warnings"]] or ["None found."]
    lines += ["", "## Diagnosis", ""]
    lines += [f"- **{f.severity}** `{f.code}`" + (f" at step {f.step}" if f.step is not None else "") +
              f": {f.title}. {f.detail}" + (f" — *{f.fixes[0]}*" if f.fixes else "")
              for f in facts["diagnosis"]] or ["No findings: the curves, throughput, memory and GPUs look healthy."]
    lines += ["", "## Evaluation", ""] + _markdown_evaluation(facts)
    lines += facts["recommender"].markdown() if facts.get("recommender") else []
    lr_find = facts["lr_find"]
    if lr_find:
        lines += ["", "## LR range test", "", f"Suggested learning rate **{lr_find['suggestion']:.3g}**: "
                  f"train with `{lr_find['override']}`" + (f" (this run used {_fmt(facts['configured_lr'])})."
                                                          if facts["configured_lr"] is not None else ".")]
        lines += [f"> {lr_find['note']}"] if lr_find.get("note") else []
    final = summary.get("final") or {}
    if final:
        lines += ["", "## Last validation", "", " · ".join(f"{k} {_fmt(v)}" for k, v in final.items()
                                                           if k not in ("time", "split"))]
    lines += ["", "## Config", "", "```yaml", facts["config_text"].rstrip(), "```", ""]
    return "\n".join(lines)


def _markdown_evaluation(facts: dict[str, Any]) -> list[str]:
    evaluation, evaluations = facts["evaluation"], facts["evaluations"]
    lines: list[str] = []
    if not evaluation:
        lines.append(f"No test evaluation yet: run `trainwise eval {facts['path']}` (it measures the held-out "
                     "test split)." + (" Other splits below." if evaluations else ""))
    if not evaluations:
        return lines
    lines += [f"Split `{split}`: weights `{e.get('checkpoint')}` (step {e.get('step')}), {e.get('samples')} "
              "samples." for split, e in evaluations.items()]
    others = [split for split in evaluations if split != "test"]
    head = (["test", "compare with"] if evaluation else []) + others
    lines += ["", "| metric | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for metric, values, compare in facts["split_table"]:
        cells = ([values.get("test", "—"), compare] if evaluation else []) + [values.get(s, "—") for s in others]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    if facts["calibration_verdict"]:
        lines += ["", f"Calibration: {facts['calibration_verdict']}"]
    if evaluation and evaluation.get("per_class"):
        lines += ["", "| class | precision | recall | F1 | support | predicted |", "|---|---|---|---|---|---|"]
        lines += [f"| {c['class']} | {_fmt(c['precision'])} | {_fmt(c['recall'])} | {_fmt(c['f1'])} | "
                  f"{c['support']} | {c['predicted']} |" for c in evaluation["per_class"]]
        matrix = evaluation["confusion_matrix"]
        lines += ["", "Confusion matrix (rows: true, columns: predicted):", "",
                  "| true \\ predicted | " + " | ".join(matrix["labels"]) + " |",
                  "|---|" + "---|" * len(matrix["labels"])]
        lines += [f"| {label} | " + " | ".join(str(c) for c in row) + " |"
                  for label, row in zip(matrix["labels"], matrix["counts"])]
    return lines


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


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)
