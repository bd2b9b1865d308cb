"""manifest.json is data too: each hand edit or corruption below is refused with a DataError that names the
field and the fix, when the dataset is opened, before any batch is read."""
from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

import trainwise.data
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.data.shards import CHECKSUM, UncheckedManifestWarning, read_manifest, verify
from trainwise.errors import DataError

SHARD = 16


@pytest.fixture
def table(tmp_path, write_csv):
    """A prepared table whose train split has several shards of SHARD rows."""
    rng = np.random.default_rng(0)
    rows = [[round(float(x), 3), round(float(y), 3), "ab"[i % 2]] for i, (x, y) in enumerate(rng.normal(size=(120, 2)))]
    source = write_csv(tmp_path / "points.csv", ["u", "v", "label"], rows)
    out = tmp_path / "prepared"
    prepare(source, out, PrepareOptions(shard_size=SHARD), workers=1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["shards"][0]["count"] == SHARD and len(manifest["splits"]["train"]["shards"]) > 3
    return out


def edit(directory, change, *, checksum: str = "keep"):
    """Change manifest.json as a hand edit would: `change(manifest)` in place; checksum "keep" leaves the
    recorded one (now stale), "drop" removes it (a manifest from before checksums, edited)."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    if checksum == "drop":
        manifest.pop(CHECKSUM, None)
    change(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def refused(directory, *phrases):
    with pytest.raises(DataError) as error, warnings.catch_warnings():
        warnings.simplefilter("ignore", UncheckedManifestWarning)
        trainwise.data.open(directory, "train")
    message = " ".join(str(error.value).split())
    assert "manifest.json" in message and "trainwise prepare" in message, message
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} not in: {message}"
    return message


def first_shard(manifest):
    return manifest["splits"]["train"]["shards"][0]


def set_first_count(count, *, split_too=False):
    def change(manifest):
        old = first_shard(manifest)["count"]
        first_shard(manifest)["count"] = count
        if split_too:
            manifest["splits"]["train"]["count"] += count - old
    return change


# ---- shard counts (16→30: an IndexError mid-training before; 16→1: 15 samples silently left out) ----------

@pytest.mark.parametrize("count", [30, 1])
def test_a_shard_count_that_no_longer_adds_up_names_the_split(table, count):
    edit(table, set_first_count(count))
    refused(table, "splits.train", "add up")


@pytest.mark.parametrize("count", [30, 1])
def test_a_consistent_count_edit_is_caught_by_the_checksum(table, count):
    edit(table, set_first_count(count, split_too=True))
    refused(table, "splits changed since `trainwise prepare` wrote it")


@pytest.mark.parametrize("count", [30, 1])
def test_without_a_checksum_the_shard_header_still_catches_a_count_edit(table, count):
    edit(table, set_first_count(count, split_too=True), checksum="drop")
    refused(table, f"holds {SHARD} samples, splits.train.shards.0.count says {count}", "trainwise data verify")


# ---- shapes and dtypes --------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, phrase", [
    ("shape", [2, 1], "schema.inputs.shape says [2, 1]"),
    ("dtype", "float64", "schema.inputs.dtype says float64"),
])
def test_shape_or_dtype_edits_are_caught_against_the_shard_headers(table, field, value, phrase):
    edit(table, lambda m: m["schema"]["inputs"].__setitem__(field, value), checksum="drop")
    refused(table, phrase)


def test_a_shape_edit_with_the_checksum_names_the_schema(table):
    edit(table, lambda m: m["schema"]["inputs"].__setitem__("shape", [2, 1]))
    refused(table, "schema changed")


def test_normalisation_stats_must_fit_the_inputs(table):
    edit(table, lambda m: m["normalization"]["mean"].append(0.0))
    refused(table, "normalization has 3 means and 2 stds for inputs of shape [2]")


def test_a_dtype_that_is_not_a_number_type_is_named(table):
    edit(table, lambda m: m["schema"]["inputs"].__setitem__("dtype", "uint9"))
    refused(table, "schema.inputs.dtype", "'uint9' is not a numpy dtype")


# ---- structure --------------------------------------------------------------------------------------------

def test_a_missing_splits_is_named(table):
    edit(table, lambda m: m.pop("splits"))
    refused(table, "splits: Field required")


@pytest.mark.parametrize("key", ["splits", "schema"])
def test_a_list_instead_of_an_object_is_named(table, key):
    edit(table, lambda m: m.__setitem__(key, list(m[key].values())))
    refused(table, f"{key}: Input should be a valid dictionary")


def test_a_manifest_that_is_a_list_is_refused(table):
    path = table / "manifest.json"
    path.write_text(json.dumps([json.loads(path.read_text())]))
    refused(table, "(top level): Input should be a valid dictionary")


# ---- file names outside the dataset ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../outside.npy", "train/../../outside.npy", "/tmp/outside.npy"])
def test_a_file_name_outside_the_dataset_is_refused_without_being_opened(table, name):
    manifest = json.loads((table / "manifest.json").read_text())
    shard = first_shard(manifest)["files"]["inputs"]
    shutil.copy(table / shard["file"], table.parent / "outside.npy")  # a readable file is waiting there
    edit(table, lambda m: first_shard(m)["files"]["inputs"].__setitem__("file", name), checksum="drop")
    refused(table, "splits.train.shards.0.files.inputs.file", "is not a path inside the dataset directory")


# ---- the checksum covers what the cross-checks cannot see ----------------------------------------------

def test_any_other_edit_is_named_by_the_checksum(table):
    edit(table, lambda m: m["class_names"].reverse())  # every label would silently mean the other class
    refused(table, "class_names changed")


def test_an_older_manifest_without_a_checksum_is_read_with_a_warning_and_prepare_adds_one(table, tmp_path):
    edit(table, lambda m: None, checksum="drop")
    with pytest.warns(UncheckedManifestWarning, match="no checksum"):
        dataset = trainwise.data.open(table, "train")
    assert len(dataset) > 0
    shards = sorted((table / "train").glob("*.npy"))
    written = {p: p.stat().st_mtime_ns for p in shards}
    prepare(tmp_path / "points.csv", table, PrepareOptions(shard_size=SHARD), workers=1)  # the same command
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedManifestWarning)
        assert CHECKSUM in read_manifest(table)
    assert {p: p.stat().st_mtime_ns for p in shards} == written, "no shard is redone to add a checksum"


def test_prepare_again_over_a_damaged_manifest_prepares_afresh(table, tmp_path):
    edit(table, set_first_count(1, split_too=True), checksum="drop")
    result = prepare(tmp_path / "points.csv", table, PrepareOptions(shard_size=SHARD), workers=1)
    assert result.status == "prepared" and first_shard(result.manifest)["count"] == SHARD
    assert verify(table) == []
