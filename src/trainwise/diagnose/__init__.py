"""Diagnose: what went wrong in a run, and what to do about it.

`Finding` is the one record for everything the product concludes (doctor checks, telemetry alerts, curve
rules, diagnoses); `explain` turns a crash log into one.
"""
from trainwise.diagnose.explain import CATEGORIES, explain
from trainwise.diagnose.findings import Finding, worst, worst_first

__all__ = ["CATEGORIES", "Finding", "explain", "worst", "worst_first"]
