"""`trainwise prepare SOURCE --to DIR`: raw images, tables or interaction logs → a checksummed, sharded,
memory-mappable dataset (see shards.py for the layout).

The job is a list of shards fixed by the source and the options. Each finished shard is recorded in a
progress journal, so a rerun after an interruption redoes only what is missing; a rerun whose source and
options match the manifest does nothing. The source fingerprint is its files' names, sizes and
modification times (cheap on millions of files; touching a file counts as a change).
"""
from __future__ import annotations

import hashlib
import shutil
import warnings
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from trainwise.data import images as image_kind
from trainwise.data import interactions as interaction_kind
from trainwise.data.loader import usable_cores
from trainwise.data import tables as table_kind
from trainwise.data.splits import split_codes
from trainwise.data.shards import (CHECKSUM, FORMAT_VERSION, MANIFEST, PROGRESS, SPLITS, ProgressJournal,
                                   UncheckedManifestWarning, read_manifest, shard_header_problems, write_manifest,
                                   write_shard)
from trainwise.errors import DataError

Kind = Literal["auto", "images", "table", "interactions"]
SHARD_BYTES = 32 * 2**20  # a shard is at most this big, so a pool of workers has shards to share
SPACE_MARGIN = 1.1  # headroom over the estimate for .npy headers, the manifest and temp files


@dataclass(frozen=True)
class PrepareOptions:
    """Everything that changes the prepared bytes (the fingerprint cache compares these)."""

    kind: Kind = "auto"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    seed: int = 0
    shard_size: int | None = None        # samples per shard; default: what fits in SHARD_BYTES
    size: str = "64"                     # images: height x width after resize + center crop
    channels: int = 3                    # images: 3 (RGB) or 1 (grayscale)
    label: str | None = None             # tables: label column
    task: str = "auto"                   # tables: auto | classification | regression
    user_col: str | None = None          # interactions
    item_col: str | None = None
    time_col: str | None = None
    target_col: str | None = None
    split: str = "time"                  # interactions: time | last-k
    last_k: int = 1
    event_col: str | None = None         # interactions: behaviour type (view/cart/buy); default: `event`...
    session_gap: str | None = None       # interactions: a pause this long (e.g. 30m) starts a new session

    def check(self) -> None:
        if not (0 <= self.val_fraction < 1 and 0 <= self.test_fraction < 1) or \
                self.val_fraction + self.test_fraction >= 0.9:
            raise DataError(f"--val-fraction {self.val_fraction:g} + --test-fraction {self.test_fraction:g}: each "
                            "in [0, 1) and together under 0.9, so training keeps at least 10%.")
        if self.channels not in (1, 3):
            raise DataError(f"--channels {self.channels}: use 3 (RGB) or 1 (grayscale).")
        if self.shard_size is not None and self.shard_size < 1:
            raise DataError(f"--shard-size {self.shard_size}: a shard holds at least one sample.")
        if self.task not in ("auto", "classification", "regression"):
            raise DataError(f"--task {self.task!r}: use auto, classification or regression.")
        if self.session_gap is not None:
            interaction_kind.parse_duration(self.session_gap)


@dataclass
class PrepareResult:
    directory: Path
    status: Literal["prepared", "resumed", "up-to-date"]
    manifest: dict[str, Any]
    reused_shards: int = 0
    written_shards: int = 0
    warnings: list[str] = field(default_factory=list)


Progress = Callable[[int, int], None]  # (shards done, shards in all), after each shard


def prepare(source: str | Path, to: str | Path, options: PrepareOptions = PrepareOptions(), *,
            workers: int | None = None, force: bool = False, progress: Progress | None = None) -> PrepareResult:
    """Prepare `source` into `to`; see the module docstring for caching and resume."""
    source, to = Path(source).expanduser(), Path(to).expanduser()
    options.check()
    if not source.exists():
        raise DataError(f"{source}: no such file or directory.")
    kind = detect_kind(source, options.kind)
    options = PrepareOptions(**{**asdict(options), "kind": kind})
    recorded = {**asdict(options), "format_version": FORMAT_VERSION}
    fingerprint = source_fingerprint(source)
    _check_destination(to, source)
    if (to / MANIFEST).is_file() and not force:
        manifest = _intact_manifest(to)
        if manifest.get("source", {}).get("fingerprint") == fingerprint and manifest.get("options") == recorded:
            if CHECKSUM not in manifest:  # written by an older trainwise, its shards check out: add one
                write_manifest(to, manifest)
            return PrepareResult(to, "up-to-date", read_manifest(to))
    warnings = disk_warnings(to)
    if force:
        (to / PROGRESS).unlink(missing_ok=True)
    (to / MANIFEST).unlink(missing_ok=True)  # from here on DIR is "in progress", never a stale dataset
    build = {"images": _prepare_images, "table": _prepare_table, "interactions": _prepare_interactions}[kind]
    job = _Job(to, source, options, fingerprint, recorded, workers or default_workers(), progress)
    manifest = build(job)
    manifest.update(kind=kind, source={"path": str(source.resolve()), "fingerprint": fingerprint},
                    options=recorded)
    write_manifest(to, manifest)
    (to / PROGRESS).unlink(missing_ok=True)
    _remove_stale_files(to, read_manifest(to))
    status = "resumed" if job.reused else "prepared"
    return PrepareResult(to, status, read_manifest(to), job.reused, job.written, warnings)


def _intact_manifest(to: Path) -> dict[str, Any]:
    """The manifest already in `to` when it and every shard header agree, else {} (prepare again)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UncheckedManifestWarning)  # prepare adds the checksum itself
            manifest = read_manifest(to)
    except DataError:
        return {}
    if any(shard_header_problems(to, manifest, split) for split in manifest["splits"]):
        return {}
    return manifest


def detect_kind(source: Path, kind: str) -> str:
    if kind != "auto":
        if kind not in ("images", "table", "interactions"):
            raise DataError(f"--kind {kind!r}: use auto, images, table or interactions.")
        if (kind == "images") != source.is_dir():
            raise DataError(f"--kind {kind}: {source} is a {'folder' if source.is_dir() else 'file'}; images come "
                            "as a folder of class sub-folders, tables and interaction logs as one file.")
        return kind
    if source.is_dir():
        return "images"
    suffix = source.suffix.lower()
    if suffix in interaction_kind.INTERACTION_SUFFIXES:  # MovieLens ratings.dat / u.data, RecBole atomic files
        return "interactions"
    if suffix in table_kind.TABLE_SUFFIXES:
        columns = table_kind.read_columns(source)
        return "interactions" if interaction_kind.looks_like_interactions(columns) else "table"
    raise DataError(f"{source}: cannot tell what this is. Give a folder of class sub-folders of images, a "
                    f"table ({', '.join(table_kind.TABLE_SUFFIXES)}), MovieLens ratings.dat or u.data, or a RecBole "
                    ".inter file; or pass --kind.")


def source_fingerprint(source: Path) -> str:
    digest = hashlib.sha256()
    paths = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    for path in paths:
        stat = path.stat()
        digest.update(f"{path.relative_to(source) if source.is_dir() else path.name}\0{stat.st_size}\0"
                      f"{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def default_workers() -> int:
    return usable_cores()


def disk_warnings(to: Path) -> list[str]:
    """The doctor's data-disk check (system disk, network filesystem, spinning disk), as lines to print."""
    from trainwise.data.disk import check_data_dir

    lines = []
    for finding in check_data_dir(to):
        if finding.severity != "info" and finding.code != "free_space":  # free space: check_free_space refuses
            lines.append(f"{finding.detail}." + "".join(f" {fix}" for fix in finding.fixes))
    return lines


def check_free_space(to: Path, needed_bytes: int) -> None:
    """Refuse before writing anything when the estimate (with headroom) does not fit, with the numbers."""
    probe = to
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    needed = int(needed_bytes * SPACE_MARGIN)
    if free < needed:
        raise DataError(f"{to}: the prepared data needs about {needed / 2**30:.2f} GiB ({needed:,} bytes) but "
                        f"only {free / 2**30:.2f} GiB ({free:,} bytes) are free there. Free some space or "
                        "prepare onto a bigger disk with --to.")


def _check_destination(to: Path, source: Path) -> None:
    if to.exists() and not to.is_dir():
        raise DataError(f"--to {to}: exists and is not a directory.")
    if source.is_dir() and to.resolve().is_relative_to(source.resolve()):
        raise DataError(f"--to {to} is inside the source {source}; it would be read as data. Pick another place.")
    if to.is_dir() and any(to.iterdir()) and not ((to / MANIFEST).exists() or (to / PROGRESS).exists()):
        raise DataError(f"--to {to}: the directory is not empty and is not a prepared dataset; refusing to write "
                        "into it. Give an empty or new directory.")


def _remove_stale_files(to: Path, manifest: dict[str, Any]) -> None:
    """Shards left from an earlier preparation with other options (or temp files of a killed run)."""
    from trainwise.data.shards import iter_files

    keep = {entry["file"] for entry in iter_files(manifest)}
    for split in SPLITS:
        for path in (to / split).glob("*") if (to / split).is_dir() else ():
            if f"{split}/{path.name}" not in keep:
                path.unlink()


def shard_size(options: PrepareOptions, sample_bytes: int, most: int = 65536) -> int:
    """Samples per shard: what fits in SHARD_BYTES, at most `most` (images: 1024, a task of a second or two
    of decoding, so a pool of any size has shards to share). Never depends on the worker count: the shard
    layout is part of what a rerun resumes."""
    if options.shard_size:
        return options.shard_size
    return int(max(16, min(most, SHARD_BYTES // max(sample_bytes, 1))))


@dataclass
class _Job:
    """One preparation's shared state: where, what, and the shards done so far (the resume journal)."""

    to: Path
    source: Path
    options: PrepareOptions
    fingerprint: str
    recorded: dict[str, Any]
    workers: int
    progress: Progress | None
    reused: int = 0
    written: int = 0

    def run_shards(self, tasks: list[dict[str, Any]], run: Callable[[dict[str, Any]], dict[str, Any]]
                   ) -> dict[str, dict[str, Any]]:
        """Run shard tasks (in a process pool when there are several workers), skipping finished ones."""
        journal = ProgressJournal(self.to, self.fingerprint, self.recorded)
        done = journal.finished()
        wanted = {f"{t['split']}/{t['index']}" for t in tasks}
        done = {key: entry for key, entry in done.items() if key in wanted}
        self.reused = len(done)
        todo = [t for t in tasks if f"{t['split']}/{t['index']}" not in done]
        self._report(len(done), len(tasks))
        if self.workers <= 1 or len(todo) <= 1:
            for task in todo:
                self._finish(journal, done, task, run(task), len(tasks))
            return done
        pool = ProcessPoolExecutor(max_workers=min(self.workers, len(todo)))
        try:
            pending = {pool.submit(run, task): task for task in todo}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    self._finish(journal, done, pending.pop(future), future.result(), len(tasks))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # on Ctrl-C: queued shards are dropped, running finish
        return done

    def _finish(self, journal: ProgressJournal, done: dict, task: dict[str, Any], result: dict[str, Any],
                total: int) -> None:
        key = f"{task['split']}/{task['index']}"
        done[key] = result
        self.written += 1
        journal.record(key, result)
        self._report(len(done), total)

    def _report(self, done: int, total: int) -> None:
        if self.progress:
            self.progress(done, total)


def _split_counts(done: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    splits = {}
    for split in SPLITS:
        shards = sorted((e["shard"] for k, e in done.items() if k.startswith(f"{split}/")), key=lambda s: s["index"])
        splits[split] = {"count": sum(s["count"] for s in shards), "shards": shards}
    return splits


# ---- the three kinds ------------------------------------------------------------------------------------

def _prepare_images(job: _Job) -> dict[str, Any]:
    folder = image_kind.scan_image_folder(job.source)
    size = image_kind.parse_size(job.options.size)
    channels = job.options.channels
    sample_bytes = channels * size[0] * size[1] + 8
    check_free_space(job.to, sample_bytes * len(folder.files))
    codes = split_codes(folder.labels, len(folder.files), job.options)
    per_shard = shard_size(job.options, sample_bytes, most=1024)
    tasks = []
    for code, split in enumerate(SPLITS):
        members = np.flatnonzero(codes == code)
        for index, start in enumerate(range(0, len(members), per_shard)):
            chunk = members[start:start + per_shard]
            tasks.append({"root": str(job.source), "out": str(job.to), "split": split, "index": index,
                          "size": size, "channels": channels, "files": [folder.files[i] for i in chunk],
                          "labels": folder.labels[chunk].tolist()})
    done = job.run_shards(tasks, image_kind.image_shard_task)
    skipped = sorted((s for entry in done.values() for s in entry["skipped"]), key=lambda s: s["file"])
    train_results = [e for k, e in done.items() if k.startswith("train/")]
    return {
        "task": "classification",
        "schema": {"inputs": {"dtype": "uint8", "shape": [channels, *size]},
                   "targets": {"dtype": "int64", "shape": []}},
        "splits": _split_counts(done),
        "class_names": list(folder.class_names),
        "normalization": {**image_kind.channel_stats(train_results), "computed_on": "train",
                          "units": "pixel / 255"},
        "skipped": {"count": len(skipped), "files": skipped},
    }


def _prepare_table(job: _Job) -> dict[str, Any]:
    columns = table_kind.read_columns(job.source)
    label = table_kind.find_label(columns, job.options.label, job.source)
    missing = table_kind.missing_labels(columns[label])
    columns = {name: values[~missing] for name, values in columns.items()}
    if not len(columns[label]):
        raise DataError(f"{job.source}: no rows with a label in column {label!r}.")
    task = table_kind.choose_task(columns[label], job.options.task)
    targets, class_names = table_kind.encode_labels(columns.pop(label), task)
    codes = split_codes(targets if task == "classification" else None, len(targets), job.options)
    encoder = table_kind.TableEncoder.fit(columns, np.flatnonzero(codes == 0))
    features = encoder.transform(columns)
    check_free_space(job.to, features.nbytes + targets.nbytes)
    manifest = _write_arrays(job, codes, {"inputs": features, "targets": targets})
    return {
        **manifest,
        "task": task,
        "class_names": class_names,
        "label": label,
        "features": encoder.feature_names,
        "encoding": encoder.to_json(),
        "normalization": {**table_kind.feature_stats(features[codes == 0]), "computed_on": "train"},
        "skipped": {"count": int(missing.sum()), "reason": f"no value in label column {label!r}",
                    "rows": (np.flatnonzero(missing) + 1).tolist()},  # 1-based data rows, header not counted
    }


def _prepare_interactions(job: _Job) -> dict[str, Any]:
    o = job.options
    columns = interaction_kind.read_interaction_log(job.source)
    find = interaction_kind.find_column
    user = find(columns, o.user_col, interaction_kind.USER_NAMES, "user", job.source)
    item = find(columns, o.item_col, interaction_kind.ITEM_NAMES, "item", job.source)
    time = find(columns, o.time_col, interaction_kind.TIME_NAMES, "time", job.source)
    event = interaction_kind.find_event_column(columns, o.event_col, job.source)
    target = o.target_col or next((c for c in columns if c.lower() in interaction_kind.TARGET_NAMES
                                   and c not in (user, item, time, event)), None)
    users, user_ids = interaction_kind.dense_ids(columns[user])
    items, item_ids = interaction_kind.dense_ids(columns[item])
    times = interaction_kind.to_timestamps(columns[time], job.source)
    split = interaction_kind.split_by_time(users, times, how=o.split, val_fraction=o.val_fraction,
                                           test_fraction=o.test_fraction, last_k=o.last_k)
    extras = [c for c, v in columns.items() if c not in (user, item, time, target, event) and v.dtype != object]
    order = split.order
    features, partition = interaction_kind.partition_features(columns, event, users, times, order, o.session_gap)
    arrays = {"inputs": np.stack([users[order], items[order]], axis=1),
              "targets": (columns[target][order] if target else np.ones(len(order))).astype(np.float32),
              "timestamp": times[order], **features}
    if extras:
        arrays["extras"] = np.stack([columns[c][order] for c in extras], axis=1).astype(np.float32)
    check_free_space(job.to, sum(a.nbytes for a in arrays.values()) + user_ids.nbytes + item_ids.nbytes)
    manifest = _write_arrays(job, split.split, arrays)
    side = {"user_ids": user_ids, "item_ids": item_ids}
    files = {name: write_shard(job.to, "ids", 0, {name: ids})["files"][name] for name, ids in side.items()}
    return {
        **manifest,
        "task": "regression" if target else "implicit",
        "columns": {"user": user, "item": item, "time": time, "target": target, "event": event, "extras": extras},
        **partition,
        "num_users": len(user_ids), "num_items": len(item_ids),
        "split_method": {"how": o.split, "last_k": o.last_k if o.split == "last-k" else None,
                         "note": "each split's events sorted by user, then time"},
        "files": files,
        "class_names": None,
    }


def _write_arrays(job: _Job, codes: np.ndarray, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """In-memory arrays (tables, interactions) → shards per split, resumable like image shards."""
    sample_bytes = sum(a[:1].nbytes for a in arrays.values())
    per_shard = shard_size(job.options, sample_bytes)
    tasks = []
    for code, split in enumerate(SPLITS):
        rows = np.flatnonzero(codes == code)
        for index, start in enumerate(range(0, len(rows), per_shard)):
            tasks.append({"split": split, "index": index, "rows": rows[start:start + per_shard]})

    def run(task: dict[str, Any]) -> dict[str, Any]:
        return {"shard": write_shard(job.to, task["split"], task["index"],
                                     {name: a[task["rows"]] for name, a in arrays.items()})}

    job.workers = 1  # writing in-memory arrays is I/O; one process, no pickling of the arrays
    done = job.run_shards(tasks, run)
    schema = {name: {"dtype": str(a.dtype), "shape": list(a.shape[1:])} for name, a in arrays.items()}
    return {"schema": schema, "splits": _split_counts(done)}
