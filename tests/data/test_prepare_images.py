from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import trainwise.data
from trainwise.data.images import decode_image
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.data.shards import MANIFEST, PROGRESS, staging_dir, verify
from trainwise.errors import DataError

OPTIONS = PrepareOptions(size="16x12", shard_size=5, val_fraction=0.2, test_fraction=0.2)


def test_images_are_resized_cropped_uint8_and_broken_files_are_listed(image_folder, tmp_path):
    result = prepare(image_folder, tmp_path / "out", OPTIONS, workers=2)
    manifest = result.manifest
    assert result.status == "prepared"
    assert manifest["kind"] == "images" and manifest["class_names"] == ["cat", "dog", "fish"]
    assert manifest["schema"]["inputs"] == {"dtype": "uint8", "shape": [3, 16, 12]}
    assert {s["file"] for s in manifest["skipped"]["files"]} == {"cat/broken.jpg", "dog/empty.png"}
    assert manifest["skipped"]["count"] == 2
    assert sum(s["count"] for s in manifest["splits"].values()) == 36  # 3 x 12 good images, .txt ignored
    assert all(len(m["shards"]) >= 1 for m in manifest["splits"].values())
    assert all(shard["count"] <= 5 for m in manifest["splits"].values() for shard in m["shards"])
    first = manifest["splits"]["train"]["shards"][0]["files"]["inputs"]
    assert len(first["sha256"]) == 64 and first["bytes"] > 0
    assert manifest["format_version"] == 1 and manifest["source"]["fingerprint"]


def test_split_is_stratified_and_stats_come_from_train(image_folder, tmp_path):
    manifest = prepare(image_folder, tmp_path / "out", OPTIONS, workers=1).manifest
    for split in ("train", "val", "test"):
        targets = trainwise.data.open(tmp_path / "out", split).targets.numpy()
        assert set(targets) == {0, 1, 2}, f"every class in {split}"
    raw = trainwise.data.open(tmp_path / "out", "train", normalize=False)
    pixels, _ = raw.__getitems__(list(range(len(raw))))
    per_channel = pixels.permute(1, 0, 2, 3).reshape(3, -1)
    np.testing.assert_allclose(manifest["normalization"]["mean"], per_channel.mean(1).numpy(), atol=1e-4)
    np.testing.assert_allclose(manifest["normalization"]["std"], per_channel.std(1, unbiased=False).numpy(),
                               atol=1e-4)
    normalised, _ = trainwise.data.open(tmp_path / "out", "train").__getitems__(list(range(len(raw))))
    assert abs(float(normalised.mean())) < 1e-3


def test_stored_pixels_are_the_decoded_source(image_folder, tmp_path):
    prepare(image_folder, tmp_path / "out", OPTIONS, workers=2)
    stored = [image for split in ("train", "val", "test")
              for image in trainwise.data.open(tmp_path / "out", split).gather(
                  range(len(trainwise.data.open(tmp_path / "out", split))), ["inputs"])["inputs"]]
    for name in ("fish/002.webp", "cat/000.png", "cat/001.jpg", "dog/003.png"):  # gray WebP, RGBA, JPEG, palette
        expected = decode_image(image_folder / name, (16, 12), 3)
        assert expected.shape == (3, 16, 12)
        assert any(np.array_equal(expected, image) for image in stored), name


def test_rerun_with_same_source_and_options_does_nothing(image_folder, tmp_path):
    out = tmp_path / "out"
    prepare(image_folder, out, OPTIONS, workers=1)
    before = (out / MANIFEST).stat().st_mtime_ns
    again = prepare(image_folder, out, OPTIONS, workers=1)
    assert again.status == "up-to-date" and (out / MANIFEST).stat().st_mtime_ns == before
    changed = prepare(image_folder, out, PrepareOptions(size="8", shard_size=5), workers=1)
    assert changed.status == "prepared"
    assert changed.manifest["schema"]["inputs"]["shape"] == [3, 8, 8]
    assert verify(out) == []  # shards of the old size were replaced, none left behind
    (image_folder / "dog" / "000.png").unlink()
    assert prepare(image_folder, out, PrepareOptions(size="8", shard_size=5), workers=1).status == "prepared"


def test_interrupted_prepare_resumes_and_matches_a_fresh_one(image_folder, tmp_path):
    out = tmp_path / "out"

    def interrupt_after_three(done, total):
        if done >= 3:
            raise KeyboardInterrupt  # what Ctrl-C does mid-run

    with pytest.raises(KeyboardInterrupt):
        prepare(image_folder, out, OPTIONS, workers=1, progress=interrupt_after_three)
    assert not (out / MANIFEST).exists() and (staging_dir(out) / PROGRESS).exists()  # the journal is staged
    assert not list(staging_dir(out).rglob("*.tmp")), "no half-written shard left behind"
    with pytest.raises(DataError, match="did not finish"):
        trainwise.data.open(out, "train")

    resumed = prepare(image_folder, out, OPTIONS, workers=2)
    assert resumed.status == "resumed" and resumed.reused_shards == 3
    fresh = prepare(image_folder, tmp_path / "fresh", OPTIONS, workers=1)
    assert resumed.written_shards == sum(len(s["shards"]) for s in fresh.manifest["splits"].values()) - 3
    for split in ("train", "val", "test"):
        assert resumed.manifest["splits"][split]["shards"] == fresh.manifest["splits"][split]["shards"]
    assert not (out / PROGRESS).exists() and not staging_dir(out).exists() and verify(out) == []


def test_verify_names_a_flipped_byte_and_a_truncated_shard(image_folder, tmp_path):
    out = tmp_path / "out"
    manifest = prepare(image_folder, out, OPTIONS, workers=1).manifest
    flipped = manifest["splits"]["val"]["shards"][0]["files"]["inputs"]["file"]
    data = bytearray((out / flipped).read_bytes())
    data[-1] ^= 0x01
    (out / flipped).write_bytes(bytes(data))
    truncated = manifest["splits"]["train"]["shards"][1]["files"]["targets"]["file"]
    with open(out / truncated, "r+b") as f:
        f.truncate(40)
    problems = {p.file: p.problem for p in verify(out)}
    assert set(problems) == {flipped, truncated}
    assert "altered" in problems[flipped] and "truncated" in problems[truncated]
    with pytest.raises(DataError, match="truncated"):
        trainwise.data.open(out, "train")


def test_refuses_when_free_space_is_short_with_the_numbers(image_folder, tmp_path, monkeypatch):
    import trainwise.data.prepare_job as prepare_module  # where check_free_space reads the disk

    usage = shutil.disk_usage(tmp_path)._replace(free=1000)
    monkeypatch.setattr(prepare_module.shutil, "disk_usage", lambda path: usage)
    with pytest.raises(DataError, match=r"needs about .* GiB .* bytes\) but only 0.00 GiB \(1,000 bytes\)"):
        prepare(image_folder, tmp_path / "out", OPTIONS, workers=1)
    assert not list((tmp_path / "out").rglob("*.npy"))


def test_the_doctors_system_disk_warning_is_passed_on(image_folder, tmp_path, monkeypatch):
    from trainwise.data import disk
    from trainwise.findings import Finding

    monkeypatch.setattr(disk, "check_data_dir", lambda path, **_: [
        Finding("data_disk", "warn", "Data disk", f"{path} is on the system disk", {}, ["Put the data on a data disk"]),
        Finding("disk_type", "info", "Disk type", "an SSD", {})])
    result = prepare(image_folder, tmp_path / "out", OPTIONS, workers=1)
    assert result.warnings == [f"{tmp_path / 'out'} is on the system disk. Put the data on a data disk"]


def test_bad_sources_and_destinations_are_refused(image_folder, tmp_path):
    with pytest.raises(DataError, match="no such file"):
        prepare(tmp_path / "missing", tmp_path / "out")
    one_class = tmp_path / "one"
    (one_class / "only").mkdir(parents=True)
    shutil.copy(image_folder / "cat" / "000.png", one_class / "only")
    with pytest.raises(DataError, match="at least two classes"):
        prepare(one_class, tmp_path / "out")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "thesis.tex").write_text("precious")
    with pytest.raises(DataError, match="not empty and is not a prepared dataset"):
        prepare(image_folder, busy, OPTIONS)
    with pytest.raises(DataError, match="inside the source"):
        prepare(image_folder, image_folder / "prepared", OPTIONS)
    with pytest.raises(DataError, match="--size"):
        prepare(image_folder, tmp_path / "out", PrepareOptions(size="big"))
    with pytest.raises(DataError, match="under 0.9"):
        prepare(image_folder, tmp_path / "out", PrepareOptions(val_fraction=0.5, test_fraction=0.5))


def test_manifest_round_trips_through_json(image_folder, tmp_path):
    result = prepare(image_folder, tmp_path / "out", OPTIONS, workers=1)
    on_disk = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert on_disk == result.manifest
    assert on_disk["options"]["size"] == "16x12" and on_disk["options"]["shard_size"] == 5
    assert Path(on_disk["source"]["path"]) == image_folder.resolve()


def test_a_journal_line_torn_by_a_kill_costs_only_that_shard(image_folder, tmp_path):
    out = tmp_path / "out"

    def interrupt_after_four(done, total):
        if done >= 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(image_folder, out, OPTIONS, workers=1, progress=interrupt_after_four)
    journal = staging_dir(out) / PROGRESS
    text = journal.read_text()
    journal.write_text(text[:-40])  # the last record cut mid-line, as a kill during the write leaves it
    resumed = prepare(image_folder, out, OPTIONS, workers=1)
    assert resumed.status == "resumed" and resumed.reused_shards == 3
    assert verify(out) == []
