"""`trainwise explain` as a user runs it: a log file or standard input in, the diagnosis out; an empty or
binary log is refused with one line and exit code 2."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, invoke

CORPUS = Path(__file__).resolve().parents[1] / "diagnose" / "corpus"
JSON_KEYS = {"category", "title", "cause", "fixes", "evidence"}


def corpus_log(category: str, name: str) -> str:
    return (CORPUS / category / f"{name}.txt").read_text(encoding="utf-8").partition("\n")[2]


def feed_stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def _refused_in_one_line(result, phrase):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and phrase in result.stderr, result.stderr


def test_json_is_one_line_with_the_exact_keys(capsys, tmp_path):
    log = tmp_path / "run.log"
    log.write_text(corpus_log("shm_too_small", "mmsegmentation-1356"), encoding="utf-8")
    result = invoke(capsys, "explain", str(log), "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1
    data = json.loads(result.stdout)
    assert set(data) == JSON_KEYS and data["category"] == "shm_too_small"
    assert data["fixes"] and all(isinstance(fix, str) for fix in data["fixes"])
    assert data["evidence"][0] == {"line": 1, "text": "ERROR: Unexpected bus error encountered in worker. This "
                                   "might be caused by insufficient shared memory (shm)."}


def test_stdin_dash_and_no_argument_read_standard_input(capsys, monkeypatch):
    log = corpus_log("nccl_timeout", "basicsr-737").encode()
    feed_stdin(monkeypatch, log)
    dash = invoke(capsys, "explain", "-", "--json")
    feed_stdin(monkeypatch, log)
    bare = invoke(capsys, "explain", "--json")
    assert dash.returncode == bare.returncode == 0, (dash.stderr, bare.stderr)
    assert json.loads(dash.stdout) == json.loads(bare.stdout)
    assert json.loads(dash.stdout)["category"] == "nccl_timeout"


def test_human_output_names_the_cause_numbers_the_fixes_and_quotes_the_lines(capsys, tmp_path):
    log = tmp_path / "run.log"
    log.write_text(corpus_log("device_side_assert", "person-reid-372"), encoding="utf-8")
    result = invoke(capsys, "explain", str(log))
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())   # undo the terminal's wrapping
    assert out.startswith("device_side_assert Label or index out of range")
    assert "fixes: 1. Print the range" in out and " 2. " in out and " 3. " in out
    assert "line 4: /pytorch/aten/src/THCUNN/ClassNLLCriterion.cu:108" in out
    assert "[0,0,0]" in out   # log text is printed as text, not read as Rich markup


def test_unrecognised_text_says_so(capsys, tmp_path):
    log = tmp_path / "run.log"
    log.write_text("Traceback (most recent call last):\nValueError: something only this program raises\n")
    data = json.loads(invoke(capsys, "explain", str(log), "--json").stdout)
    assert data["category"] == "unknown"
    assert data["evidence"] == [{"line": 2, "text": "ValueError: something only this program raises"}]


def test_empty_blank_and_binary_logs_are_refused(capsys, tmp_path, monkeypatch):
    empty, blank, binary = tmp_path / "empty.log", tmp_path / "blank.log", tmp_path / "model.pt"
    empty.write_bytes(b"")
    blank.write_text("\n \n\t\n")
    binary.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    _refused_in_one_line(invoke(capsys, "explain", str(empty)), "is empty")
    _refused_in_one_line(invoke(capsys, "explain", str(blank), "--json"), "is empty")
    _refused_in_one_line(invoke(capsys, "explain", str(binary)), "not a text log")
    feed_stdin(monkeypatch, b"")
    _refused_in_one_line(invoke(capsys, "explain", "-"), "standard input is empty")
    _refused_in_one_line(invoke(capsys, "explain", str(tmp_path / "missing.log")), "no such file")
    _refused_in_one_line(invoke(capsys, "explain", str(tmp_path)), "is a directory")


@pytest.mark.slow
def test_a_log_piped_into_the_installed_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "trainwise", "explain", "-", "--json"], env=env,
                          input=corpus_log("cuda_oom", "pytorch-16417").encode(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["category"] == "cuda_oom"
