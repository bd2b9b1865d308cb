"""Finding: the one record the product uses for anything it concludes about a run or a machine.

A doctor check, a telemetry alert, a curve rule and an explained crash all say the same four things: what
happened (a stable `code` scripts can match on), how bad it is (`severity`), the facts it rests on
(`evidence`) and what to do (`fixes`, simplest first). Reports and every `--json` output read this record.

It sits at the top of the package (beside errors.py) so every room can produce it: `trainwise doctor`'s
checks, telemetry's alerts (`kind` in events.jsonl is the `code`) and the diagnose rules, which import it
from here.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

Severity = Literal["info", "warn", "error"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "warn": 1, "error": 2}

# The vocabularies used before this record existed (doctor: ok/warn/fail; events: info/warning/error), so
# old records and old call sites can be read without a separate mapping at every reader.
LEGACY_SEVERITY: dict[str, Severity] = {"ok": "info", "warning": "warn", "fail": "error"}
# events.jsonl keeps the words it has always been written with (info|warning|error): a finding logged as an
# event uses these.
EVENT_SEVERITY: dict[Severity, str] = {"info": "info", "warn": "warning", "error": "error"}


@dataclass(frozen=True)
class Finding:
    code: str
    """Stable identifier scripts and CI jobs match on, e.g. `cuda_oom`, `gpu_temperature`, `data_starvation`."""
    severity: Severity
    """info: worth knowing; warn: works but costs speed or will bite later; error: it failed or will fail."""
    title: str
    """One line in the user's words, e.g. "CUDA out of memory"."""
    detail: str = ""
    """The cause in plain words: what it means and why it happened. May be several sentences."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """The facts the conclusion rests on: numbers, versions, paths, or quoted log lines (`lines`)."""
    fixes: tuple[str, ...] = ()
    """What to do, simplest first, with the exact command where there is one. One fix may be given as a
    string; None means nothing to do."""
    step: int | None = None
    """The training step where it shows, when it belongs to a step."""

    def __post_init__(self) -> None:
        severity = LEGACY_SEVERITY.get(self.severity, self.severity)
        if severity not in SEVERITY_ORDER:
            raise ValueError(f"severity must be one of {sorted(SEVERITY_ORDER)}, not {self.severity!r}")
        if not self.code or not self.title or "\n" in self.title:
            raise ValueError(f"a finding needs a code and a one-line title (got {self.code!r}, {self.title!r})")
        # frozen: normalise through object.__setattr__ so callers may pass lists and legacy severities
        object.__setattr__(self, "severity", severity)
        fixes = () if self.fixes is None else (self.fixes,) if isinstance(self.fixes, str) else self.fixes
        object.__setattr__(self, "fixes", tuple(fixes))
        object.__setattr__(self, "evidence", dict(self.evidence))

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-ready dict (a copy: changing it does not change the finding)."""
        return {"code": self.code, "severity": self.severity, "title": self.title, "detail": self.detail,
                "evidence": copy.deepcopy(dict(self.evidence)), "fixes": list(self.fixes), "step": self.step}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Finding":
        """The inverse of `to_dict`; a missing `code`, `severity` or `title` raises KeyError."""
        return cls(code=raw["code"], severity=raw["severity"], title=raw["title"], detail=raw.get("detail") or "",
                   evidence=raw.get("evidence") or {}, fixes=tuple(raw.get("fixes") or ()), step=raw.get("step"))


def worst_first(findings: Iterable[Finding]) -> list[Finding]:
    """Errors, then warnings, then info; within a severity the earlier step first, then the given order."""
    def key(finding: Finding) -> tuple[int, float]:
        return -SEVERITY_ORDER[finding.severity], finding.step if finding.step is not None else float("inf")
    return sorted(findings, key=key)


def worst(findings: Iterable[Finding]) -> Severity | None:
    """The most serious severity among `findings`, or None when there are none."""
    return max((f.severity for f in findings), key=SEVERITY_ORDER.__getitem__, default=None)
