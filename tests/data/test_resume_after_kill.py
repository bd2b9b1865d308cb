"""A prepare killed with SIGKILL (no cleanup code runs) leaves no half shard, and the rerun resumes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.data.shards import PROGRESS, staging_dir, verify

from .conftest import make_image_folder


@pytest.mark.slow
def test_sigkill_mid_prepare_then_rerun_resumes(tmp_path):
    source = make_image_folder(tmp_path / "photos", per_class=40)
    out = tmp_path / "out"
    script = ("import sys; from trainwise.data.prepare import PrepareOptions, prepare; "
              "prepare(sys.argv[1], sys.argv[2], PrepareOptions(size='8', shard_size=1), workers=1)")
    process = subprocess.Popen([sys.executable, "-c", script, str(source), str(out)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        journal = staging_dir(out) / PROGRESS  # the journal lives in the staging folder beside out
        if journal.exists() and len(journal.read_text().splitlines()) > 20:
            break
        time.sleep(0.02)
    if process.poll() is not None:
        pytest.skip("prepare finished before it could be killed")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (out / "manifest.json").exists()

    result = prepare(source, out, PrepareOptions(size="8", shard_size=1), workers=2)
    assert result.status == "resumed" and result.reused_shards >= 20
    shards = sum(len(split["shards"]) for split in result.manifest["splits"].values())
    assert result.reused_shards + result.written_shards == shards == 122  # 120 images + 2 broken files
    assert verify(out) == [] and not list(out.rglob("*.tmp")) and not (out / PROGRESS).exists()
    assert not staging_dir(out).exists()
