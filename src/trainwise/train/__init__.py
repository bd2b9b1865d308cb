"""The training engine: the Trainer, its step, checkpointer and loop. Runs are started and resumed by
trainwise.launch; the probes in trainwise.check and the planner use its step; evaluation and diagnosis never
import it (tests/test_architecture.py).

    from trainwise.train import Trainer, Callback
"""
from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Trainer": "loop.trainer", "Callback": "callbacks.base",
}


def __getattr__(name: str) -> Any:
    """Lazy: the engine's modules import each other through this package, so it must not import them first."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"trainwise.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'trainwise.train' has no attribute {name!r}")


__all__ = list(_EXPORTS)
