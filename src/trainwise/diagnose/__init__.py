"""Diagnose: what went wrong in a run, and what to do about it.

`Finding` is the one record for everything the product concludes (doctor checks, telemetry alerts, curve
rules, diagnoses); `explain` turns a crash log into one; `diagnose_run` gives every finding about a run
directory (and `live_findings` the same rules on the records in hand while training). Nothing
here runs a training step: the probes that do (sanity checks, overfit-one-batch, lr-find) live in
trainwise.check.
"""
from typing import Any

from trainwise.diagnose.explain import CATEGORIES, explain
from trainwise.findings import Finding, worst, worst_first

# lazy: `trainwise --help` should not pay for NumPy and the run directory
_LAZY = {"diagnose_run": "run_rules", "live_findings": "run_rules"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"trainwise.diagnose.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'trainwise.diagnose' has no attribute {name!r}")


__all__ = ["CATEGORIES", "Finding", "explain", "worst", "worst_first", *_LAZY]
