"""The prepared-dataset format: fixed-size `.npy` shards and the `manifest.json` that describes them.

```
DIR/
  manifest.json              written last: its presence means the dataset is complete; `format:
                             trainwise-prepared` marks a folder trainwise made, `written` lists every file it put there
  train/inputs-00000.npy     one file per field per shard; every sample of a field has the same shape
  train/targets-00000.npy
  val/...  test/...
.DIR.preparing/              beside DIR while `trainwise prepare` builds the next version (data/destination.py)
  .progress.jsonl            one line per finished shard, so an interrupted run resumes
.DIR.lock                    beside DIR while a prepare writes it: one writer at a time
```
Each shard file is written atomically (temp file + fsync + rename) with its sha256 recorded, so a reader
never sees half a shard and `trainwise data verify` can name one that was truncated or altered later. The
manifest is checked on every read: a schema, a checksum of its own fields, and the shard headers of a split
before it is read (see the manifest section below).
"""
from __future__ import annotations

import hashlib
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainwise.rundir.atomic import atomic_write_bytes, atomic_write_json
from trainwise.errors import DataError

FORMAT = "trainwise-prepared"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRESS = ".progress.jsonl"
WRITTEN = "written"  # the manifest field listing every file prepare wrote (the only files it ever deletes)
SPLITS = ("train", "val", "test")


def staging_dir(directory: Path) -> Path:
    """Where `trainwise prepare` builds the dataset that replaces `directory` (beside it: same filesystem)."""
    return directory.with_name(f".{directory.name}.preparing")


def lock_file(directory: Path) -> Path:
    """The lock a prepare into `directory` holds (beside it: the folder itself is swapped)."""
    return directory.with_name(f".{directory.name}.lock")


@dataclass(frozen=True)
class ShardProblem:
    """A file the manifest vouches for that is not what it says (missing, cut short, other rows, altered)."""

    file: str
    problem: str


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
#
# manifest.json is data too. A hand edit (a shard count, a shape), a mangled copy or a hostile file name is
# refused with the field and the fix before training, not met as an IndexError mid-epoch or as silently
# skipped samples. Three layers: this schema (types, file names inside the dataset, counts that add up), a
# checksum of each top-level field (any edit since `trainwise prepare` wrote it, named by field), and, when
# a split is opened or verified, each shard file's .npy header against the manifest (rows, dtype, shape).

CHECKSUM = "field_sha256"
MAX_LISTED = 6  # problems listed in one message; the rest are counted
_FIX = ("manifest.json is written by `trainwise prepare` and must not be edited: restore it, or prepare the "
        "dataset again (`trainwise prepare SOURCE --to {dir} --force`), then check it with `trainwise data "
        "verify {dir}`.")


class UncheckedManifestWarning(UserWarning):
    """A manifest written before trainwise checksummed manifests: read, but edits to it cannot be detected."""


def _inside_dataset(name: str) -> str:
    # lexical, so that it holds before any file is touched: no absolute path, drive, `..` or backslash
    if (not name or PurePosixPath(name).is_absolute() or PureWindowsPath(name).drive or "\\" in name
            or ".." in PurePosixPath(name).parts):
        raise ValueError(f"{name!r} is not a path inside the dataset directory")
    return name


class FileEntry(BaseModel):
    file: Annotated[str, AfterValidator(_inside_dataset)]
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ShardEntry(BaseModel):
    index: int = Field(ge=0)
    count: int = Field(ge=0)  # 0: every image of that shard was skipped as unreadable
    files: dict[str, FileEntry]


class SplitEntry(BaseModel):
    count: int = Field(ge=0)
    shards: list[ShardEntry]

    @model_validator(mode="after")
    def _counts_add_up(self) -> "SplitEntry":
        held = sum(shard.count for shard in self.shards)
        if held != self.count:
            raise ValueError(f"count is {self.count} but its shards' counts add up to {held}")
        if [shard.index for shard in self.shards] != list(range(len(self.shards))):
            raise ValueError(f"shard indices must run 0..{len(self.shards) - 1} in order")
        return self


class FieldSpec(BaseModel):
    dtype: str
    shape: list[Annotated[int, Field(ge=0)]]

    @field_validator("dtype")
    @classmethod
    def _numeric(cls, value: str) -> str:
        try:
            dtype = np.dtype(value)
        except TypeError:
            raise ValueError(f"{value!r} is not a numpy dtype") from None
        if dtype.kind not in "biuf":
            raise ValueError(f"{value!r}: shards hold numbers (bool, int, uint, float)")
        return value


class Normalization(BaseModel):
    mean: list[float] = []
    std: list[float] = []


class Manifest(BaseModel):
    """The fields trainwise reads; kind-specific ones (encoding, columns, skipped ...) pass through."""

    model_config = ConfigDict(extra="allow")
    format: Literal["trainwise-prepared"]
    format_version: int = Field(ge=1, le=FORMAT_VERSION)
    kind: Literal["images", "table", "interactions", "text"]
    task: Literal["classification", "regression", "implicit", "causal_lm"]
    fields: dict[str, FieldSpec] = Field(alias="schema")
    splits: dict[Literal["train", "val", "test"], SplitEntry]
    files: dict[str, FileEntry] = {}
    class_names: list[str] | None = None
    normalization: Normalization | None = None
    checksum: dict[str, str] | None = Field(None, alias=CHECKSUM)

    @model_validator(mode="after")
    def _agrees_with_itself(self) -> "Manifest":
        missing = ({"tokens"} if self.kind == "text" else {"inputs", "targets"}) - set(self.fields)
        if missing:
            raise ValueError(f"schema has no {', '.join(sorted(missing))} field")
        if "train" not in self.splits:
            raise ValueError("splits has no 'train' split")
        for split, entry in self.splits.items():
            for shard in entry.shards:
                if set(shard.files) != set(self.fields):
                    raise ValueError(f"splits.{split}.shards.{shard.index}.files lists {sorted(shard.files)}, "
                                     f"the schema {sorted(self.fields)}")
        stats, inputs = self.normalization, getattr(self.fields.get("inputs"), "shape", [])  # text: tokens only
        if stats and stats.mean and not (len(stats.mean) == len(stats.std) == (inputs[0] if inputs else 1)):
            raise ValueError(f"normalization has {len(stats.mean)} means and {len(stats.std)} stds for inputs of "
                             f"shape {inputs} (one per {'channel' if self.kind == 'images' else 'feature'})")
        return self


def field_digests(manifest: dict[str, Any]) -> dict[str, str]:
    """sha256 of each top-level field as canonical JSON (the checksum itself left out)."""
    return {key: hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
            for key, value in manifest.items() if key != CHECKSUM}


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    """Write manifest.json with its checksum (digests of what a reader will parse back: plain JSON values)."""
    body = json.loads(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, **manifest},
                                 default=_plain))
    body.pop(CHECKSUM, None)
    return atomic_write_json(directory / MANIFEST, {**body, CHECKSUM: field_digests(body)})


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} in a manifest is not JSON")


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a prepared dataset, checked against its schema and its checksum; or a DataError that
    names the file, the field and the fix."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        unfinished = (directory / PROGRESS).is_file() or (staging_dir(directory) / PROGRESS).is_file()
        hint = (" A previous `trainwise prepare` into it did not finish; run the same command again to resume."
                if unfinished else " Create one with `trainwise prepare SOURCE --to DIR`.")
        raise DataError(f"{directory}: not a prepared dataset (no {MANIFEST}).{hint}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: unreadable manifest ({e}). {_FIX.format(dir=directory)}") from None
    if isinstance(manifest, dict) and manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not a trainwise prepared-dataset manifest (format is not {FORMAT!r}).")
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise DataError(f"{path}: format version {version} is newer than this trainwise reads ({FORMAT_VERSION}); "
                        "upgrade trainwise.")
    try:
        checked = Manifest.model_validate(manifest)
    except ValidationError as error:
        raise DataError(f"{path}: {_listed(_schema_problems(error))}\n{_FIX.format(dir=directory)}") from None
    if checked.checksum is None:
        warnings.warn(f"{path} has no checksum (prepared by an older trainwise): its shards are still checked "
                      "against it, but an edit to it cannot be detected. Run the same `trainwise prepare` "
                      "command again to add one (no shard is redone).", UncheckedManifestWarning, stacklevel=2)
        return manifest
    expected, actual = checked.checksum, field_digests(manifest)
    changed = sorted(key for key in expected.keys() | actual.keys() if expected.get(key) != actual.get(key))
    if changed:
        raise DataError(f"{path}: {', '.join(changed)} changed since `trainwise prepare` wrote it (the manifest's "
                        f"checksum, {CHECKSUM}, no longer matches). {_FIX.format(dir=directory)}")
    return manifest


def _schema_problems(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "literal_error":
            message = f"{message} (got {item.get('input')!r})"
        problems.append(f"{where}: {message}")
    return problems


def _listed(problems: list[str]) -> str:
    shown = "\n".join(f"  {p}" for p in problems[:MAX_LISTED])
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return f"{len(problems)} problem{'s' if len(problems) > 1 else ''}:\n{shown}{more}"


def shard_header_problems(directory: Path, manifest: dict[str, Any], split: str) -> list["ShardProblem"]:
    """Each shard file of `split` against the manifest, reading only its size and .npy header (no hashing):
    missing, cut short or grown, or holding other rows, dtype or sample shape than the manifest says."""
    problems = []
    for number, shard in enumerate(manifest["splits"][split]["shards"]):
        for field, entry in shard["files"].items():
            spec, path = manifest["schema"][field], directory / entry["file"]
            where = f"splits.{split}.shards.{number}"
            if not path.is_file():
                problems.append(ShardProblem(entry["file"], "missing"))
                continue
            size = path.stat().st_size
            if size != entry["bytes"]:
                problems.append(ShardProblem(entry["file"], f"{size} bytes, the manifest says {entry['bytes']} "
                                                            "(truncated or rewritten)"))
                continue
            try:
                shape, dtype = _npy_header(path)
            except (OSError, ValueError) as error:
                problems.append(ShardProblem(entry["file"], f"not a readable .npy file ({error})"))
                continue
            if shape[:1] != (shard["count"],):
                problems.append(ShardProblem(entry["file"], f"holds {shape[0] if shape else 'no'} samples, "
                                                            f"{where}.count says {shard['count']}"))
            if dtype != np.dtype(spec["dtype"]):
                problems.append(ShardProblem(entry["file"], f"holds {dtype}, schema.{field}.dtype says "
                                                            f"{spec['dtype']}"))
            if list(shape[1:]) != list(spec["shape"]):
                problems.append(ShardProblem(entry["file"], f"holds samples of shape {list(shape[1:])}, "
                                                            f"schema.{field}.shape says {spec['shape']}"))
    return problems


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    return tuple(shape), dtype


def check_split_files(directory: Path, manifest: dict[str, Any], split: str) -> None:
    """Refuse a split whose shard files disagree with the manifest, before any batch is read."""
    problems = shard_header_problems(directory, manifest, split)
    if problems:
        raise DataError(f"{directory}, {split} split: the shard files disagree with {MANIFEST}, "
                        f"{_listed([f'{p.file}: {p.problem}' for p in problems])}\n"
                        f"Run `trainwise data verify {directory}`, and prepare the dataset again "
                        f"(`trainwise prepare SOURCE --to {directory} --force`).")


# ---- verify -------------------------------------------------------------------------------------------

def verify(directory: str | Path, manifest: dict[str, Any] | None = None) -> list[ShardProblem]:
    """Every file the manifest vouches for: headers and sizes against the manifest, then re-hashed; one
    problem per missing, truncated, mismatched or altered file. A damaged manifest raises DataError."""
    directory = Path(directory)
    manifest = manifest or read_manifest(directory)
    problems = [p for split in manifest["splits"] for p in shard_header_problems(directory, manifest, split)]
    damaged = {p.file for p in problems}
    for entry in iter_files(manifest):
        path = directory / entry["file"]
        if entry["file"] in damaged:
            continue
        if not path.is_file():
            problems.append(ShardProblem(entry["file"], "missing"))
        elif path.stat().st_size != entry["bytes"]:
            problems.append(ShardProblem(entry["file"], f"{path.stat().st_size} bytes, the manifest says "
                                                        f"{entry['bytes']} (truncated or rewritten)"))
        elif sha256_file(path) != entry["sha256"]:
            problems.append(ShardProblem(entry["file"], "sha256 differs from the manifest (altered)"))
    return problems


def iter_files(manifest: dict[str, Any]):
    """Every file the manifest vouches for: shard files of every split, then side files (id maps)."""
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            yield from shard["files"].values()
    yield from manifest.get("files", {}).values()
