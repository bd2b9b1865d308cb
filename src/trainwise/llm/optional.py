"""The optional language-model world: transformers, peft, tokenizers, bitsandbytes, imported only when used.

`require("transformers")` returns the module or raises a TrainwiseError that says what to install, never an
ImportError traceback. `available(name)` answers without raising (for "is QLoRA possible here?").
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from trainwise.errors import TrainwiseError

INSTALL_HINT = "pip install 'trainwise[llm]'"

# What each optional package is for, and how to get it (bitsandbytes is not in the extra: it needs CUDA).
_PACKAGES = {
    "transformers": ("Hugging Face models and configs", INSTALL_HINT),
    "peft": ("LoRA / QLoRA adapters", INSTALL_HINT),
    "tokenizers": ("tokenizer training", INSTALL_HINT),
    "gguf": ("reading GGUF model files", INSTALL_HINT),
    "bitsandbytes": ("4-bit QLoRA weights and 8-bit AdamW", "pip install bitsandbytes (needs a CUDA GPU)"),
}


class MissingExtraError(TrainwiseError):
    """An optional package of the language-model extra is not installed."""


def require(name: str, why: str | None = None) -> ModuleType:
    """Import the optional package `name`, or raise MissingExtraError naming the install command."""
    if name not in _PACKAGES:
        raise ValueError(f"unknown optional package {name!r}")  # a bug in trainwise, not a user error
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        purpose, hint = _PACKAGES[name]
        need = why or purpose
        raise MissingExtraError(
            f"{need} needs the Python package '{name}', which is not installed ({exc}). "
            f"Install it with: {hint}") from None


def available(name: str) -> bool:
    """Whether the optional package `name` can be imported here (without importing it)."""
    if name in sys.modules:  # imported already (or blocked: sys.modules[name] = None)
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
