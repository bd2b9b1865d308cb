"""`trainwise prepare SOURCE --to DIR`: raw images, tables, interaction logs or text → a checksummed, sharded,
memory-mappable dataset (see shards.py for the layout). Text and instruction data are tokenised by
data/text/prepare.py, into the same shards and manifest.

The job is a list of shards fixed by the source and the options, written into a staging folder beside DIR
and swapped in when complete (destination.py), so DIR holds the previous dataset until then. Each finished
shard is recorded in a progress journal there, so a rerun after an interruption redoes only what is missing
(text is tokenised in one pass and redone whole); a rerun whose source and options match the manifest does
nothing. The source fingerprint is its files' names, sizes and
modification times (cheap on millions of files; touching a file counts as a change).
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from trainwise.data import images as image_kind
from trainwise.data import interactions as interaction_kind
from trainwise.data import tables as table_kind
from trainwise.data.prepare_job import (PrepareJob, Progress, check_free_space, shard_size, split_counts,
                                        write_arrays)
from trainwise.data.splits import empty_split_warnings, split_codes
from trainwise.data.table_files import read_columns, read_table
from trainwise.data.destination import abandon, check_destination, open_staging, seal, swap_in, writing
from trainwise.data.shards import (CHECKSUM, FORMAT_VERSION, MANIFEST, SPLITS, UncheckedManifestWarning,
                                   read_manifest, shard_header_problems, write_manifest, write_shard)
from trainwise.data.prepare_options import PrepareOptions
from trainwise.errors import DataError, TrainwiseError


@dataclass
class PrepareResult:
    directory: Path
    status: Literal["prepared", "resumed", "up-to-date"]
    manifest: dict[str, Any]
    reused_shards: int = 0
    written_shards: int = 0
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the source was read, the task chosen


def prepare(source: str | Path, to: str | Path, options: PrepareOptions = PrepareOptions(), *,
            workers: int | None = None, force: bool = False, progress: Progress | None = None,
            wait_s: float | None = None, inputs: dict[str, str] | None = None) -> PrepareResult:
    """Prepare `source` into `to`; see the module docstring for caching and resume, destination.py for how
    `to` is replaced (never written in place). `wait_s`: how long to wait for another prepare into `to` to
    finish before refusing (default: a moment; a shared cache waits, then finds it up to date). `inputs`:
    fingerprints of other files the result depends on (a --tokenizer directory's contents), recorded with the
    options."""
    source, to = Path(source).expanduser(), Path(to).expanduser()
    options.check()
    if not source.exists():
        raise DataError(f"{source}: no such file or directory.")
    kind = detect_kind(source, options.kind, options.encoding, options.text_field)
    options.check_kind(kind)
    options = PrepareOptions(**{**asdict(options), "kind": kind})
    if kind == "text":  # the ids also depend on the tokenizer's files and the held-out file
        inputs = {**_text_inputs(options), **(inputs or {})}
    recorded = {**asdict(options), "format_version": FORMAT_VERSION, **(inputs or {})}
    fingerprint = source_fingerprint(source)
    check_destination(to, source)  # before anything is made, the lock file included
    place = to.resolve()  # a link to a dataset: the dataset is replaced, not the link
    with writing(place, wait_s):
        check_destination(to, source)  # again, now that no other prepare can change it
        current = None if force else _up_to_date(place, fingerprint, recorded)
        if current is not None:
            said = current.get("messages") or {}
            return PrepareResult(to, "up-to-date", current, warnings=list(said.get("warnings", [])),
                                 notes=list(said.get("notes", [])))
        warnings = disk_warnings(to)
        staging = open_staging(place, fingerprint, recorded, fresh=force)
        job = PrepareJob(staging, source, options, fingerprint, recorded, workers or default_workers(), progress)
        manifest = _build(job, kind, to)
        _remove_stale_files(staging, manifest)
        seal(staging, manifest)
        kept = swap_in(staging, place)
    said = manifest["messages"]
    status = "resumed" if job.reused else "prepared"
    return PrepareResult(to, status, read_manifest(to), job.reused, job.written,
                         warnings + said["warnings"] + kept, said["notes"])


def prepare_corpus(source: str | Path, to: str | Path, options: PrepareOptions | None = None, **kwargs: Any
                   ) -> PrepareResult:
    """`prepare` for a source that is text or instruction data whatever its files look like (a folder of notes,
    a .json of rows). `kwargs`: prepare's workers, force, progress, wait_s."""
    options = options or PrepareOptions()
    if options.kind not in ("auto", "text"):
        raise DataError(f"--kind {options.kind}: this source is prepared as text.")
    return prepare(source, to, replace(options, kind="text"), **kwargs)


def _text_inputs(options: PrepareOptions) -> dict[str, str]:
    """Fingerprints of the files a text dataset's ids depend on besides the source: a --tokenizer directory's
    files, and a --test-file (its edits count too)."""
    from trainwise.data.text.prepare import tokenizer_files_fingerprint

    inputs = tokenizer_files_fingerprint(options.tokenizer)
    if options.test_file is not None and Path(options.test_file).expanduser().exists():
        inputs["test_file"] = source_fingerprint(Path(options.test_file).expanduser())
    return inputs


def _prepare_text(job: PrepareJob) -> dict[str, Any]:
    from trainwise.data.text.prepare import prepare_text_or_chat

    return prepare_text_or_chat(job.to, job.source, job.options)


def _build(job: PrepareJob, kind: str, to: Path) -> dict[str, Any]:
    """The new dataset's manifest, its files written into the staging folder `job.to`."""
    build = {"images": _prepare_images, "table": _prepare_table, "interactions": _prepare_interactions,
             "text": _prepare_text}[kind]
    try:
        manifest = build(job)
    except BaseException as error:  # bad data, a bug, Ctrl-C: `to` is untouched; keep what a rerun can resume
        kept = abandon(job.to)
        if isinstance(error, TrainwiseError):
            error.add_note(f"{to} was not changed by this prepare. Fix the problem and run it again"
                           + (f"; the {kept} finished shards kept beside it are reused if the source and options "
                              "are the same." if kept else "."))
        raise
    said = {"notes": job.notes, "warnings": job.warnings + empty_split_warnings(manifest["splits"], job.options)}
    manifest.update(kind=kind, source={"path": str(job.source.resolve()), "fingerprint": job.fingerprint},
                    options=job.recorded, messages=said)
    return manifest


def _up_to_date(to: Path, fingerprint: str, recorded: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of `to` when it is intact and was prepared from this source with these options."""
    if not (to / MANIFEST).is_file():
        return None
    manifest = _intact_manifest(to)
    if manifest.get("source", {}).get("fingerprint") != fingerprint or not same_options(manifest.get("options"),
                                                                                       recorded):
        return None
    if CHECKSUM not in manifest:  # written by an older trainwise, its shards check out: add one
        write_manifest(to, manifest)
    return read_manifest(to)


def same_options(old: Any, new: dict[str, Any]) -> bool:
    """Whether a manifest's recorded options are `new`; an option added since it was written counts as its
    default, so a dataset prepared by an older trainwise is not redone for options it could not have had."""
    defaults = asdict(PrepareOptions())
    return isinstance(old, dict) and set(old) <= set(new) and all(old.get(key, defaults.get(key)) == value
                                                                  for key, value in new.items())


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


def detect_kind(source: Path, kind: str, encoding: str | None = None, text_field: str = "text") -> str:
    if kind != "auto":
        if kind not in ("images", "table", "interactions", "text"):
            raise DataError(f"--kind {kind!r}: use auto, images, table, interactions or text.")
        if kind != "text" and (kind == "images") != source.is_dir():
            raise DataError(f"--kind {kind}: {source} is a {'folder' if source.is_dir() else 'file'}; images come "
                            "as a folder of class sub-folders, tables and interaction logs as one file.")
        return kind
    from trainwise.data.text.corpus import looks_like_text

    if looks_like_text(source, text_field):
        return "text"
    if source.is_dir():
        return "images"
    suffix = source.suffix.lower()
    if suffix in interaction_kind.INTERACTION_SUFFIXES:  # MovieLens ratings.dat / u.data, RecBole atomic files
        return "interactions"
    if suffix in table_kind.TABLE_SUFFIXES:
        columns = read_columns(source, encoding)
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
    from trainwise.data.loader import usable_cores  # the loader imports torch; preparing data needs none

    return usable_cores()


def disk_warnings(to: Path) -> list[str]:
    """The doctor's data-disk check (system disk, network filesystem, spinning disk), as lines to print."""
    from trainwise.data.disk import check_data_dir

    lines = []
    for finding in check_data_dir(to):
        if finding.severity != "info" and finding.code != "free_space":  # free space: check_free_space refuses
            lines.append(f"{finding.detail}." + "".join(f" {fix}" for fix in finding.fixes))
    return lines


def _remove_stale_files(to: Path, manifest: dict[str, Any]) -> None:
    """Shards an interrupted run of this job left in the staging folder that the finished job does not use."""
    from trainwise.data.shards import iter_files

    keep = {entry["file"] for entry in iter_files(manifest)}
    for split in SPLITS:
        for path in (to / split).glob("*") if (to / split).is_dir() else ():
            if f"{split}/{path.name}" not in keep:
                path.unlink()


# ---- the three kinds ------------------------------------------------------------------------------------

def _prepare_images(job: PrepareJob) -> dict[str, Any]:
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
                          "max_pixels": job.options.max_image_pixels,
                          "labels": folder.labels[chunk].tolist()})
    done = job.run_shards(tasks, image_kind.image_shard_task)
    skipped = sorted((s for entry in done.values() for s in entry["skipped"]), key=lambda s: s["file"])
    advice = image_kind.skip_advice(skipped)
    job.warnings += [advice] if advice else []
    train_results = [e for k, e in done.items() if k.startswith("train/")]
    return {
        "task": "classification",
        "schema": {"inputs": {"dtype": "uint8", "shape": [channels, *size]},
                   "targets": {"dtype": "int64", "shape": []}},
        "splits": split_counts(done),
        "class_names": list(folder.class_names),
        "normalization": {**image_kind.channel_stats(train_results), "computed_on": "train",
                          "units": "pixel / 255"},
        "skipped": {"count": len(skipped), "files": skipped},
    }


def _prepare_table(job: PrepareJob) -> dict[str, Any]:
    o = job.options
    table = table_kind.label_table(read_table(job.source, o.encoding), job.source, label=o.label, task=o.task,
                                   numeric=o.numeric, categorical=o.categorical)
    job.notes += table.notes
    job.warnings += table.warnings
    targets = table.targets
    codes = split_codes(targets if table.task == "classification" else None, len(targets), o)
    encoder = table_kind.TableEncoder.fit(table.features, np.flatnonzero(codes == 0))
    features = encoder.transform(table.features)
    check_free_space(job.to, features.nbytes + targets.nbytes)
    manifest = write_arrays(job, codes, {"inputs": features, "targets": targets})
    return {
        **manifest,
        "task": table.task,
        "class_names": table.class_names,
        "label": table.label,
        "features": encoder.feature_names,
        "encoding": encoder.to_json(),
        "normalization": {**table_kind.feature_stats(features[codes == 0]), "computed_on": "train"},
        "skipped": {"count": int(table.unlabelled.sum()), "reason": f"no value in label column {table.label!r}",
                    "rows": (np.flatnonzero(table.unlabelled) + 1).tolist()},  # 1-based data rows
    }


def _prepare_interactions(job: PrepareJob) -> dict[str, Any]:
    o = job.options
    log = interaction_kind.read_interaction_log(job.source, o.encoding)
    columns, job.notes = log.columns, job.notes + log.notes
    c = interaction_kind.log_columns(columns, job.source, user=o.user_col, item=o.item_col, time=o.time_col,
                                     event=o.event_col, target=o.target_col)
    if not o.keep_duplicates:
        columns, dropped = interaction_kind.drop_duplicate_events(columns)
        job.warnings += [dropped] if dropped else []
    users, user_ids = interaction_kind.dense_ids(columns[c.user])
    items, item_ids = interaction_kind.dense_ids(columns[c.item])
    times = interaction_kind.to_timestamps(columns[c.time], job.source)
    split = interaction_kind.split_by_time(users, times, how=o.split, val_fraction=o.val_fraction,
                                           test_fraction=o.test_fraction, last_k=o.last_k)
    order = split.order
    features, partition = interaction_kind.partition_features(columns, c.event, users, times, order, o.session_gap)
    arrays = {"inputs": np.stack([users[order], items[order]], axis=1),
              "targets": (columns[c.target][order] if c.target else np.ones(len(order))).astype(np.float32),
              "timestamp": times[order], **features}
    if c.extras:
        arrays["extras"] = np.stack([columns[name][order] for name in c.extras], axis=1).astype(np.float32)
    check_free_space(job.to, sum(a.nbytes for a in arrays.values()) + user_ids.nbytes + item_ids.nbytes)
    manifest = write_arrays(job, split.split, arrays)
    side = {"user_ids": user_ids, "item_ids": item_ids}
    files = {name: write_shard(job.to, "ids", 0, {name: ids})["files"][name] for name, ids in side.items()}
    return {
        **manifest,
        "task": "regression" if c.target else "implicit",
        "columns": {"user": c.user, "item": c.item, "time": c.time, "target": c.target, "event": c.event,
                    "extras": list(c.extras)},
        **partition,
        "num_users": len(user_ids), "num_items": len(item_ids),
        "split_method": {"how": o.split, "last_k": o.last_k if o.split == "last-k" else None,
                         "note": "each split's events sorted by user, then time"},
        "files": files,
        "class_names": None,
    }
