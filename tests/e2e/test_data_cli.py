"""`trainwise prepare`, `trainwise data verify|bench`, and training on the result, as a user runs them."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from PIL import Image

from tests.conftest import invoke

FAST = ["train.epochs=2", "train.batch_size=16", "train.log_every=5", "telemetry.enabled=false"]


def photos(root, per_class=16):
    rng = np.random.default_rng(0)
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(rng.normal(70 + 110 * c, 20, (int(rng.integers(20, 40)), 30, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    (root / "dog" / "truncated.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    return root


def _refused(result, *phrases):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in " ".join(result.stderr.split()), f"{phrase!r} not in:\n{result.stderr}"


def test_prepare_reports_then_caches_and_verify_names_a_damaged_shard(tmp_path, capsys):
    source, out = photos(tmp_path / "photos"), tmp_path / "prepared"
    result = invoke(capsys, "prepare", str(source), "--to", str(out), "--size", "16", "--workers", "2")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert f"prepared images into {out}: train" in text
    assert "skipped 1" in text and "dog/truncated.png" in text

    again = invoke(capsys, "prepare", str(source), "--to", str(out), "--size", "16")
    assert again.returncode == 0 and "up to date (same source and options)" in " ".join(again.stdout.split())

    ok = invoke(capsys, "data", "verify", str(out))
    assert ok.returncode == 0 and "match their sha256" in ok.stdout

    manifest = json.loads((out / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["shards"][0]["files"]["inputs"]["file"]
    data = bytearray((out / shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / shard).write_bytes(bytes(data))
    _refused(invoke(capsys, "data", "verify", str(out)), "1 of", shard, "altered", "--force")


def test_bad_input_is_refused_with_a_message(tmp_path, capsys):
    _refused(invoke(capsys, "prepare", str(tmp_path / "nope"), "--to", str(tmp_path / "out")), "no such file")
    (tmp_path / "notes.xyz").write_text("?")
    _refused(invoke(capsys, "prepare", str(tmp_path / "notes.xyz"), "--to", str(tmp_path / "out")),
             "cannot tell what this is", "--kind")
    _refused(invoke(capsys, "prepare", str(tmp_path / "notes.xyz"), "--to", str(tmp_path / "out"),
                    "--kind", "video"), "--kind 'video'")
    _refused(invoke(capsys, "data", "verify", str(tmp_path)), "not a prepared dataset", "trainwise prepare")
    _refused(invoke(capsys, "data", "bench", str(tmp_path), "--workers", "two"), "--workers 'two'")


def _edit_manifest(directory, change):
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("change, field", [
    (lambda m: m["splits"]["train"]["shards"][0].__setitem__("count", 30), "splits.train"),
    (lambda m: m.pop("splits"), "splits: Field required"),
    (lambda m: m.__setitem__("schema", list(m["schema"].values())), "schema: Input should be a valid dictionary"),
    (lambda m: m["splits"]["train"]["shards"][0]["files"]["inputs"].__setitem__("file", "../../etc/passwd"),
     "is not a path inside the dataset directory"),
    (lambda m: m["schema"]["inputs"].__setitem__("shape", [3, 8, 8]), "schema changed"),
], ids=["shard-count", "no-splits", "list-for-object", "outside-path", "shape"])
def test_a_damaged_manifest_is_refused_by_verify_and_train_with_exit_2(tmp_path, capsys, change, field):
    source, out = photos(tmp_path / "photos", per_class=4), tmp_path / "prepared"
    assert invoke(capsys, "prepare", str(source), "--to", str(out), "--size", "16", "--shard-size", "2",
                  "--workers", "1").returncode == 0
    _edit_manifest(out, change)
    _refused(invoke(capsys, "data", "verify", str(out)), "manifest.json", field, "trainwise prepare",
             "trainwise data verify")
    _refused(invoke(capsys, "train", "image-folder", f"data.path={out}", "--out", str(tmp_path / "run"), *FAST),
             "manifest.json", field)


@pytest.mark.slow
def test_own_photos_train_with_prepare_and_train_alone(tmp_path, capsys):
    source, out, run = photos(tmp_path / "photos"), tmp_path / "prepared", tmp_path / "run"
    assert invoke(capsys, "prepare", str(source), "--to", str(out), "--size", "16").returncode == 0
    result = invoke(capsys, "train", "image-folder", f"data.path={out}", "--out", str(run), *FAST)
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] > 0
    assert (run / "model.safetensors").is_file()


@pytest.mark.slow
def test_own_csv_trains_with_the_table_recipe_and_bench_gives_a_verdict(tmp_path, capsys):
    rng = np.random.default_rng(0)
    with open(tmp_path / "customers.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["tenure", "plan", "churned"])
        for i in range(400):
            tenure = int(rng.integers(0, 60))
            writer.writerow([tenure, ("basic", "pro")[i % 2], "yes" if tenure < 12 else "no"])
    out, run = tmp_path / "customers", tmp_path / "run"
    prepared = invoke(capsys, "prepare", str(tmp_path / "customers.csv"), "--to", str(out), "--label", "churned")
    assert prepared.returncode == 0, prepared.stderr
    result = invoke(capsys, "train", "table", f"data.path={out}", "--out", str(run), *FAST)
    assert result.returncode == 0, result.stderr
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    bench = invoke(capsys, "data", "bench", str(out), "--seconds", "0.2", "--workers", "auto,0",
                   "--device", "cpu")
    assert bench.returncode == 0, bench.stderr
    assert "loaded the most" in " ".join(bench.stdout.split()) and "data.num_workers=" in bench.stdout


def test_prepare_an_interaction_log_splits_each_user_by_time(tmp_path, capsys):
    from tests.data.test_interactions import click_log, read_split

    source = tmp_path / "clicks.csv"
    with open(source, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["user_id", "item_id", "timestamp", "rating"])
        writer.writerows(click_log())
    out = tmp_path / "clicks"
    result = invoke(capsys, "prepare", str(source), "--to", str(out), "--split", "last-k", "--last-k", "1")
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "manifest.json").read_text())["kind"] == "interactions"
    train_users, _, train_times = read_split(out, "train")
    test_users, _, test_times = read_split(out, "test")
    assert len(test_users) == len(set(test_users.tolist()))  # one held-out event per user
    for user, held_out_time in zip(test_users.tolist(), test_times.tolist()):
        assert train_times[train_users == user].max(initial=-1) <= held_out_time  # no future in training
    _refused(invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "x"), "--split", "random"), "--split")
