"""Model outputs as NumPy arrays, for the metrics (no torch import: a tensor brings its own `detach`)."""
from __future__ import annotations

from typing import Any

import numpy as np


def as_numpy(values: Any) -> np.ndarray:
    """A torch tensor or array-like as a numpy array (on the CPU)."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values)
