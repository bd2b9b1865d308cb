"""A catalogue of public causal-LM architectures shipped with trainwise (`catalogue.json`), so a plan needs no
download: `llama-3.1-8b`, `qwen2.5-7b`, `gpt2`, ... Each entry is a config.json-shaped dict (with `model_type`),
the Hugging Face repository it was published in, and the parameter count a model built from it has.

Pure data: no transformers import here (`hf.resolve_config` turns an entry into a transformers config).
"""
from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from trainwise.errors import ConfigError


@dataclass(frozen=True)
class CatalogueModel:
    name: str
    source: str           # the Hugging Face repository whose config.json this is
    parameters: int       # parameters of a model built from `config` (tied weights once)
    config: dict          # config.json fields, `model_type` included (a fresh copy per lookup)


@lru_cache(maxsize=1)
def _document() -> dict:
    return json.loads(resources.files("trainwise.llm").joinpath("catalogue.json").read_text(encoding="utf-8"))


def names() -> list[str]:
    """The catalogue's model names (aliases not included), in catalogue order."""
    return list(_document()["models"])


def canonical_name(name: str) -> str | None:
    """The catalogue name `name` refers to (case-insensitive, aliases and `_`/`-` resolved), or None."""
    key = name.strip().lower().replace("_", "-")
    key = key.split("/")[-1]  # "meta-llama/Llama-3.1-8B" -> "llama-3.1-8b"
    doc = _document()
    if key in doc["models"]:
        return key
    return doc["aliases"].get(key)


def lookup(name: str) -> CatalogueModel:
    """The catalogue entry `name`; a ConfigError listing close names (or all of them) when there is none."""
    found = canonical_name(name)
    if found is None:
        close = difflib.get_close_matches(name.lower(), names(), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(names())}"
        raise ConfigError(f"{name!r} is not a model in trainwise's catalogue ({hint}). Give a catalogue name, "
                          f"a config.json path, or a local Hugging Face model directory.")
    entry = _document()["models"][found]
    return CatalogueModel(found, entry["source"], int(entry["parameters"]), copy.deepcopy(entry["config"]))
