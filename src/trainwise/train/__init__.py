"""The training engine. Other rooms (evaluate, plan, the CLI) use it through these names, never through its
modules, so the engine's insides can move without breaking them (tests/test_architecture.py holds
evaluate to this).

    from trainwise.train import predict, read_checkpoint, resolve_device
"""
from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Trainer": "trainer", "Callback": "callbacks", "build_trainer": "run", "train_run": "run",
    "resume_run": "run", "predict": "evaluation", "headline_metrics": "evaluation", "read_checkpoint": "checkpoint",
    "resolve_device": "device", "choose_precision": "precision", "resolve_precision": "precision",
}


def __getattr__(name: str) -> Any:
    """Lazy: the engine's modules import each other through this package, so it must not import them first."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"trainwise.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'trainwise.train' has no attribute {name!r}")


__all__ = list(_EXPORTS)
