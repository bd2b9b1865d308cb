"""`trainwise report RUN`: one self-contained file built from the run directory alone.

HTML (inline PNG figures and CSS, nothing fetched) or Markdown (for terminals and pull requests). Sections:
summary and status, warnings, diagnosis (the diagnose stage's findings), evaluation (headline metrics beside
their baseline, per-class table, confusion matrix, calibration), training curves, system telemetry, events,
the resolved config.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

from trainwise.atomic import atomic_write_text
from trainwise.errors import ConfigError, TrainwiseError
from trainwise.diagnose.run_rules import RunFacts, diagnose
from trainwise.evaluate.curves import CurveAnalysis, best_point, series
from trainwise.evaluate.run_eval import read_eval
from trainwise.run import RunDir

TEMPLATE = Path(__file__).with_name("report_template.html")
_NOT_METRICS = {"step", "epoch", "time", "split", "loss"}
# telemetry sample fields drawn as charts: (title, words any of which the field name contains, scale)
TELEMETRY_CHARTS = (("GPU temperature (°C)", ("temperature",), 1.0),
                    ("utilisation (%)", ("utilization", "cpu_percent", "cpu_pct"), 1.0),
                    ("memory used (GiB)", ("memory_used", "ram_used", "mem_used"), 2.0 ** -30),
                    ("power (W)", ("power_w",), 1.0))


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
    evaluation = read_eval(run)
    events = run.read_events()
    warnings = [{"source": "evaluation", **w} for w in (evaluation or {}).get("warnings", [])]
    warnings += [{"source": "training", **e} for e in events if e.get("severity") in ("warning", "error")]
    summary = run.read_summary()
    system = run.read_system()
    # the Diagnosis section: the diagnose stage's findings over the same records (it owns the rules)
    diagnosis = diagnose(RunFacts(metrics=records, events=events, system=system, summary=summary, config=config))
    analysis = CurveAnalysis(best=best_point(records, eval_config.monitor if eval_config else "val/loss",
                                             eval_config.monitor_mode if eval_config else "auto"),
                             findings=diagnosis)
    live = run.liveness_note()
    warnings += [{"source": "run directory", "kind": "run_in_progress", "severity": "warning", "message": live}
                 ] if live else []
    warnings += [{"source": "run directory", "kind": "unreadable_record", "severity": "warning", "message": p}
                 for p in damaged + run.problems]
    return {
        "run": run, "name": (config.name if config and config.name else run.path.name), "path": str(run.path),
        "summary": summary, "status": summary.get("status", "unknown"), "config_text": config_text,
        "records": records, "analysis": analysis, "diagnosis": diagnosis, "evaluation": evaluation, "events": events,
        "warnings": sorted(warnings, key=lambda w: {"error": 0, "warning": 1}.get(w.get("severity"), 2)),
        "system": system, "headline": headline(evaluation) if evaluation else [],
    }


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
    from trainwise.evaluate import plots  # matplotlib: only when drawing

    records, best = facts["records"], facts["analysis"].best
    best_step = best["step"] if best else None
    charts = {"loss": plots.line_chart("loss", {"train": series(records, "train", "loss"),
                                                "val": series(records, "val", "loss")},
                                       best_step=best_step, log_y=True)}
    val_metrics = sorted({k for r in records if r.get("split") == "val" for k, v in r.items()
                          if k not in _NOT_METRICS and isinstance(v, (int, float))})
    charts["val_metrics"] = plots.line_chart("validation metrics", {
        f"val {k}": series(records, "val", k) for k in val_metrics}, best_step=best_step)
    charts["lr"] = plots.line_chart("learning rate", {"train lr": series(records, "train", "lr")})
    charts["throughput"] = plots.line_chart("throughput", {"train samples/s": series(records, "train",
                                                                                      "samples_per_s")})
    charts["data_wait"] = plots.line_chart("share of step time waiting for data", {
        "train data_wait_fraction": series(records, "train", "data_wait_fraction")})
    evaluation = facts["evaluation"] or {}
    matrix = evaluation.get("confusion_matrix")
    charts["confusion"] = (plots.confusion_heatmap(matrix["labels"], matrix["counts"], matrix["normalized"])
                           if matrix else None)
    charts["calibration"] = (plots.reliability_diagram(evaluation["calibration_bins"], evaluation["ece"])
                             if evaluation.get("calibration_bins") else None)
    charts["telemetry"] = [c for c in telemetry_figures(facts["system"]) if c]
    return charts


def telemetry_figures(samples: list[dict[str, Any]]) -> list[str | None]:
    from trainwise.evaluate import plots

    if not samples:
        return []
    flat = [_flatten(s) for s in samples]
    start = min(s.get("time", 0.0) for s in flat)
    charts = []
    for title, words, scale in TELEMETRY_CHARTS:
        keys = sorted({k for s in flat for k, v in s.items() if isinstance(v, (int, float))
                       and not isinstance(v, bool) and any(w in k.rsplit(".", 1)[-1] for w in words)})
        lines = {k: [(s["time"] - start, s[k] * scale) for s in flat if isinstance(s.get(k), (int, float))
                     and "time" in s] for k in keys}
        if lines:
            charts.append(plots.line_chart(title, lines, xlabel="seconds"))
    return charts


def render_html(facts: dict[str, Any]) -> str:
    import jinja2

    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    environment.filters["fmt"] = _fmt
    template = environment.from_string(TEMPLATE.read_text(encoding="utf-8"))
    return template.render(**facts, charts=figures(facts))


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
    evaluation = facts["evaluation"]
    lines += ["", "## Evaluation", ""]
    if not evaluation:
        lines.append(f"Not evaluated yet: run `trainwise eval {facts['path']}`.")
    else:
        lines += [f"Split `{evaluation['split']}`, weights `{evaluation['checkpoint']}` (step "
                  f"{evaluation.get('step')}).", "", "| metric | value | compare with |", "|---|---|---|"]
        lines += [f"| {m} | {v} | {c} |" for m, v, c in facts["headline"]]
        if evaluation.get("per_class"):
            lines += ["", "| class | precision | recall | F1 | support | predicted |", "|---|---|---|---|---|---|"]
            lines += [f"| {c['class']} | {_fmt(c['precision'])} | {_fmt(c['recall'])} | {_fmt(c['f1'])} | "
                      f"{c['support']} | {c['predicted']} |" for c in evaluation["per_class"]]
            matrix = evaluation["confusion_matrix"]
            lines += ["", "Confusion matrix (rows: true, columns: predicted):", "",
                      "| true \\ predicted | " + " | ".join(matrix["labels"]) + " |",
                      "|---|" + "---|" * len(matrix["labels"])]
            lines += [f"| {label} | " + " | ".join(str(c) for c in row) + " |"
                      for label, row in zip(matrix["labels"], matrix["counts"])]
    final = summary.get("final") or {}
    if final:
        lines += ["", "## Last validation", "", " · ".join(f"{k} {_fmt(v)}" for k, v in final.items()
                                                           if k not in ("time", "split"))]
    lines += ["", "## Config", "", "```yaml", facts["config_text"].rstrip(), "```", ""]
    return "\n".join(lines)


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
