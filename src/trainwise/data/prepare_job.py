"""The work of one `trainwise prepare`: a list of shard tasks fixed by the source and the options, run in a
process pool (images) or in this process (in-memory arrays), each finished shard recorded in the progress
journal so that a rerun after an interruption redoes only what is missing."""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainwise.data.shards import PROGRESS, SPLITS, write_shard
from trainwise.rundir.atomic import atomic_write_text
from trainwise.errors import DataError

if TYPE_CHECKING:
    from trainwise.data.prepare_options import PrepareOptions

SHARD_BYTES = 32 * 2**20  # a shard is at most this big, so a pool of workers has shards to share
Progress = Callable[[int, int], None]  # (shards done, shards in all), after each shard

SPACE_MARGIN = 1.1  # headroom over the estimate for .npy headers, the manifest and temp files


def shard_size(options: "PrepareOptions", sample_bytes: int, most: int = 65536) -> int:
    """Samples per shard: what fits in SHARD_BYTES, at most `most` (images: 1024, a task of a second or two
    of decoding, so a pool of any size has shards to share). Never depends on the worker count: the shard
    layout is part of what a rerun resumes."""
    if options.shard_size:
        return options.shard_size
    return int(max(16, min(most, SHARD_BYTES // max(sample_bytes, 1))))


@dataclass
class PrepareJob:
    """One preparation's shared state: where, what, and the shards done so far (the resume journal)."""

    to: Path
    source: Path
    options: "PrepareOptions"
    fingerprint: str
    recorded: dict[str, Any]
    workers: int
    progress: Progress | None
    reused: int = 0
    written: int = 0
    notes: list[str] = field(default_factory=list)     # for the user: how the source was read, the task
    warnings: list[str] = field(default_factory=list)  # ... and what was changed or left to a default

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


def split_counts(done: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    splits = {}
    for split in SPLITS:
        shards = sorted((e["shard"] for k, e in done.items() if k.startswith(f"{split}/")), key=lambda s: s["index"])
        splits[split] = {"count": sum(s["count"] for s in shards), "shards": shards}
    return splits


def write_arrays(job: PrepareJob, codes: np.ndarray, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
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
    return {"schema": schema, "splits": split_counts(done)}


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
            self.start()
            return {}
        done = {}
        for entry in entries:
            files = entry["result"]["shard"]["files"].values()
            if all((self.path.parent / f["file"]).is_file() and
                   (self.path.parent / f["file"]).stat().st_size == f["bytes"] for f in files):
                done[entry["key"]] = entry["result"]
        return done

    def of_this_job(self) -> bool:
        """Whether a journal is there and was started by this job (same source fingerprint and options)."""
        return self._read() is not None

    def start(self) -> None:
        """A fresh journal: the header alone."""
        atomic_write_text(self.path, json.dumps(self.header) + "\n")

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
