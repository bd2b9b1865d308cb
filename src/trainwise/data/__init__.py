"""Data: `trainwise prepare` (raw data → checksummed shards), memory-mapped reading, loaders, `data bench`.

    import trainwise.data
    train = trainwise.data.open("data/photos", "train")   # a torch Dataset over memory-mapped shards
    inputs, targets = train.__getitems__([0, 5, 9])       # one batch, gathered shard by shard
"""
from __future__ import annotations

from pathlib import Path


def open(directory: str | Path, split: str = "train", *, normalize: bool = True):  # noqa: A001 - the user's verb
    """A split (`train`, `val`, `test`) of a directory written by `trainwise prepare`, as a torch Dataset."""
    from trainwise.data.prepared import open_split

    return open_split(directory, split, normalize=normalize)


__all__ = ["open"]
