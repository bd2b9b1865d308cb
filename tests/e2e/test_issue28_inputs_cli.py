"""Issue 28, as a careless user meets it at the terminal: prepare on real tables and photos, explain on a pipe,
eval after checkpoints/ was removed, report on a damaged config.yaml. Every bad input is exit 2 and a message,
never a traceback; what is read anyway is said."""
from __future__ import annotations

import json
import os
import shutil
import struct
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

from tests.conftest import invoke


def _refused(result, *phrases):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    text = " ".join(result.stderr.split())
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} not in:\n{result.stderr}"


@pytest.mark.parametrize("content, phrases", [
    (b"caf\xe9,label\n1,0\n2,1\n", ["is not UTF-8 (line 1: byte 0xe9)", "Re-save it as UTF-8", "--encoding latin-1"]),
    (b"a,label\ncaf\xe9,0\n2,1\n", ["is not UTF-8 (line 2: byte 0xe9)", "--encoding latin-1"]),
    (b"a,a,label\n1,2,0\n3,4,1\n", ["names a column twice: 'a' (columns 1, 2)"]),
    (b"a,label\n1,0\n2,inf\n3,1\n", ["label column 'label' holds a value that is not a finite number (row 2: inf"]),
    (b"label\n0\n1\n0\n1\n", ["no feature columns: the table has only the label column 'label'"]),
    (b"a,label\n1,yes\n2,yes\n3,yes\n", ["holds one class ('yes') in all 3 rows"]),
], ids=["latin1-header", "latin1-values", "duplicate-column", "inf-label", "only-label", "one-class"])
def test_former_tracebacks_and_silent_tables_exit_2_with_a_message(tmp_path, capsys, content, phrases):
    (tmp_path / "t.csv").write_bytes(content)
    _refused(invoke(capsys, "prepare", str(tmp_path / "t.csv"), "--to", str(tmp_path / "out")), *phrases)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_prepare_says_how_it_read_the_table_and_what_it_chose(tmp_path, capsys, wide_terminal):
    lines = [f"{i}\t{i % 7 if i % 3 else 'unknown'}\t{'inf' if i == 4 else i * 0.5}\t{i % 2}" for i in range(60)]
    (tmp_path / "t.csv").write_text("a\tb\tc\tlabel\n" + "\n".join(lines) + "\n")
    result = invoke(capsys, "prepare", str(tmp_path / "t.csv"), "--to", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "t.csv: read as tab-separated" in out
    assert "task: classification, 2 classes" in out and "--task regression" in out
    assert "column 'b': 40 of 60 values are numbers" in out and "--numeric b" in out
    assert "column 'c': 1 cell is infinite or too large for float32 (row 5: inf)" in out
    chosen = invoke(capsys, "prepare", str(tmp_path / "t.csv"), "--to", str(tmp_path / "out2"), "--numeric", "b")
    assert chosen.returncode == 0 and "20 text cells read as missing (--numeric)" in " ".join(chosen.stdout.split())


def huge_png(path, width: int, height: int):
    """A PNG whose header says width x height, with one pixel of data: Pillow judges its size on opening."""
    Image.new("L", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    path.write_bytes(bytes(data))
    return path


def test_a_photo_over_the_pixel_limit_is_skipped_with_the_reason_and_the_override(tmp_path, capsys, wide_terminal):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(tmp_path / "photos" / name / f"{i}.png")
    huge_png(tmp_path / "photos" / "cat" / "huge.png", 10_000, 10_000)  # 100 megapixels
    result = invoke(capsys, "prepare", str(tmp_path / "photos"), "--to", str(tmp_path / "out"), "--size", "8",
                    "--workers", "1")
    out = " ".join(result.stdout.split())
    assert result.returncode == 0, result.stderr
    assert "skipped 1" in out and "cat/huge.png (DecompressionBombWarning: Image size (100000000 pixels) exceeds" in out
    assert "If they are genuine large photos, raise it: --max-image-pixels 101000000" in out
    lifted = invoke(capsys, "prepare", str(tmp_path / "photos"), "--to", str(tmp_path / "out2"), "--size", "8",
                    "--workers", "1", "--max-image-pixels", "101000000")
    skipped = json.loads((tmp_path / "out2" / "manifest.json").read_text())["skipped"]["files"]
    # past the limit, Pillow reads it: this one's data is cut short, a different reason
    assert lifted.returncode == 0 and "DecompressionBomb" not in skipped[0]["reason"]
    small = invoke(capsys, "prepare", str(tmp_path / "photos"), "--to", str(tmp_path / "out3"), "--size", "8",
                   "--workers", "1", "--max-image-pixels", "300")  # 20 x 20 = 400 pixels: over it, every one
    assert small.returncode == 0 and "skipped 17" in small.stdout


def test_explain_reads_a_pipe_and_refuses_a_device_with_a_way_out(tmp_path, capsys):
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    log = "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    writer = threading.Thread(target=lambda: fifo.write_text(log), daemon=True)
    writer.start()
    result = invoke(capsys, "explain", str(fifo), "--json")
    writer.join(timeout=10)
    if writer.is_alive():  # explain never opened the pipe: open it here so the writer is released
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["category"] == "cuda_oom"
    _refused(invoke(capsys, "explain", "/dev/null"), "/dev/null is not a regular file or a pipe", "explain - <")
    _refused(invoke(capsys, "explain", str(tmp_path / "missing.log")), "missing.log: no such file")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from typer.testing import CliRunner

    from trainwise.cli import app

    out = tmp_path_factory.mktemp("issue28") / "run"
    done = CliRunner().invoke(app, ["train", "breast-cancer", "train.max_steps=6", "schedule.warmup_steps=0",
                                    "eval.every_steps=3", "telemetry.enabled=false", "--out", str(out)])
    assert done.exit_code == 0, done.output
    return out


def test_eval_after_checkpoints_were_removed_names_the_weights_it_used_and_why(trained, tmp_path, capsys,
                                                                                wide_terminal):
    run = shutil.copytree(trained, tmp_path / "run")
    shutil.rmtree(run / "checkpoints")
    result = invoke(capsys, "eval", str(run), "--json")
    assert result.returncode == 0, result.stderr
    evaluation = json.loads(result.stdout)
    assert evaluation["checkpoint"] == "final" and evaluation["requested_checkpoint"] == "best"
    note = next(w["message"] for w in evaluation["warnings"] if w["kind"] == "checkpoint_fallback")
    assert "the summary records one at step 6" in note and "the folder was removed or emptied" in note
    assert "no validation" not in note and "evaluating the final weights model.safetensors (step 6)" in note
    table = invoke(capsys, "eval", str(run))
    assert "test split, final weights (step 6)" in table.stdout


def test_report_on_a_config_with_a_nul_byte_warns_and_escapes_it(trained, tmp_path, capsys):
    run = shutil.copytree(trained, tmp_path / "run")
    (run / "config.yaml").write_bytes(b"seed: 0\nmodel: {name: mlp\x00\x1b[31m\n  bad: [\n")
    result = invoke(capsys, "report", str(run), show_warnings=True)
    assert result.returncode == 0, result.stderr
    assert "config.yaml is not a config trainwise can read" in " ".join(result.stderr.split())
    html = (run / "report.html").read_bytes()
    assert b"\x00" not in html and b"\x1b" not in html
    assert b"name: mlp\\x00\\x1b[31m" in html and b"is not a config trainwise can read" in html


@pytest.mark.slow
def test_a_two_row_table_warns_of_its_empty_splits_and_eval_offers_the_split_there_is(tmp_path, capsys,
                                                                                     wide_terminal):
    (tmp_path / "t.csv").write_text("x,label\n1,0\n2,1\n")
    prepared = invoke(capsys, "prepare", str(tmp_path / "t.csv"), "--to", str(tmp_path / "data"))
    out = " ".join(prepared.stdout.split())
    assert prepared.returncode == 0 and "warning: the validation split is empty: 0.1 of 2 samples" in out
    assert "warning: the test split is empty" in out and "train cannot pick a best checkpoint" in out
    trained = invoke(capsys, "train", "table", f"data.path={tmp_path / 'data'}", "train.max_steps=2",
                     "train.batch_size=1", "schedule.warmup_steps=0", "telemetry.enabled=false",
                     "--out", str(tmp_path / "run"))
    assert trained.returncode == 0, trained.stderr
    _refused(invoke(capsys, "eval", str(tmp_path / "run")), "has no test split",
             "held out none of a small table", "evaluate another: --split train.")
