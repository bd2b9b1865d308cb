"""Read a prepared dataset: memory-mapped shards as a torch Dataset, and the DataBundle a recipe trains on.

Nothing is loaded whole: each shard is `np.load(..., mmap_mode="r")`, opened lazily in the process that
reads it (so DataLoader workers open their own maps), and a batch is gathered shard by shard with one
fancy-index per shard. Images are stored as uint8 and become float32, scaled and normalised with the
training split's statistics, one batch at a time (`normalize=False`: pixels / 255 in [0, 1], table
features as encoded).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from trainwise.data.bundle import DataBundle, DataSpec
from trainwise.data.shards import SPLITS, read_manifest
from trainwise.errors import ConfigError, DataError


class PreparedDataset(Dataset):
    """One split of a prepared dataset; `dataset[[i, j, ...]]`-style batched access returns `(inputs, targets)`."""

    batched = True  # __getitems__ returns a collated batch; the loader passes it through
    reads_in_place = True  # a batch is a few memory-map reads: cheaper on threads than via worker processes

    def __init__(self, directory: str | Path, split: str = "train", *, normalize: bool = True,
                 manifest: dict[str, Any] | None = None):
        self.directory = Path(directory)
        self.manifest = manifest or read_manifest(self.directory)
        splits = self.manifest["splits"]
        if split not in splits:
            raise DataError(f"{self.directory}: no {split!r} split; it has {', '.join(splits) or 'none'}.")
        self.split = split
        self.shards = splits[split]["shards"]
        self.fields = tuple(self.manifest["schema"])
        counts = np.array([s["count"] for s in self.shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self._length = int(self.offsets[-1])
        self._arrays: list[dict[str, np.ndarray]] | None = None
        self._targets: torch.Tensor | None = None
        self._scale, self._shift = _normalisation(self.manifest, normalize)
        self._check_files()

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int):
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]

    def __getitems__(self, indices: Sequence[int]):
        batch = self.gather(indices, ("inputs", "targets"))
        return self._to_inputs(batch["inputs"]), torch.from_numpy(batch["targets"])

    def gather(self, indices: Sequence[int], fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Raw stored values of `fields` (default: all) for `indices`, in the order given."""
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < -self._length or index.max() >= self._length):
            raise IndexError(f"index out of range for {self.split} split of {self._length} samples")
        index = np.where(index < 0, index + self._length, index)
        arrays = self._open()
        fields = tuple(fields or self.fields)
        out = {}
        for field in fields:
            spec = self.manifest["schema"][field]
            out[field] = np.empty((len(index), *spec["shape"]), dtype=spec["dtype"])
        # visit the batch in index order: each shard's rows are one run of the sorted batch, read in file
        # order (page-cache friendly), then scattered back to the positions the sampler asked for
        order = np.argsort(index, kind="stable")
        ordered = index[order]
        bounds = np.searchsorted(ordered, self.offsets)
        for shard in np.flatnonzero(bounds[1:] > bounds[:-1]):  # only the shards this batch touches
            lo, hi = bounds[shard], bounds[shard + 1]
            local = ordered[lo:hi] - self.offsets[shard]
            rows = order[lo:hi]
            contiguous = local[-1] - local[0] == hi - lo - 1  # sorted: a run without gaps (or repeats)
            for field in fields:
                source = arrays[shard][field]
                out[field][rows] = source[local[0]:local[-1] + 1] if contiguous else source[local]
        return out

    def column(self, field: str) -> np.ndarray:
        """One field over the whole split (e.g. `timestamp` of interactions), read into memory."""
        if field not in self.fields:
            raise DataError(f"{self.directory}: no field {field!r}; fields: {', '.join(self.fields)}.")
        arrays = self._open()
        return np.concatenate([a[field] for a in arrays]) if arrays else np.empty(0)

    @property
    def targets(self) -> torch.Tensor:
        """All targets of the split (small: one number per sample), for label checks and class counts."""
        if self._targets is None:
            self._targets = torch.from_numpy(np.ascontiguousarray(self.column("targets")))
        return self._targets

    def _to_inputs(self, raw: np.ndarray) -> torch.Tensor:
        if self._scale is None:
            return torch.from_numpy(raw)
        # numpy, not torch: one thread per loader thread, the GIL released, no intra-op thread pool to
        # oversubscribe the cores the training step is using
        inputs = np.multiply(raw, self._scale, dtype=np.float32)
        np.subtract(inputs, self._shift, out=inputs)
        return torch.from_numpy(inputs)

    def _open(self) -> list[dict[str, np.ndarray]]:
        if self._arrays is None:
            self._arrays = [{field: np.load(self.directory / entry["file"], mmap_mode="r")
                             for field, entry in shard["files"].items()} for shard in self.shards]
        return self._arrays

    def _check_files(self) -> None:
        # cheap (no hashing): a missing or truncated shard is named now, not as a crash mid-epoch
        for shard in self.shards:
            for entry in shard["files"].values():
                path = self.directory / entry["file"]
                if not path.is_file() or path.stat().st_size != entry["bytes"]:
                    raise DataError(f"{path}: missing or truncated shard; run `trainwise data verify "
                                    f"{self.directory}` and prepare the dataset again.")

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_arrays"] = None  # each worker process maps the files itself
        return state


def _normalisation(manifest: dict[str, Any], normalize: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per-channel (images) or per-feature (tables) `x * scale - shift`, from the training split's stats."""
    schema = manifest["schema"]["inputs"]
    if not np.issubdtype(np.dtype(schema["dtype"]), np.floating) and manifest["kind"] != "images":
        return None, None  # integer ids (interactions) pass through
    unit = 1 / 255 if manifest["kind"] == "images" else 1.0
    stats = manifest.get("normalization") or {}
    if not normalize or not stats.get("mean"):
        return np.float32(unit), np.float32(0.0)
    mean = np.asarray(stats["mean"], dtype=np.float32)
    std = np.maximum(np.asarray(stats["std"], dtype=np.float32), 1e-6)
    if manifest["kind"] == "images":  # shape (C, 1, 1) broadcasts over (N, C, H, W)
        mean, std = mean.reshape(-1, 1, 1), std.reshape(-1, 1, 1)
    return (unit / std).astype(np.float32), (mean / std).astype(np.float32)


def open_split(directory: str | Path, split: str = "train", *, normalize: bool = True) -> PreparedDataset:
    """A split of a prepared dataset as a memory-mapped torch Dataset."""
    return PreparedDataset(directory, split, normalize=normalize)


def data_spec(manifest: dict[str, Any]) -> DataSpec:
    """What a model builder needs to know about a prepared dataset, from its manifest alone."""
    task = manifest["task"]
    class_names = manifest.get("class_names")
    return DataSpec(
        input_shape=tuple(manifest["schema"]["inputs"]["shape"]),
        num_classes=len(class_names) if task == "classification" and class_names else None,
        task=task,
        class_names=tuple(class_names) if class_names else None,
        num_train=manifest["splits"].get("train", {}).get("count", 0),
    )


def prepared_bundle(path: str | Path, *, augment: bool = False, normalize: bool = True,
                    **unknown: Any) -> DataBundle:
    """The train/val/test splits of a prepared image or table dataset, for `data.name: prepared`."""
    from trainwise.recipes.datasets import feature_noise

    if unknown:
        raise ConfigError(f"data.args: a prepared dataset takes only `normalize` (true/false), not "
                          f"{', '.join(sorted(unknown))}; splits, size and classes are fixed by `trainwise prepare`.")
    manifest = read_manifest(path)
    if manifest["kind"] == "interactions":
        raise DataError(f"{path}: an interactions dataset has no built-in model to train. Read it in your own "
                        "data factory with `trainwise.data.open(DIR, 'train')` (inputs are (user, item) ids).")
    splits = {split: PreparedDataset(path, split, normalize=normalize, manifest=manifest)
              if manifest["splits"].get(split, {}).get("count") else None for split in SPLITS}
    if splits["train"] is None:
        raise DataError(f"{path}: the train split is empty; prepare with smaller val/test fractions.")
    augmentation = None
    if augment:
        augmentation = flip_and_shift if manifest["kind"] == "images" else feature_noise
    return DataBundle(splits["train"], splits["val"], splits["test"], spec=data_spec(manifest),
                      augment=augmentation, notes={"prepared": str(path), "normalised_on": "train"})


def flip_and_shift(images: torch.Tensor) -> torch.Tensor:
    """Photos: a random horizontal flip, then a shift of up to 1/16 of the width (on the device)."""
    from trainwise.recipes.datasets import random_shift

    flip = torch.rand(len(images), device=images.device) < 0.5
    images = torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)
    return random_shift(images, max_shift=max(1, images.shape[-1] // 16))
