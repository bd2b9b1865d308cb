"""An error in the final writes (a disk that fills while model.safetensors is written; on many ranks a peer lost
during the last collective save) ends the run as `failed` with the cause, not as a `running` run that nobody
is running; the final checkpoint, written before it, is kept."""
import errno

import pytest

from tests.conftest import tiny_config
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery.checkpoint import read_checkpoint
from trainwise.launch.runs import build_trainer


def test_a_failed_final_write_is_recorded_as_failed(tmp_path, monkeypatch):
    config = tiny_config(train={"max_steps": 12, "log_every": 4}, eval={"every_steps": 5})
    run = RunDir(tmp_path / "run")
    trainer = build_trainer(config, run)
    run.initialise()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RunDir, "write_model", disk_full)
    with pytest.raises(OSError, match="No space left"):
        trainer.fit()
    summary = run.read_summary()
    assert summary["status"] == "failed" and "No space left on device" in summary["message"]
    assert read_checkpoint(run.checkpoint_path("last"))["step"] == 12  # resumable from the final step
    assert "No space left on device" in run.error_log_path.read_text()  # the traceback, for diagnose
