"""How a plan's numbers read at the terminal: bytes, FLOPs, durations and money, for both plan printers."""
from __future__ import annotations

import math


def bytes_text(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def flops_text(n: float) -> str:
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} FLOP"


def duration_text(hours: float) -> str:
    seconds = hours * 3600
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if hours < 2:
        return f"{seconds / 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} days"


def money_text(value: float | None) -> str:
    """Two decimals; below a cent, two significant digits (0.00043), so cheap options still compare."""
    if value is None:
        return "—"
    if 0 < value < 0.01:
        return f"{value:.{1 - math.floor(math.log10(value))}f}"
    return f"{value:,.2f}" if value < 1000 else f"{value:,.0f}"
