"""Read a prepared dataset: memory-mapped shards as a torch Dataset, and the DataBundle a recipe trains on.

Nothing big is loaded whole: each shard is `np.load(..., mmap_mode="r")`, opened lazily in the process
that reads it (so DataLoader workers open their own maps), and a batch is gathered shard by shard with one
call per shard it touches; targets, when the split's fit in TARGETS_IN_MEMORY_BYTES, are read once.
Images are stored as uint8 and become float32, scaled and normalised with the training split's
statistics, one batch at a time (`normalize=False`: pixels / 255 in [0, 1], table features as encoded).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from trainwise.data.bundle import DataBundle, DataSpec
from trainwise.data.shards import MANIFEST, SPLITS, check_split_files, read_manifest
from trainwise.errors import ConfigError, DataError


TARGETS_IN_MEMORY_BYTES = 64 * 2**20  # 8M int64 labels: read once per process, not per batch and shard


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
        self._starts = self.offsets[:-1].tolist()
        self._arrays: list[dict[str, np.ndarray]] | None = None
        self._targets: torch.Tensor | None = None
        self._scale, self._shift = _normalisation(self.manifest, normalize)
        targets = self.manifest["schema"]["targets"]
        self._targets_in_memory = (np.dtype(targets["dtype"]).itemsize * int(np.prod(targets["shape"])) * self._length
                                   <= TARGETS_IN_MEMORY_BYTES)
        check_split_files(self.directory, self.manifest, split)  # headers only: cheap, and before batch one

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int):
        inputs, targets = self.__getitems__([index])
        return inputs[0], targets[0]

    def __getitems__(self, indices: Sequence[int]):
        index = self._checked(indices)
        if not self._targets_in_memory:
            batch = self.gather(index, ("inputs", "targets"))
            return self._to_inputs(batch["inputs"]), torch.from_numpy(batch["targets"])
        # small targets come from the split's column, read once (check_labels reads it anyway): one call a
        # batch instead of one per shard the batch touches
        return self._to_inputs(self.gather(index, ("inputs",))["inputs"]), self.targets[torch.from_numpy(index)]

    def gather(self, indices: Sequence[int], fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Raw stored values of `fields` (default: all) for `indices`, in the order given."""
        index = self._checked(indices)
        arrays = self._open()
        fields = tuple(fields or self.fields)
        # visit the batch in index order: each shard's rows are one run of the sorted batch, read in file
        # order (page-cache friendly) with one call per shard and field, straight into a buffer in that
        # order; one scatter per field then puts the rows where the sampler asked for them. The calls per
        # shard, not the bytes, bound the rate on small samples, hence no temporaries and no per-row work.
        order = np.argsort(index, kind="stable")
        ordered = index[order]
        bounds = np.searchsorted(ordered, self.offsets)
        touched = np.flatnonzero(bounds[1:] > bounds[:-1]).tolist()  # only the shards this batch touches
        bounds = bounds.tolist()  # Python ints from here: numpy scalar arithmetic costs more per shard
        gathered = {field: self._empty(field, len(index)) for field in fields}
        for shard in touched:
            lo, hi = bounds[shard], bounds[shard + 1]
            local = ordered[lo:hi] - self._starts[shard]
            contiguous = local[-1] - local[0] == hi - lo - 1  # sorted: a run without gaps (or repeats)
            for field in fields:
                source, target = arrays[shard][field], gathered[field][lo:hi]
                if contiguous:
                    target[...] = source[local[0]:local[-1] + 1]
                else:  # mode="clip": indices are checked above and each file's rows against the manifest
                    # when the split was opened; "raise" would buffer `out` once more
                    np.take(source, local, axis=0, out=target, mode="clip")
        if np.array_equal(order, np.arange(len(index))):  # asked in file order (evaluation): done
            return gathered
        out = {}
        for field, rows in gathered.items():
            out[field] = self._empty(field, len(index))
            out[field][order] = rows
        return out

    def _checked(self, indices: Sequence[int]) -> np.ndarray:
        """`indices` as int64 in [0, len), negative ones counted from the end; IndexError beyond."""
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < -self._length or index.max() >= self._length):
            raise IndexError(f"index out of range for {self.split} split of {self._length} samples")
        return np.where(index < 0, index + self._length, index)

    def _empty(self, field: str, rows: int) -> np.ndarray:
        spec = self.manifest["schema"][field]
        return np.empty((rows, *spec["shape"]), dtype=spec["dtype"])

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
            # plain ndarray views of the maps (each keeps its map open through `.base`): np.memmap's
            # subclass hooks cost more than the copy itself when a batch reads a dozen rows per shard
            self._arrays = [{field: np.load(self.directory / entry["file"], mmap_mode="r").view(np.ndarray)
                             for field, entry in shard["files"].items()} for shard in self.shards]
        return self._arrays

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_arrays"] = None  # each worker process maps the files itself
        state["_targets"] = None  # and reads the targets itself, rather than receive a pickled copy
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
    from trainwise.data.augment import feature_noise

    if unknown:
        raise ConfigError(f"data.args: a prepared dataset takes only `normalize` (true/false), not "
                          f"{', '.join(sorted(unknown))}; splits, size and classes are fixed by `trainwise prepare`.")
    manifest = read_manifest(path)
    if manifest["kind"] == "text":
        raise DataError(f"{path}: a text dataset: train a language model on it (`trainwise train lm-gpt "
                        f"data.path={path}`), whose data builder packs its tokens into sequences.")
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
    from trainwise.data.augment import random_shift

    flip = torch.rand(len(images), device=images.device) < 0.5
    images = torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)
    return random_shift(images, max_shift=max(1, images.shape[-1] // 16))


def prepared_text_manifest(data: Any) -> dict[str, Any] | None:
    """The manifest of the prepared text dataset a config's `data` section names (its `path`, no factory), or
    None when it names none: building the data then says what is wrong with it. What an unset `data.seq_len`
    means over it is config.derived.text_sequence_length."""
    if not data.path or data.factory or not (Path(data.path) / MANIFEST).is_file():
        return None
    manifest = read_manifest(data.path)
    return manifest if manifest.get("kind") == "text" else None
