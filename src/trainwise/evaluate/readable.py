"""Numbers and evidence as the report and `compare` show them: one format for every number, and a
finding's evidence as `name: value` lines instead of a Python dump.

    fmt(0.96431) -> "0.9643"    fmt(10300.0) -> "10,300"    fmt(3e-05) -> "3e-05"    fmt(True) -> "yes"
"""
from __future__ import annotations

import math
from typing import Any


def fmt(value: Any) -> str:
    """4 significant digits; thousands with separators, never `1.030e+04`; tiny values (learning rates) in
    e-notation; None as a dash; booleans as yes/no."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 1e-3 else f"{value:.4g}"
    return str(value)


def readable_evidence(evidence: Any) -> list[tuple[str, str]]:
    """(name, value) rows of a finding's or an event's evidence: nested mappings as dotted names, lists of
    numbers joined, every number through `fmt`. A whole finding recorded as an event's evidence (the sanity
    checks' warnings) shows its own evidence."""
    if not isinstance(evidence, dict):
        return [("evidence", fmt(evidence))] if evidence is not None else []
    if isinstance(evidence.get("evidence"), dict) and "code" in evidence:
        evidence = evidence["evidence"]
    rows: list[tuple[str, str]] = []
    for key, value in evidence.items():
        if isinstance(value, dict):
            rows += [(f"{key}.{k}", v) for k, v in readable_evidence(value)]
        elif isinstance(value, (list, tuple)):
            rows.append((str(key), ", ".join(fmt(v) if not isinstance(v, dict) else
                                             " ".join(f"{k}={fmt(x)}" for k, x in v.items()) for v in value)))
        else:
            rows.append((str(key), fmt(value)))
    return rows


def finding_text(evidence: Any) -> tuple[str | None, list[str]]:
    """(detail, fixes) of a finding recorded whole as an event's evidence; (None, []) for other evidence."""
    if isinstance(evidence, dict) and "code" in evidence and isinstance(evidence.get("evidence"), dict):
        return evidence.get("detail") or None, [str(f) for f in evidence.get("fixes") or ()]
    return None, []
