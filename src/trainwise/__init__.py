"""trainwise: plan, check, prepare, train, diagnose, evaluate and monitor PyTorch training.

The library's names are imported on first use (PEP 562), so the command line starts without importing torch
for commands that never touch it (`trainwise --help`, `report`, `compare`):

    from trainwise import Trainer, RunDir, DataSpec
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "RunConfig": "config", "config_from_dict": "config", "load_config": "config",
    "ArrayDataset": "data.bundle", "DataBundle": "data.bundle", "DataSpec": "data.bundle",
    "TrainwiseError": "errors", "RunDir": "rundir", "Callback": "train.callbacks.base", "Trainer": "train.loop.trainer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(f"trainwise.{_EXPORTS[name]}"), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'trainwise' has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*globals(), *_EXPORTS]
