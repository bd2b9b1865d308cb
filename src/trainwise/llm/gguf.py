"""A GGUF file (llama.cpp's single-file model, often 4-bit) as a Hugging Face model directory.

`model_directory(spec)` is the one conversion point: a path ending in `.gguf` is dequantised once through
transformers' GGUF loader (it needs the `gguf` package) into a cached directory — config.json, model.safetensors,
tokenizer files with the chat template — and that directory is returned; anything else is returned as the path it
names. Everything downstream (training, plans, tokenizer checks, export) keeps working with directories.

The cache lives under $TRAINWISE_CACHE/gguf (default ~/.cache/trainwise/gguf), one directory per file keyed on its
name, size and modification time: editing or replacing the file converts it again; deleting the cache is safe.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from trainwise.errors import ConfigError
from trainwise.llm.optional import require

SUFFIX = ".gguf"
CACHE_ENV = "TRAINWISE_CACHE"
DONE_MARKER = ".converted"  # written last: a directory without it is an interrupted conversion


def is_gguf(spec: "str | Path | None") -> bool:
    return spec is not None and str(spec).lower().endswith(SUFFIX)


def cache_root() -> Path:
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "trainwise") / "gguf"


def model_directory(spec: "str | Path") -> Path:
    """The Hugging Face model directory `spec` names: itself, or a GGUF file's converted copy in the cache."""
    path = Path(spec).expanduser()
    if not is_gguf(spec):
        return path
    if not path.is_file():
        raise ConfigError(f"{spec}: no such GGUF file. Give the path of a .gguf model file or a Hugging Face model "
                          "directory (config.json + *.safetensors).")
    target = cache_root() / _cache_key(path)
    if not (target / DONE_MARKER).is_file():
        _convert(path, target)
    return target


def _cache_key(path: Path) -> str:
    stat = path.stat()
    identity = f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return f"{path.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


def _convert(path: Path, target: Path) -> None:
    """Dequantise `path` into `target`, atomically: a temporary directory renamed into place when complete."""
    require("gguf", f"reading the GGUF file {path.name}")
    transformers = require("transformers", f"reading the GGUF file {path.name}")
    print(f"Converting {path} (GGUF) to a Hugging Face model directory in {target} — once; later runs reuse it.",
          file=sys.stderr, flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    transformers.utils.logging.disable_progress_bar()  # one line says what happens; no per-tensor bars
    try:
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
        except (OSError, ValueError, KeyError, RuntimeError) as error:
            raise ConfigError(f"{path}: transformers {transformers.__version__} cannot read this GGUF file "
                              f"({type(error).__name__}: {str(error)[:200]}). Its architecture or quantisation may "
                              "not be supported; give a Hugging Face model directory instead.") from None
        # The weights are dequantised now: save them as plain tensors, not as a "gguf-quantised" model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(scratch))
        tokenizer.save_pretrained(str(scratch))
        (scratch / DONE_MARKER).write_text(f"{path}\n")
        if target.exists() and not (target / DONE_MARKER).is_file():  # an interrupted conversion left it
            shutil.rmtree(target)
        try:
            os.replace(scratch, target)
        except OSError:
            if not (target / DONE_MARKER).is_file():  # not another process's finished copy: a real failure
                raise
    finally:
        transformers.utils.logging.enable_progress_bar()
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"Converted {path.name}: {target}", file=sys.stderr, flush=True)
