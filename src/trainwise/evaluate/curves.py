"""Curve analysis for evaluation and the report. The rules live in the diagnose stage (one owner:
`trainwise.diagnose.curves` and `.convergence`); evaluation consumes their findings, it does not compute
its own. This module keeps the names evaluation code imports."""
from trainwise.diagnose.curve_analysis import CurveAnalysis, analyse_curves
from trainwise.diagnose.curves import best_point, series

__all__ = ["CurveAnalysis", "analyse_curves", "best_point", "series"]
