"""Checksums of checkpoints and weights: recorded while written, verified on load, a fallback on damage."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from trainwise.errors import DamagedFileError, RunDirError
from trainwise.rundir.layout import RunDir
from trainwise.train.recovery.checkpoint import checkpoint_writer, read_checkpoint


def _checkpoint(step: int) -> dict:
    return {"model": {"w": torch.full((4000,), float(step))}, "step": step}


@pytest.fixture
def run(tmp_path) -> RunDir:
    """Step checkpoints 20, 30, 40 kept (10 rotated out), `best` = 20, `last` = 40."""
    run = RunDir.create(tmp_path / "run")
    for step in (10, 20, 30, 40):
        run.save_checkpoint(step, checkpoint_writer(_checkpoint(step)), is_best=step == 20, keep_last=3)
    return run


def _damage(path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))  # in place: `last` and its step file are one file (a hard link)


def test_the_checksum_of_each_checkpoint_is_recorded_as_written(run):
    files = json.loads(run.checksums_path.read_text())["files"]
    assert set(files) == {"checkpoints/step-00000020.pt", "checkpoints/step-00000030.pt",
                          "checkpoints/step-00000040.pt", "checkpoints/last.pt", "checkpoints/best.pt"}
    last = run.checkpoint_path("last")
    assert files["checkpoints/last.pt"] == {"sha256": hashlib.sha256(last.read_bytes()).hexdigest(),
                                            "bytes": last.stat().st_size}
    assert files["checkpoints/best.pt"] == files["checkpoints/step-00000020.pt"]
    choice = run.latest_intact_checkpoint()
    assert choice.path == last and choice.step == 40 and choice.notice is None


def test_zeroed_bytes_in_last_fall_back_to_the_newest_intact_checkpoint(run):
    last = run.checkpoint_path("last")
    _damage(last, 1000, bytes(5000))
    assert read_checkpoint(last)["step"] == 40  # torch loads it without a word: only the checksum tells
    with pytest.raises(DamagedFileError, match="last.pt is damaged: its bytes changed"):
        run.verify(last)
    choice = run.latest_intact_checkpoint()
    assert choice.path == run.checkpoint_path(30) and choice.step == 30
    assert "checkpoints/last.pt is damaged" in choice.notice and "same file as step-00000040.pt" in choice.notice
    assert "Using step-00000030.pt (step 30) instead" in choice.notice
    assert torch.equal(read_checkpoint(choice.path)["model"]["w"], torch.full((4000,), 30.0))


def test_a_deleted_last_falls_back_to_the_newest_step_checkpoint(run):
    run.checkpoint_path("last").unlink()
    choice = run.latest_intact_checkpoint()
    assert choice.path == run.checkpoint_path(40) and "checkpoints/last.pt is missing" in choice.notice


def test_a_cut_short_checkpoint_is_named_and_skipped(run):
    step40 = run.checkpoint_path(40)
    run.checkpoint_path("last").unlink()
    step40.write_bytes(step40.read_bytes()[:3000])
    choice = run.latest_intact_checkpoint()
    assert choice.step == 30 and "step-00000040.pt is damaged: it is 3,000 bytes but" in choice.notice


def test_no_intact_checkpoint_is_an_error_that_lists_each(run):
    for _, path in run.step_checkpoints():
        _damage(path, 800, b"\xff" * 100)
    with pytest.raises(RunDirError, match="no intact checkpoint: checkpoints/last.pt is damaged.*step-00000030.pt "
                                          "is damaged.*--overwrite"):
        run.latest_intact_checkpoint()


def test_a_run_without_checkpoints_says_so(tmp_path):
    with pytest.raises(RunDirError, match="has no checkpoint yet"):
        RunDir.create(tmp_path / "empty").latest_intact_checkpoint()


def test_overwritten_final_weights_are_refused_not_read_as_nan(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.write_model({"layer.weight": torch.ones(4000), "layer.bias": torch.zeros(10)})
    assert torch.equal(run.read_model()["layer.weight"], torch.ones(4000))
    _damage(run.model_path, 200, b"\xff" * 4000)
    assert torch.isnan(load_file(run.model_path)["layer.weight"]).any()  # what eval used to score
    with pytest.raises(DamagedFileError, match="model.safetensors is damaged.*no other weights are left"):
        run.read_model()


def test_the_advice_for_a_damaged_file_offers_only_what_can_work(run):
    run.write_model({"w": torch.ones(4000)})
    run.write_summary({"status": "completed", "steps": 40})
    _damage(run.model_path, 200, b"\xff" * 4000)
    with pytest.raises(DamagedFileError) as caught:
        run.read_model()
    advice = str(caught.value)
    assert "--checkpoint best or last" in advice  # the weights still here, never the damaged file itself
    assert "final" not in advice.split("--checkpoint")[-1] and "trainwise resume" not in advice  # completed
    run.write_summary({"status": "stopped", "steps": 40})
    with pytest.raises(DamagedFileError, match="trainwise resume .* falls back"):
        run.read_model()


def test_final_weights_without_a_checksum_are_still_checked(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.write_model({"w": torch.ones(1000)})
    run.checksums_path.unlink()  # a run written before checksums
    _damage(run.model_path, 200, b"\xff" * 400)
    with pytest.raises(DamagedFileError, match="NaN or infinite weights"):
        run.read_model()
    run.model_path.write_bytes(run.model_path.read_bytes()[:100])
    with pytest.raises(DamagedFileError, match="cannot be read.*cut short"):
        run.read_model()


def test_free_space_warning_names_what_the_kept_checkpoints_need(run):
    import shutil

    free = shutil.disk_usage(run.path).free
    assert run.check_free_space(checkpoint_bytes=1000, keep_last=3) is None
    warning = run.check_free_space(checkpoint_bytes=free // 2, keep_last=3)
    assert warning and "keeps 5 checkpoints" in warning and "checkpoint.keep_last" in warning
