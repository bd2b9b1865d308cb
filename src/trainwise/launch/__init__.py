"""Starting and resuming runs (`trainwise train`, `trainwise resume`, the library's `train_run`): decide every
`auto`/unset setting once, recorded in config.yaml (resolve.py); build the data and the model a config names,
run the sanity checks, train with the engine into a run directory (runs.py); start the ranks of a `--nproc N`
job with PyTorch's own launcher (torchrun.py).

    from trainwise.launch import train_run, resume_run
"""
from __future__ import annotations

from typing import Any

_EXPORTS = {"build_trainer": "runs", "train_run": "runs", "resume_run": "runs", "resolve_run": "resolve"}


def __getattr__(name: str) -> Any:
    """Lazy: importing the package should not import torch."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"trainwise.launch.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'trainwise.launch' has no attribute {name!r}")


__all__ = list(_EXPORTS)
