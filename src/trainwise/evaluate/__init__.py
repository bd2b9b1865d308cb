"""Evaluate a run honestly: metrics beside their baselines, curve findings, reports, comparisons, ablations.

    from trainwise.evaluate import evaluate_run, write_report
    evaluate_run("runs/bc")          # RUN/eval/metrics.json, confusion_matrix.csv, predictions.csv
    write_report("runs/bc")          # RUN/report.html
"""
from __future__ import annotations

from typing import Any

_EXPORTS = {"evaluate_run": "run_eval", "read_eval": "run_eval", "write_report": "report",
            "compare_runs": "compare", "ablate": "ablate", "analyse_curves": "curves"}


def __getattr__(name: str) -> Any:
    """Lazy: `trainwise --help` should not pay for matplotlib and scipy."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"trainwise.evaluate.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'trainwise.evaluate' has no attribute {name!r}")


__all__ = list(_EXPORTS)
