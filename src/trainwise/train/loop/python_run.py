"""What a run made from Python records: the user's own module and dataset, not the config's defaults.

`Trainer(model, TensorDataset(X, y), config=config_from_dict({...})).fit()` trains a module and datasets the
config never named; its defaults (`model.name: mlp`, `data.name: digits`) would claim a run that did not
happen, and `trainwise eval` would then fail to load the weights into an MLP. Such a run's config.yaml says
`model.name: python:<module class path>` and `data.name: python:<dataset type>` with the sample counts, and
`train.sanity: false` (the sanity checks run only when a recipe is trained from the CLI). The CLI reads the
run (diagnose, report, compare) and says plainly that it cannot rebuild it (recipes.refuse_python_run).
"""
from __future__ import annotations

from typing import Any

from torch import nn

from trainwise.config import RunConfig
from trainwise.recipes import FROM_PYTHON


def class_path(thing: Any) -> str:
    kind = type(thing)
    local = kind.__module__ in ("builtins", "__main__")
    return kind.__qualname__ if local else f"{kind.__module__}.{kind.__qualname__}"


def python_run_config(config: RunConfig, model: nn.Module, train_data: Any, val_data: Any) -> RunConfig:
    """`config` with model and data recorded as what was passed, and no sanity checks claimed."""
    recorded = config.model_copy(deep=True)
    recorded.model.name, recorded.model.factory = FROM_PYTHON + class_path(model), None
    recorded.model.args = {"parameters": sum(p.numel() for p in model.parameters())}
    recorded.data.name, recorded.data.factory, recorded.data.path = FROM_PYTHON + class_path(train_data), None, None
    recorded.data.args = {"train_samples": _size(train_data), "val_samples": _size(val_data) if val_data is not None
                          else 0, **({"val_data": class_path(val_data)} if val_data is not None
                                     and type(val_data) is not type(train_data) else {})}
    recorded.train.sanity = False  # Trainer(...) runs no sanity checks: `trainwise check` is the CLI's
    return recorded


def _size(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # an iterable without a length
        return None
