"""A DataSpec for a plain dataset handed to the Trainer without one (`Trainer(model, TensorDataset(X, y))`),
read off its targets."""
from __future__ import annotations

from typing import Any


def infer_spec(dataset: Any) -> Any:
    """A DataSpec for a plain dataset handed to the Trainer without one, read off its targets: float targets
    of one value per sample mean regression (MSE), integer ones classification over max label + 1 classes.
    Pass `data_spec=DataSpec(...)` to the Trainer to say otherwise."""
    import torch

    from trainwise.data.bundle import DataSpec

    targets, complete = _targets_of(dataset)
    if targets is None or targets.numel() == 0:
        return DataSpec(input_shape=(), num_classes=None, num_train=_length(dataset))
    if targets.is_floating_point():
        per_sample = targets.reshape(len(targets), -1).shape[1] if targets.dim() > 0 else 1
        if per_sample == 1:
            return DataSpec(input_shape=(), num_classes=None, task="regression", num_train=_length(dataset))
        return DataSpec(input_shape=(), num_classes=per_sample, num_train=_length(dataset))  # soft labels
    classes = (int(targets.max()) + 1 if targets.dtype != torch.bool else 2) if complete else None
    return DataSpec(input_shape=(), num_classes=classes, num_train=_length(dataset))


def _targets_of(dataset: Any) -> tuple[Any, bool]:
    """(targets, complete): every target of an in-memory dataset (trainwise's ArrayDataset, torch's
    TensorDataset), else the first sample's as a batch of one; None when it yields no (input, target) pairs."""
    import torch

    if isinstance(getattr(dataset, "targets", None), torch.Tensor):
        return dataset.targets, True
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, tuple) and len(tensors) >= 2 and isinstance(tensors[-1], torch.Tensor):
        return tensors[-1], True
    try:
        sample = dataset[0]
        target = sample[1] if isinstance(sample, (tuple, list)) and len(sample) == 2 else None
        return (None if target is None else torch.as_tensor(target).reshape(1, -1)), False
    except Exception:  # noqa: BLE001  an unusual dataset: the rules that need a task stay silent
        return None, False


def _length(dataset: Any) -> int:
    try:
        return len(dataset)
    except TypeError:
        return 0
