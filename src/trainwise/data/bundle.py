"""What a data builder hands the trainer: the splits, and what a model needs to know about them.

A batch is `(inputs, targets)`. Built-in and prepared datasets fetch a whole batch at once (`__getitems__`),
so the loader does no per-sample Python work; any other torch Dataset that returns `(input, target)` pairs
works too, collated by torch's default collate.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch.utils.data import Dataset

from trainwise.data.batch import IGNORE_INDEX
from trainwise.errors import DataError

Task = Literal["classification", "regression", "causal_lm"]


@dataclass(frozen=True)
class DataSpec:
    """What a model builder may ask about the data, known without loading a batch."""

    input_shape: tuple[int, ...]
    num_classes: int | None
    task: Task = "classification"
    input_dtype: torch.dtype = torch.float32
    class_names: tuple[str, ...] | None = None
    num_train: int = 0
    tokenizer_fingerprint: str | None = None  # text: the tokenizer that made the ids (data/text/tokenizer.py)
    instruct: bool = False  # text: prompt/answer pairs with the loss on the answers (an instruction fine-tune)


@dataclass
class DataBundle:
    """The splits of one data set. `augment` runs on each training batch, on the device, with torch's RNG."""

    train: Dataset
    val: Dataset | None
    test: Dataset | None
    spec: DataSpec
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None
    notes: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a data factory's mistake is named here, not later as a `len(None)` or attribute traceback
        for name in ("train", "val", "test"):
            dataset = getattr(self, name)
            if name == "train" and dataset is None:
                raise DataError("DataBundle(train=None): the train split is required, a torch Dataset of "
                                "(input, target) pairs (trainwise.ArrayDataset(inputs, targets) for tensors).")
            if dataset is not None and not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
                raise DataError(f"DataBundle({name}=...): a {type(dataset).__name__} is not a dataset; give a torch "
                                "Dataset of (input, target) pairs with __len__ and __getitem__"
                                + (", or None." if name != "train" else "."))
        if not isinstance(self.spec, DataSpec):
            raise DataError(f"DataBundle(spec=...): a {type(self.spec).__name__}, not a trainwise.DataSpec; give "
                            "DataSpec(input_shape=..., num_classes=...).")


class ArrayDataset(Dataset):
    """Samples held as two tensors; indexing with a list of indices returns the collated batch."""

    batched = True  # the loader passes batches through untouched
    # a batch is one index into tensors already in memory: a thread does it in microseconds, where a worker
    # process would pickle it through shared memory (the loader then uses threads for `num_workers: auto`)
    reads_in_place = True

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        if len(inputs) != len(targets):
            raise DataError(f"{len(inputs)} inputs but {len(targets)} targets; they must pair up.")
        self.inputs = inputs
        # class labels as the loss takes them: int32/int16/int8 labels (numpy's default on some systems) become
        # int64 once here, not in every step
        self.targets = targets.long() if _is_narrow_integer(targets.dtype) else targets

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]

    def __getitems__(self, indices: Sequence[int]):
        index = torch.as_tensor(indices, dtype=torch.long)
        return self.inputs[index], self.targets[index]


def dataset_targets(dataset: Dataset) -> torch.Tensor | None:
    """All targets of a dataset when it exposes them (`.targets`), else by reading every sample."""
    targets = getattr(dataset, "targets", None)
    if targets is not None:
        return torch.as_tensor(targets)
    try:
        return torch.as_tensor([int(dataset[i][1]) for i in range(len(dataset))])  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _is_narrow_integer(dtype: torch.dtype) -> bool:
    """Integer dtypes torch's cross-entropy refuses as class indices (it takes int64, and uint8)."""
    return dtype in (torch.int8, torch.int16, torch.int32)


def _label_dtype(dataset: Dataset) -> torch.dtype | None:
    targets = getattr(dataset, "targets", None)
    if isinstance(targets, torch.Tensor):
        return targets.dtype
    try:
        target = dataset[0][1]  # type: ignore[index]
    except Exception:  # an empty or unusual dataset: the loader will say more
        return None
    return target.dtype if isinstance(target, torch.Tensor) else None


def check_labels(bundle: DataBundle) -> None:
    """Refuse class labels outside [0, num_classes) before training, naming the label and where it is, and
    labels of an integer type the loss does not take."""
    spec = bundle.spec
    if spec.task != "classification":
        return
    for split in ("train", "val", "test"):
        dataset = getattr(bundle, split)
        dtype = _label_dtype(dataset) if dataset is not None else None
        if dtype is not None and _is_narrow_integer(dtype):
            raise DataError(f"{split} split: class labels are {str(dtype).removeprefix('torch.')}; the loss takes "
                            "int64 class indices. Return labels as torch.long (`torch.as_tensor(y, "
                            "dtype=torch.long)`, or `y.astype('int64')` in numpy), or hold the split in a "
                            "trainwise.ArrayDataset, which converts them.")
    if spec.num_classes is None:
        return
    for split in ("train", "val", "test"):
        dataset = getattr(bundle, split)
        if dataset is None:
            continue
        targets = dataset_targets(dataset)
        if targets is None:
            continue
        if targets.is_floating_point() and not torch.equal(targets, targets.round()):
            raise DataError(f"{split} split: classification targets must be whole class indices, "
                            f"found {targets[targets != targets.round()][0].item()!r}.")
        # -100 is no label (torch's ignore_index: padding, masked tokens): it carries no loss and is allowed
        bad = ((targets < 0) | (targets >= spec.num_classes)) & (targets != IGNORE_INDEX)
        if bad.any():
            where = bad.nonzero()[0].tolist()  # sample (and position, for per-token targets)
            position = where[0] if len(where) == 1 else tuple(where)
            raise DataError(
                f"{split} split: label {int(targets[tuple(where)])} at sample {position} is outside the "
                f"{spec.num_classes} classes (0..{spec.num_classes - 1}); {int(bad.sum())} labels are out "
                "of range. Fix the labels, or set the number of classes to cover them.")
