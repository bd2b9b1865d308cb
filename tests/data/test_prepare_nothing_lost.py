"""`trainwise prepare` never loses the user's files or a good dataset (issue 32's data-loss cases): it builds
into a staging folder beside --to and swaps it in only when complete, replaces only a folder it made, refuses
a source inside --to, lets one prepare at a time write a --to, and resumes an interrupted run. Each case hashes
the user's tree and the old dataset before and after: byte for byte the same."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import invoke
from trainwise.data import destination
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.data.shards import MANIFEST, PROGRESS, WRITTEN, lock_file, staging_dir, verify
from trainwise.errors import DataError
from trainwise.data.text.chat_templates import CHOICE_FILE
from trainwise.data.prepare import prepare_corpus

from .conftest import make_image_folder

SRC = str(Path(__file__).resolve().parents[2] / "src")
IMAGES = PrepareOptions(size="8", shard_size=5)


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` (hidden ones included) with its sha256; links and empty folders too."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[name] = "-> " + os.readlink(path)
        elif path.is_file():
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif not any(path.iterdir()):
            found[name + "/"] = "empty"
    return found


def nothing_beside(to: Path) -> None:
    """No staging folder, lock file or replaced copy left next to `to`."""
    assert sorted(p.name for p in to.parent.iterdir() if p.name.startswith(f".{to.name}.")) == []


def corpus(folder: Path, n: int = 12, word: str = "stone") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"doc{i:02d}.txt").write_text(f"{word} {i} " * (20 + i))
    return folder


@pytest.fixture
def good_text(tmp_path) -> Path:
    """A prepared byte-level text dataset."""
    out = tmp_path / "out" / "R12"
    prepare_corpus(corpus(tmp_path / "corpus"), out)
    assert verify(out) == []
    return out


# ---- 1. someone else's manifest.json, the user's files in split folders ---------------------------------

def test_a_folder_with_a_foreign_manifest_and_source_files_is_refused_untouched(tmp_path, capsys):
    mydata = tmp_path / "mydata"
    for split, n in (("train", 8), ("val", 3)):
        corpus(mydata / split, n)
    (mydata / "manifest.json").write_text(json.dumps({"audio_filepath": "a.wav", "duration": 1.5, "text": "hi"}))
    before = tree(mydata)

    same = invoke(capsys, "prepare", str(mydata / "train"), "--to", str(mydata))  # the command
    assert same.returncode == 2 and "Traceback" not in same.stderr
    assert "inside --to" in " ".join(same.stderr.split())
    other = invoke(capsys, "prepare", str(corpus(tmp_path / "elsewhere")), "--to", str(mydata))
    said = " ".join(other.stderr.split())
    assert other.returncode == 2 and "not written by trainwise" in said and "Nothing was touched" in said
    assert tree(mydata) == before
    nothing_beside(mydata)


def test_a_prepared_dataset_holding_the_users_own_file_is_refused_untouched(good_text, tmp_path):
    (good_text / "train" / "notes.txt").write_text("my notes")
    before = tree(good_text)
    with pytest.raises(DataError, match=r"also holds train/notes.txt, which trainwise did not write"):
        prepare_corpus(corpus(tmp_path / "other", word="river"), good_text)
    assert tree(good_text) == before
    nothing_beside(good_text)


# ---- 2. a source inside the destination --------------------------------------------------------------

def test_a_source_inside_the_destination_is_refused_and_kept(good_text, tmp_path, capsys):
    mine = good_text / "train" / "my_corpus.jsonl"
    mine.write_text("".join(json.dumps({"text": f"line {i} " * 30}) + "\n" for i in range(20)))
    before = tree(good_text)
    result = invoke(capsys, "prepare", str(mine), "--to", str(good_text))
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"the source {mine} is inside --to {good_text}" in said and "Nothing was touched" in said
    with pytest.raises(DataError, match="inside --to"):
        prepare_corpus(good_text, good_text)  # the folder itself
    assert tree(good_text) == before
    nothing_beside(good_text)


# ---- 3. a re-prepare that fails over a good dataset --------------------------------------------------

@pytest.mark.parametrize("bad", [
    ["--tokenizer", "/no/such/dir"],  # refused up front
    ["--seq-len", "0"], ["--seq-len", "-1"], ["--seq-len", "1"],
    ["--encoding", "latin-1"],  # text is read as UTF-8: refused rather than ignored
    ["--tokenizer", "EMPTY_DIR"],  # passes the up-front checks, fails while building in the staging folder
])
def test_a_failed_re_prepare_leaves_the_old_dataset_verified_and_usable(good_text, tmp_path, capsys, bad):
    mid_way = "EMPTY_DIR" in bad
    if mid_way:
        (tmp_path / "empty").mkdir()
        bad = [bad[0], str(tmp_path / "empty")]
    before = tree(good_text)
    source = tmp_path / "corpus"
    result = invoke(capsys, "prepare", str(source), "--to", str(good_text), "--force", *bad)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    said = " ".join(result.stderr.split())
    assert f"{good_text} was not changed by this prepare" in said if mid_way else said.startswith(f"error: {bad[0]}")
    assert tree(good_text) == before
    nothing_beside(good_text)
    assert invoke(capsys, "data", "verify", str(good_text)).returncode == 0
    again = invoke(capsys, "prepare", str(source), "--to", str(good_text))  # the same good command
    assert again.returncode == 0 and "up to date" in again.stdout
    assert tree(good_text) == before


@pytest.mark.slow
def test_the_old_dataset_still_trains_after_a_failed_re_prepare(good_text, tmp_path, capsys):
    before = tree(good_text)
    failed = invoke(capsys, "prepare", str(tmp_path / "corpus"), "--to", str(good_text), "--tokenizer",
                    "/no/such/dir", "--force")
    assert failed.returncode == 2 and tree(good_text) == before
    trained = invoke(capsys, "train", "lm-gpt", f"data.path={good_text}", "model.args.layers=1",
                     "model.args.width=32", "model.args.heads=2", "data.seq_len=16", "train.max_steps=2",
                     "train.batch_size=2", "schedule.warmup_steps=0", "eval.every_steps=2",
                     "telemetry.enabled=false", "--out", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stderr
    assert tree(good_text) == before


# ---- 4. an interrupted prepare ------------------------------------------------------------------------

def test_ctrl_c_mid_re_prepare_keeps_the_old_dataset_and_the_rerun_resumes(tmp_path):
    photos = make_image_folder(tmp_path / "photos")
    out = tmp_path / "out"
    prepare(photos, out, PrepareOptions(size="8"), workers=1)
    before = tree(out)

    def ctrl_c_after_three(done, total):
        if done >= 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(photos, out, IMAGES, workers=1, progress=ctrl_c_after_three)
    assert tree(out) == before and verify(out) == []
    assert (staging_dir(out) / PROGRESS).is_file() and not lock_file(out).exists()
    resumed = prepare(photos, out, IMAGES, workers=1)
    assert resumed.status == "resumed" and resumed.reused_shards == 3
    assert resumed.manifest["options"]["shard_size"] == 5 and verify(out) == []
    nothing_beside(out)


def test_a_crash_on_a_bad_row_keeps_the_old_dataset_and_the_rerun_works(good_text, tmp_path, monkeypatch):
    import trainwise.data.text.prepare as text_prepare

    before = tree(good_text)
    writes = []
    real = text_prepare._write_batch

    def crash_on_the_second_batch(writers, batch, tokenizer):
        writes.append(len(batch))
        if len(writes) == 2:
            raise RuntimeError("a row no one expected")  # a bug mid-way: not even a TrainwiseError
        real(writers, batch, tokenizer)

    monkeypatch.setattr(text_prepare, "ENCODE_BATCH", 4)
    monkeypatch.setattr(text_prepare, "_write_batch", crash_on_the_second_batch)
    other = corpus(tmp_path / "other", word="river")
    with pytest.raises(RuntimeError, match="no one expected"):
        prepare_corpus(other, good_text)
    assert tree(good_text) == before and verify(good_text) == []
    nothing_beside(good_text)  # text keeps no finished shard to resume from: its staging folder went too

    monkeypatch.setattr(text_prepare, "_write_batch", real)
    result = prepare_corpus(other, good_text)
    assert result.status == "prepared" and verify(good_text) == []
    ids = np.load(good_text / "train" / "tokens-00000.npy")
    assert "river" in bytes(int(i) for i in ids if i < 256).decode()  # the new source's bytes
    nothing_beside(good_text)


def test_a_leftover_staging_folder_of_another_job_never_blocks(good_text, tmp_path):
    staging = staging_dir(good_text)
    (staging / "train").mkdir(parents=True)
    (staging / "train" / "tokens-00007.npy").write_bytes(b"half")
    (staging / PROGRESS).write_text('{"fingerprint": "old", "options": {}}\n')
    result = prepare_corpus(corpus(tmp_path / "other", word="river"), good_text)
    assert result.status == "prepared" and verify(good_text) == []
    assert "train/tokens-00007.npy" not in tree(good_text)
    nothing_beside(good_text)


def test_a_swap_cut_between_its_two_renames_is_finished_by_the_next_prepare(good_text, tmp_path, monkeypatch):
    monkeypatch.setattr(destination, "_exchange", lambda a, b: False)  # a filesystem without RENAME_EXCHANGE
    before = tree(good_text)
    aside = good_text.with_name(f".{good_text.name}.replaced")
    os.rename(good_text, aside)  # what a crash right after the first rename leaves: no dataset at --to
    result = prepare_corpus(tmp_path / "corpus", good_text)  # the same job: the old dataset is put back
    assert result.status == "up-to-date" and tree(good_text) == before
    changed = prepare_corpus(corpus(tmp_path / "other", word="river"), good_text)  # and two renames work
    assert changed.status == "prepared" and verify(good_text) == []
    nothing_beside(good_text)


@pytest.mark.slow
def test_sigint_to_the_cli_mid_re_prepare_keeps_the_old_dataset(tmp_path):
    photos = make_image_folder(tmp_path / "photos", per_class=20)
    out = tmp_path / "out"
    prepare(photos, out, PrepareOptions(size="8"), workers=1)
    before = tree(out)
    command = [sys.executable, "-m", "trainwise", "prepare", str(photos), "--to", str(out), "--size", "8",
               "--shard-size", "1", "--workers", "1"]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    journal = staging_dir(out) / PROGRESS
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) > 10:
            break
        time.sleep(0.02)
    if process.poll() is not None:
        pytest.skip("prepare finished before it could be interrupted")
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    assert "interrupted" in stdout and "as it was before" in " ".join(stdout.split())
    assert tree(out) == before and verify(out) == []
    resumed = prepare(photos, out, PrepareOptions(size="8", shard_size=1), workers=1)
    assert resumed.status == "resumed" and resumed.reused_shards >= 10 and verify(out) == []
    nothing_beside(out)


# ---- 5. two prepares into one --to -------------------------------------------------------------------

HOLD = """
import sys
from pathlib import Path
from trainwise.data.destination import writing
with writing(Path(sys.argv[1]).resolve()):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_prepare_while_one_writes_is_refused_naming_the_holder(good_text, tmp_path):
    before = tree(good_text)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(good_text)], env={**os.environ, "PYTHONPATH": SRC},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DataError, match=rf"is being prepared by pid {holder.pid} on .*One prepare writes"):
            prepare_corpus(corpus(tmp_path / "other", word="river"), good_text)
        assert tree(good_text) == before
    finally:
        holder.communicate("", timeout=30)
    assert not lock_file(good_text).exists()  # the holder removed it on leaving
    assert prepare_corpus(corpus(tmp_path / "other", word="river"), good_text).status == "prepared"


def test_a_shared_cache_waits_for_the_prepare_writing_it(good_text, tmp_path):
    import threading

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(good_text)], env={**os.environ, "PYTHONPATH": SRC},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    threading.Timer(1.5, lambda: holder.stdin.close()).start()  # the other prepare finishes a moment later
    result = prepare_corpus(tmp_path / "corpus", good_text, wait_s=60)  # what data/text/bundle.py's pydoc cache does
    assert result.status == "up-to-date" and holder.wait(timeout=30) == 0


@pytest.mark.slow
def test_two_prepares_at_once_never_mix_their_files(tmp_path):
    photos = make_image_folder(tmp_path / "photos", per_class=12)
    out = tmp_path / "out"
    runs = [subprocess.Popen([sys.executable, "-m", "trainwise", "prepare", str(photos), "--to", str(out),
                              "--size", size, "--shard-size", "1", "--workers", "1"],
                             env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for size in ("8", "12")]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    for code, _, stderr in results:
        assert code in (0, 2) and "Traceback" not in stderr, stderr
        if code == 2:
            assert "is being prepared by pid" in " ".join(stderr.split())
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["options"]["size"] in ("8", "12") and verify(out) == []
    assert set(tree(out)) == set(manifest[WRITTEN])  # one prepare's files, all of them, nothing else
    nothing_beside(out)


# ---- 7. a chat dataset re-prepared as plain text ------------------------------------------------------

def test_the_chat_template_marker_goes_when_a_chat_folder_is_re_prepared_as_text(tmp_path):
    from tests.text.sft_data import reverse_chats

    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(row) + "\n" for row in reverse_chats(30)))
    out = tmp_path / "ds"
    prepare_corpus(chats, out, PrepareOptions(template="chatml", seq_len=64))
    assert (out / "tokenizer" / CHOICE_FILE).is_file()
    prepare_corpus(corpus(tmp_path / "plain"), out)
    manifest = json.loads((out / MANIFEST).read_text())
    assert "instruct" not in manifest and not (out / "tokenizer" / CHOICE_FILE).exists()
    assert set(tree(out)) == set(manifest[WRITTEN]) and verify(out) == []


# ---- only what prepare wrote is ever deleted ---------------------------------------------------------

def test_a_file_put_into_the_dataset_during_a_prepare_is_kept_aside(tmp_path):
    photos = make_image_folder(tmp_path / "photos")
    out = tmp_path / "out"
    prepare(photos, out, PrepareOptions(size="8"), workers=1)

    def user_saves_a_file(done, total):
        if done == 2:
            (out / "val" / "draft.txt").write_text("written meanwhile")

    result = prepare(photos, out, IMAGES, workers=1, progress=user_saves_a_file)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("out.kept-")]
    assert len(kept) == 1 and tree(kept[0]) == {"val/draft.txt": hashlib.sha256(b"written meanwhile").hexdigest()}
    assert any("val/draft.txt appeared in" in w and str(kept[0]) in w for w in result.warnings)
    assert verify(out) == [] and set(tree(out)) == set(result.manifest[WRITTEN])


def test_a_dataset_of_an_older_trainwise_without_a_written_list_is_replaced_cleanly(good_text, tmp_path):
    from trainwise.data.shards import read_manifest, write_manifest

    manifest = read_manifest(good_text)
    manifest.pop(WRITTEN)
    write_manifest(good_text, manifest)  # as trainwise wrote it before `written`: shards, side files, tokenizer/
    result = prepare_corpus(corpus(tmp_path / "other", word="river"), good_text, PrepareOptions(train_tokenizer=300))
    assert result.manifest["tokenizer"]["kind"] == "bpe" and verify(good_text) == []
    assert set(tree(good_text)) == set(result.manifest[WRITTEN])
    nothing_beside(good_text)


def test_the_current_directory_is_never_replaced(good_text, tmp_path, monkeypatch):
    before = tree(good_text)
    monkeypatch.chdir(good_text / "train")
    with pytest.raises(DataError, match="holds the current directory"):
        prepare_corpus(corpus(tmp_path / "other", word="river"), good_text)
    assert tree(good_text) == before


def test_what_an_older_trainwise_left_of_an_interrupted_prepare_is_named_not_deleted(tmp_path):
    old = tmp_path / "old"
    (old / "tokenizer").mkdir(parents=True)
    (old / "tokenizer" / "trainwise_tokenizer.json").write_text("{}")
    (old / PROGRESS).write_text('{"fingerprint": "f", "options": {}}\n')  # the journal lived inside --to then
    before = tree(old)
    with pytest.raises(DataError, match=r"older trainwise left of an interrupted prepare.*delete the folder yourself"):
        prepare_corpus(corpus(tmp_path / "c"), old)
    assert tree(old) == before
