"""The prepared-dataset format: fixed-size `.npy` shards and the `manifest.json` that describes them.

```
DIR/
  manifest.json              written last: its presence means the dataset is complete
  .progress.jsonl            while preparing: one line per finished shard, so an interrupted run resumes
  train/inputs-00000.npy     one file per field per shard; every sample of a field has the same shape
  train/targets-00000.npy
  val/...  test/...
```
Each shard file is written atomically (temp file + fsync + rename) with its sha256 recorded, so a reader
never sees half a shard and `trainwise data verify` can name one that was truncated or altered later.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainwise.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from trainwise.errors import DataError

FORMAT = "trainwise-prepared"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRESS = ".progress.jsonl"
SPLITS = ("train", "val", "test")


def shard_file(split: str, field: str, index: int) -> str:
    """Path of one shard file, relative to the dataset directory."""
    return f"{split}/{field}-{index:05d}.npy"


def write_shard(directory: Path, split: str, index: int, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write one shard (one `.npy` per field, all with the same number of samples) atomically.

    Returns the shard's manifest entry: sample count, and per field its file, byte size and sha256.
    """
    counts = {len(array) for array in arrays.values()}
    if len(counts) != 1:
        raise ValueError(f"shard {split}/{index}: fields disagree on the sample count {sorted(counts)}")
    files = {}
    for field, array in arrays.items():
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        data = buffer.getvalue()
        name = shard_file(split, field, index)
        atomic_write_bytes(directory / name, data)
        files[field] = {"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {"index": index, "count": counts.pop(), "files": files}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- manifest -----------------------------------------------------------------------------------------

def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    return atomic_write_json(directory / MANIFEST, {"format": FORMAT, "format_version": FORMAT_VERSION,
                                                    **manifest})


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a prepared dataset, or a DataError saying why DIR is not one."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        hint = (" A previous `trainwise prepare` into it did not finish; run it again to resume."
                if (directory / PROGRESS).is_file() else " Create one with `trainwise prepare SOURCE --to DIR`.")
        raise DataError(f"{directory}: not a prepared dataset (no {MANIFEST}).{hint}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: unreadable manifest ({e}); prepare the dataset again.") from None
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not a trainwise prepared-dataset manifest.")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise DataError(f"{path}: format version {manifest['format_version']} is newer than this trainwise "
                        f"reads ({FORMAT_VERSION}); upgrade trainwise.")
    return manifest


# ---- progress journal (resume) ------------------------------------------------------------------------

class ProgressJournal:
    """`.progress.jsonl`: one JSON line per finished shard, after a header naming the job.

    Append-only (a line and an fsync per shard), so it costs the same at shard 10 and shard 10,000; a line
    torn by a kill is ignored, and that shard is simply redone.
    """

    def __init__(self, directory: Path, fingerprint: str, options: dict[str, Any]):
        self.path = directory / PROGRESS
        self.header = {"fingerprint": fingerprint, "options": options}

    def finished(self) -> dict[str, dict[str, Any]]:
        """Shards of an earlier run of the same job whose files are all still there at their recorded size;
        a journal of another job is replaced by a fresh one."""
        entries = self._read()
        if entries is None:
            atomic_write_text(self.path, json.dumps(self.header) + "\n")
            return {}
        done = {}
        for entry in entries:
            files = entry["result"]["shard"]["files"].values()
            if all((self.path.parent / f["file"]).is_file() and
                   (self.path.parent / f["file"]).stat().st_size == f["bytes"] for f in files):
                done[entry["key"]] = entry["result"]
        return done

    def record(self, key: str, result: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": key, "result": result}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _read(self) -> list[dict[str, Any]] | None:
        try:
            text = self.path.read_text()
        except OSError:
            return None
        lines = text.splitlines()
        try:
            if not lines or json.loads(lines[0]) != self.header:
                return None
        except json.JSONDecodeError:
            return None
        if not text.endswith("\n"):  # a line torn by a kill: end it, so the next record starts clean
            with open(self.path, "a") as f:
                f.write("\n")
        entries = []
        for line in lines[1:]:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the torn line; its shard is redone
        return entries


# ---- verify -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardProblem:
    file: str
    problem: str


def verify(directory: str | Path) -> list[ShardProblem]:
    """Re-hash every shard file against the manifest; one problem per missing, truncated or altered file."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    problems = []
    for entry in iter_files(manifest):
        path = directory / entry["file"]
        if not path.is_file():
            problems.append(ShardProblem(entry["file"], "missing"))
            continue
        size = path.stat().st_size
        if size != entry["bytes"]:
            problems.append(ShardProblem(entry["file"], f"{size} bytes, the manifest says {entry['bytes']} "
                                                        "(truncated or rewritten)"))
        elif sha256_file(path) != entry["sha256"]:
            problems.append(ShardProblem(entry["file"], "sha256 differs from the manifest (altered)"))
    return problems


def iter_files(manifest: dict[str, Any]):
    """Every file the manifest vouches for: shard files of every split, then side files (id maps)."""
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            yield from shard["files"].values()
    yield from manifest.get("files", {}).values()
