"""The one finding record, as the diagnose rules know it: defined in `trainwise.findings` (every room produces
it: doctor checks, telemetry alerts, the rules here), re-exported under its old name."""
from trainwise.findings import EVENT_SEVERITY, LEGACY_SEVERITY, SEVERITY_ORDER, Finding, Severity, worst, worst_first

__all__ = ["EVENT_SEVERITY", "Finding", "LEGACY_SEVERITY", "SEVERITY_ORDER", "Severity", "worst", "worst_first"]
