"""A LoRA run's adapter in peft's own format: RUN/adapter/ (adapter_model.safetensors + adapter_config.json).

peft writes the files (its format is its business) into a temporary directory beside the run, which then
replaces `adapter/` in one rename, so a reader never sees half an adapter; each file's checksum goes into
checksums.json like every other file of the run.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwise.errors import RunDirError
from trainwise.rundir.atomic import atomic_write_directory

if TYPE_CHECKING:
    from trainwise.rundir.layout import RunDir


def write_adapter(run: "RunDir", write: Callable[[Path], Any]) -> Path:
    """`write(tmp)` fills a fresh directory (peft's save_pretrained) that becomes RUN/adapter/ in one rename."""
    run.acquire_writer()
    target = run.adapter_dir()
    try:
        written = atomic_write_directory(target, write)
    except OSError as error:
        raise RunDirError(f"could not write the LoRA adapter to {target}: {error}") from None
    run._ledger.record({w.path: w for w in written})  # the run's checksums, as RunDir's own writes record them
    return target
