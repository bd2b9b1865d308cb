"""Evaluate a run honestly: metrics beside their baselines, curve findings, reports, comparisons, ablations.

    from trainwise.evaluate import evaluate_run, write_report
    evaluate_run("runs/bc")          # RUN/eval/metrics.json, confusion_matrix.csv, predictions.csv
    write_report("runs/bc")          # RUN/report.html
"""
from __future__ import annotations

from typing import Any

_EXPORTS = {"evaluate_run": "evaluate.run_eval", "read_eval": "evaluate.run_eval", "write_report": "evaluate.report",
            "compare_runs": "evaluate.compare", "ablate": "evaluate.ablate",
            "analyse_curves": "diagnose.curve_analysis"}  # the curve rules are diagnose's; evaluation reads them


def __getattr__(name: str) -> Any:
    """Lazy: `trainwise --help` should not pay for matplotlib and scipy."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"trainwise.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'trainwise.evaluate' has no attribute {name!r}")


__all__ = list(_EXPORTS)
