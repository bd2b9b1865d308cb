"""`trainwise report RUN`: one self-contained file built from the run directory alone.

HTML (inline PNG figures and CSS, nothing fetched) or Markdown (for terminals and pull requests). Sections:
summary and status, warnings, diagnosis (the diagnose stage's findings), evaluation (headline metrics of the
held-out test split beside their baseline, other evaluated splits labelled beside it, per-class table,
confusion matrix, calibration with its verdict), the LR range test when `trainwise lr-find` wrote into the
run, training curves, system telemetry, events, the resolved config.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Literal

from trainwise.rundir.atomic import atomic_write_text
from trainwise.errors import ConfigError, RunDirWarning, TrainwiseError
from trainwise.diagnose.run_rules import RunFacts, diagnose
from trainwise.diagnose.curve_analysis import CurveAnalysis
from trainwise.diagnose.curves import best_point
from trainwise.evaluate.calibration import calibration_verdict
from trainwise.evaluate.report_charts import encoded_figures
from trainwise.evaluate.report_lm import language_model_section
from trainwise.evaluate.report_recsys import recsys_section
from trainwise.evaluate.readable import finding_text, readable_evidence
from trainwise.evaluate.readable import fmt as _fmt
from trainwise.evaluate.run_eval import read_evals
from trainwise.recipes import FROM_PYTHON
from trainwise.rundir.layout import RunDir

TEMPLATE = Path(__file__).with_name("report_template.html")


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
    except TrainwiseError as e:  # an older or hand-edited config still gets a report, from defaults
        config = None
        if config_text:  # (an unreadable one is already listed)
            first = visible_controls(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            damaged.append(f"{run.config_path} is not a config trainwise can read ({first}); this report uses the "
                           "defaults where the config matters (the monitored metric, the learning rate), and shows "
                           "the file as it is, control characters escaped.")
            _say(damaged[-1])
    config_text = visible_controls(config_text)
    eval_config = config.eval if config else None
    records = run.read_metrics()
    evaluations = read_evals(run)  # the headline is the held-out test split; the others appear beside it
    evaluation = evaluations.get("test")
    events = run.read_events()
    warnings = [{"source": f"evaluation ({split} split)", **w}
                for split, e in evaluations.items() for w in e.get("warnings", [])]
    warnings += [{"source": "training", **e} for i, e in enumerate(events)
                 if e.get("severity") in ("warning", "error") and not _resumed_since(e, events[i + 1:])]
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
        # trained from Python on the user's own model: the CLI cannot evaluate it (recipes.refuse_python_run)
        "python_run": python_run_note(config),
        # evaluate/report_lm.py; a fine-tune often holds out only a validation split
        "language_model": language_model_section(run, records, evaluation or evaluations.get("val"), config),
    }


def python_run_note(config: Any) -> str | None:
    """What the CLI can and cannot do for a run trained from Python on the user's own model and data."""
    if config is None or not str(config.model.name or "").startswith(FROM_PYTHON):
        return None
    return (f"Trained from Python on your own model ({config.model.name.removeprefix(FROM_PYTHON)}) and data "
            f"({str(config.data.name).removeprefix(FROM_PYTHON)}, {fmt_count(config.data.args)}): the CLI cannot "
            "build them again, so `trainwise eval` and `resume` do not apply; diagnose, report and compare read "
            "the run as it is. Evaluate it from Python: load model.safetensors into your model and call "
            "trainwise.train.predict.")


def fmt_count(args: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {_fmt(v)}" for k, v in args.items()) or "size unknown"


def _resumed_since(event: dict[str, Any], later: list[dict[str, Any]]) -> bool:
    """A stop by a signal that a later session resumed from: history (the events table keeps it), not a
    warning; its "Continue with: trainwise resume" advice was taken."""
    return event.get("kind") in ("stopped", "signal") and any(e.get("kind") == "resumed" for e in later)


def _say(message: str) -> None:
    """A problem the report lists, said at the terminal too (the CLI prints a RunDirWarning as one line)."""
    warnings.warn(message, RunDirWarning, stacklevel=3)


def visible_controls(text: str) -> str:
    """Control characters (a NUL, an escape sequence) written as \\xNN, so that a damaged file shows what it
    holds without putting raw bytes into the report; tabs and line ends stay."""
    return "".join(ch if ch >= " " and ch != "\x7f" or ch in "\t\n\r" else f"\\x{ord(ch):02x}" for ch in text)


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
    elif task == "causal_lm":
        rows += [("perplexity", _fmt(evaluation["perplexity"]), "1 = always sure and right; a uniform guess = the vocabulary size"),
                 ("token accuracy", _fmt(evaluation["token_accuracy"]), "the next token guessed right"),
                 ("loss (nats per token)", _fmt(evaluation["loss"]), "")]
    elif task == "ranking":
        chance = evaluation.get("random_baseline", {})
        rows.append(("MRR", _fmt(evaluation["mrr"]), ""))
        for key in sorted(k for k in evaluation if k.startswith(("hr@", "ndcg@"))):
            rows.append((key.upper(), _fmt(evaluation[key]),
                         f"random: {_fmt(chance[key])}" if key in chance else ""))
    rows.append(counted(evaluation) + ("",))
    return rows


def counted(evaluation: dict[str, Any]) -> tuple[str, str]:
    """(of what, how many) an evaluation measured: a text split counts tokens (an instruction fine-tune's
    answer tokens, the only ones with a loss), any other split its samples."""
    what, count = "samples", evaluation.get("samples")
    if evaluation.get("task") == "causal_lm":
        what = "answer tokens" if evaluation.get("finetune") or evaluation.get("instruct") else "tokens"
        count = evaluation.get("tokens", count)
    return what, f"{count:,}" if isinstance(count, int) else str(count)


def render_html(facts: dict[str, Any]) -> str:
    import jinja2

    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    environment.filters["fmt"] = _fmt
    environment.filters["readable"] = readable_evidence
    environment.filters["finding_text"] = finding_text
    environment.filters["counted"] = lambda evaluation: "{1} {0}".format(*counted(evaluation))
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
    lines += facts["language_model"].markdown() if facts.get("language_model") else []
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
    if not evaluation and facts["python_run"]:
        lines.append(facts["python_run"])
    elif not evaluation:
        lines.append(f"No test evaluation yet: run `trainwise eval {facts['path']}` (it measures the held-out "
                     "test split)." + (" Other splits below." if evaluations else ""))
    if not evaluations:
        return lines
    lines += [f"Split `{split}`: weights `{e.get('checkpoint')}` (step {e.get('step')}), "
              "{1} {0}.".format(*counted(e)) for split, e in evaluations.items()]
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
    matrix = evaluation.get("confusion_matrix") if evaluation else None
    if evaluation and evaluation.get("top_confusions") and evaluation.get("task") == "classification":
        lines += ["", "Most frequent confusions:", ""] + [f"- {c['true']} → {c['predicted']}: {c['count']}"
                                                            for c in evaluation["top_confusions"]]
    if evaluation and evaluation.get("per_class") and matrix:
        lines += ["", "Confusion matrix (rows: true, columns: predicted):", "",
                  "| true \\ predicted | " + " | ".join(matrix["labels"]) + " |",
                  "|---|" + "---|" * len(matrix["labels"])]
        lines += [f"| {label} | " + " | ".join(str(c) for c in row) + " |"
                  for label, row in zip(matrix["labels"], matrix["counts"])]
    return lines
