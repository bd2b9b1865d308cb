"""Token shards: a prepared text dataset on disk, memory-mapped when read.

```
DIR/
  manifest.json               kind "text": the tokenizer's fingerprint, per split the token and document counts
  tokenizer/                  the tokenizer that made the ids (data/text/tokenizer.py), read back by training
  train/tokens-00000.npy      the split's documents one after another, uint16 (largest id <= 65,535) or uint32
  train/loss_mask-00000.npy   optional (instruction data): 1 where a token is a target, 0 where it is prompt
  train/documents.npy         int64 offsets: document i is tokens[offsets[i]:offsets[i + 1]] of the split
  val/...  test/...
```
The format is the prepared-dataset format of data/shards.py (atomic shard files with their sha256, a
checksummed manifest, `trainwise data verify`), with tokens as the samples of each shard and the document
offsets as a side file. Each document ends with the tokenizer's end-of-text id when it has one, so a model
learns where documents end; document boundaries are kept, so packing never lets one attend to another.
"""
from __future__ import annotations

import io
import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainwise.rundir.atomic import atomic_write_bytes
from trainwise.data.shards import check_split_files, read_manifest, write_shard
from trainwise.errors import DataError

TOKENS_PER_SHARD = 1 << 26  # 128 MiB of uint16 a shard file
TOKENIZER_DIR = "tokenizer"


def token_dtype(id_count: int) -> np.dtype:
    """The narrowest unsigned type that holds ids 0..id_count-1. Give the largest id the tokenizer can emit
    plus one (`tokenizer.max_id + 1`), not its length: a vocabulary may leave gaps below its largest id."""
    return np.dtype(np.uint16) if id_count <= 1 << 16 else np.dtype(np.uint32)


def documents_file(split: str) -> str:
    return f"{split}/documents.npy"


class TokenSplitWriter:
    """Append documents (lists of ids, and optionally per-token loss masks) to one split; `close()` writes the
    last shard and the document offsets and returns the split's manifest entry and side files."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, *, eos_id: int | None,
                 with_loss_mask: bool = False, tokens_per_shard: int = TOKENS_PER_SHARD):
        self.directory, self.split, self.dtype, self.eos_id = directory, split, dtype, eos_id
        self.with_loss_mask, self.tokens_per_shard = with_loss_mask, tokens_per_shard
        self.offsets = [0]
        self.shards: list[dict[str, Any]] = []
        self._tokens: list[np.ndarray] = []
        self._masks: list[np.ndarray] = []
        self._buffered = 0

    def add(self, ids: Sequence[int], loss_mask: Sequence[int] | None = None) -> None:
        tokens = np.asarray(ids, dtype=np.int64)
        mask = np.ones(len(tokens), np.uint8) if loss_mask is None else np.asarray(loss_mask, dtype=np.uint8)
        if len(mask) != len(tokens):
            raise ValueError(f"a loss mask of {len(mask)} for {len(tokens)} tokens")
        if self.eos_id is not None and (len(tokens) == 0 or tokens[-1] != self.eos_id):
            tokens, mask = np.append(tokens, self.eos_id), np.append(mask, 1 if len(mask) == 0 else mask[-1])
        self._check_range(tokens)
        self._tokens.append(tokens.astype(self.dtype))
        self._masks.append(mask)
        self._buffered += len(tokens)
        self.offsets.append(self.offsets[-1] + len(tokens))
        while self._buffered >= self.tokens_per_shard:
            self._flush(self.tokens_per_shard)

    def _check_range(self, tokens: np.ndarray) -> None:
        """Every id must fit the storage type: a cast would wrap an id above it onto another word."""
        if len(tokens) and (int(tokens.max()) > np.iinfo(self.dtype).max or int(tokens.min()) < 0):
            bad = int(tokens.max()) if int(tokens.max()) > np.iinfo(self.dtype).max else int(tokens.min())
            raise DataError(f"document {len(self.offsets)} of the {self.split} split has token id {bad:,}, which "
                            f"{self.dtype.name} token shards cannot hold (0 to {np.iinfo(self.dtype).max:,}): the "
                            "tokenizer emits ids beyond the largest it declares. Nothing was stored wrapped; report "
                            "the tokenizer, or prepare with --tokenizer bytes.")

    def close(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        if self._buffered or not self.shards:
            self._flush(self._buffered)
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(self.offsets, dtype=np.int64), allow_pickle=False)
        data = buffer.getvalue()
        name = documents_file(self.split)
        atomic_write_bytes(self.directory / name, data)
        side = {name: {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
        entry = {"count": self.offsets[-1], "documents": len(self.offsets) - 1, "shards": self.shards}
        return entry, side

    def _flush(self, count: int) -> None:
        tokens = np.concatenate(self._tokens) if self._tokens else np.zeros(0, self.dtype)
        masks = np.concatenate(self._masks) if self._masks else np.zeros(0, np.uint8)
        arrays = {"tokens": tokens[:count]}
        if self.with_loss_mask:
            arrays["loss_mask"] = masks[:count]
        self.shards.append(write_shard(self.directory, self.split, len(self.shards), arrays))
        self._tokens, self._masks = [tokens[count:]], [masks[count:]]
        self._buffered -= count


def text_schema(dtype: np.dtype, with_loss_mask: bool) -> dict[str, dict[str, Any]]:
    schema = {"tokens": {"dtype": dtype.name, "shape": []}}
    if with_loss_mask:
        schema["loss_mask"] = {"dtype": "uint8", "shape": []}
    return schema


class TokenSplit:
    """One split's tokens, read through memory maps opened on first use (DataLoader workers open their own).

    `tokens(start, end)` and `loss_mask(start, end)` read a range of the split's stream across shard files;
    `offsets` are the document boundaries.
    """

    def __init__(self, directory: str | Path, split: str = "train", manifest: dict[str, Any] | None = None):
        self.directory = Path(directory)
        self.manifest = manifest or read_manifest(self.directory)
        if self.manifest.get("kind") != "text":
            raise DataError(f"{self.directory}: a {self.manifest.get('kind')} dataset, not text; prepare text "
                            "with `trainwise prepare CORPUS --to DIR`.")
        splits = self.manifest["splits"]
        if split not in splits:
            raise DataError(f"{self.directory}: no {split!r} split; it has {', '.join(splits) or 'none'}.")
        self.split = split
        self.shards = splits[split]["shards"]
        self.has_loss_mask = "loss_mask" in self.manifest["schema"]
        check_split_files(self.directory, self.manifest, split)
        starts = np.cumsum([0] + [shard["count"] for shard in self.shards])
        self._shard_starts = starts
        self.total = int(starts[-1])
        self.offsets = np.load(self.directory / documents_file(split), allow_pickle=False)
        if len(self.offsets) == 0 or int(self.offsets[-1]) != self.total:
            raise DataError(f"{self.directory / documents_file(split)}: document offsets end at "
                            f"{int(self.offsets[-1]) if len(self.offsets) else 'nothing'}, the split holds "
                            f"{self.total} tokens; prepare the dataset again.")
        self._maps: list[dict[str, np.ndarray]] | None = None

    @property
    def documents(self) -> int:
        return len(self.offsets) - 1

    def tokens(self, start: int, end: int) -> np.ndarray:
        return self._read("tokens", start, end)

    def loss_mask(self, start: int, end: int) -> np.ndarray:
        if not self.has_loss_mask:
            return np.ones(max(0, end - start), np.uint8)
        return self._read("loss_mask", start, end)

    def _read(self, field: str, start: int, end: int) -> np.ndarray:
        maps = self._open()
        first = int(np.searchsorted(self._shard_starts, start, side="right")) - 1
        parts = []
        while start < end and first < len(maps):
            shard_start = int(self._shard_starts[first])
            stop = min(end, int(self._shard_starts[first + 1]))
            parts.append(maps[first][field][start - shard_start:stop - shard_start])
            start, first = stop, first + 1
        return np.concatenate(parts) if len(parts) != 1 else np.asarray(parts[0])

    def _open(self) -> list[dict[str, np.ndarray]]:
        if self._maps is None:
            self._maps = [{field: np.load(self.directory / entry["file"], mmap_mode="r", allow_pickle=False)
                           for field, entry in shard["files"].items()} for shard in self.shards]
        return self._maps

    def __getstate__(self):  # a worker process opens its own maps
        return {**self.__dict__, "_maps": None}


def write_documents(directory: Path, split: str, documents: Iterable[Sequence[int]], dtype: np.dtype,
                    eos_id: int | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Write a whole split of plain documents (no loss masks) in one call."""
    writer = TokenSplitWriter(directory, split, dtype, eos_id=eos_id)
    for ids in documents:
        writer.add(ids)
    return writer.close()
