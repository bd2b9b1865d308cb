"""Hugging Face causal LMs: resolve what the user named to a config, build the model, load local weights.

    config = resolve_config("llama-3.1-8b")          # catalogue name | config.json path | model directory
    model = build_model(config, device="meta", dtype=torch.bfloat16)   # no memory on meta: for plans
    model = load_pretrained("/models/my-llama", dtype=torch.bfloat16)  # local weights, never the network

transformers is imported inside the functions (optional extra); torch is imported lazily too, so the plan
command's help does not pay for it.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from trainwise.errors import ConfigError
from trainwise.llm import catalogue
from trainwise.llm.gguf import model_directory
from trainwise.llm.optional import require

if TYPE_CHECKING:
    import torch
    from torch import nn

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}
# The attention implementations trainwise builds with, best first; the first the family supports is taken.
# Packed rows reach every one as position ids restarting at each document, from which transformers builds the
# family's own mask (or, for FlashAttention, the documents' boundaries): no hand-made mask, so sliding windows,
# soft-capping and GQA's shared K/V stay as the family defines them.
# - CUDA: FlashAttention-3/2's variable-length kernel where installed (packed rows flattened, no mask at all),
#   else FlexAttention (block masks: blocks outside a document are skipped), else PyTorch's SDPA.
# - CPU and the planner's meta device: SDPA (traces on fake tensors); families with no SDPA path (Gemma-2's
#   logit soft-capping) take "eager", whose score matrices the plan then counts, as training would hold them.
CPU_ATTENTION = ("sdpa", "eager")
CUDA_ATTENTION = ("flash_attention_3", "flash_attention_2", "flex_attention", "sdpa", "eager")


def attention_choices(device_type: str, wanted: str = "auto") -> tuple[str, ...]:
    """The attention implementations to try on `device_type`, best first, those not installed left out;
    only `wanted` when one is named (model.attention; a run records its choice there)."""
    if wanted != "auto":
        return (wanted,)
    if device_type != "cuda":
        return CPU_ATTENTION
    from transformers.utils import import_utils

    installed = {"flash_attention_3": getattr(import_utils, "is_flash_attn_3_available", lambda: False)(),
                 "flash_attention_2": import_utils.is_flash_attn_2_available()}
    return tuple(name for name in CUDA_ATTENTION if installed.get(name, True))


def attention_of(model: "nn.Module") -> str | None:
    """The attention implementation a Hugging Face model runs (None for other models)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def torch_dtype(name: "str | torch.dtype") -> "torch.dtype":
    """`"bf16"` / `"bfloat16"` / a torch.dtype -> torch.dtype."""
    import torch
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}: use one of fp32, bf16, fp16")
    return getattr(torch, DTYPES[name])


def looks_like_config_spec(spec: str) -> bool:
    """Whether `spec` names an LM config: a catalogue name, a config.json file, or a directory holding one."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return (path / "config.json").is_file()
    if path.is_file():
        return path.suffix == ".json"
    return catalogue.canonical_name(spec) is not None


def config_dict(spec: str) -> dict[str, Any]:
    """The config.json fields `spec` names (catalogue name, config.json path, model directory or GGUF file)."""
    path = model_directory(spec)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{spec} is a directory without a config.json: give a Hugging Face model directory, "
                              f"a config.json path, or a catalogue name such as llama-3.1-8b")
    if path.is_file():
        try:
            fields = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read the model config {path}: {exc}") from None
        if not isinstance(fields, dict) or "model_type" not in fields:
            raise ConfigError(f"{path} is not a Hugging Face model config: it has no 'model_type' field")
        return fields
    if "/" in spec or spec.endswith(".json"):
        found = catalogue.canonical_name(spec)
        if found is None:
            raise ConfigError(f"{spec} does not exist (no such file or directory, and not a catalogue name). "
                              f"trainwise never downloads: give a local path or a catalogue name.")
    return catalogue.lookup(spec).config


def resolve_config(spec: "str | dict[str, Any]", **overrides: Any):
    """A transformers config from a catalogue name, config.json path, model directory, or config dict.

    `overrides` replace config fields (e.g. `num_hidden_layers=2` for a small test model)."""
    transformers = require("transformers", "building a Hugging Face model")
    fields = dict(config_dict(spec) if isinstance(spec, str) else spec)
    fields.update(overrides)
    if {"num_hidden_layers", "n_layer"} & set(overrides):  # a per-layer list of the old depth would not fit
        fields.pop("layer_types", None)
    if "vocab_size" in overrides:  # a shrunk test vocabulary: special ids beyond it would only warn
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if isinstance(fields.get(key), int) and fields[key] >= overrides["vocab_size"]:
                fields[key] = None
    model_type = fields.pop("model_type", None)
    for unused in ("architectures", "transformers_version", "_name_or_path", "auto_map"):
        fields.pop(unused, None)
    if "torch_dtype" in fields:  # transformers 5 calls it `dtype`; it is the published weights' dtype only
        fields.setdefault("dtype", fields.pop("torch_dtype"))
    try:
        return transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"transformers {transformers.__version__} cannot build a config of model_type "
                          f"{model_type!r}: {exc}. Upgrading transformers may add it.") from None


def build_model(config, device: "str | torch.device | None" = "meta", dtype: "str | torch.dtype" = "float32",
                attention: tuple[str, ...] = CPU_ATTENTION) -> "nn.Module":
    """A randomly initialised causal LM from `config`, its parameters in `dtype` on `device` (None: torch's
    current default device).

    On `meta` nothing is allocated (shapes only): the planner builds there, then traces on fake tensors.
    `attention`: the implementations to try, best first (attention_choices)."""
    import contextlib

    import torch
    transformers = require("transformers", "building a Hugging Face model")
    for implementation in attention:
        try:
            with torch.device(device) if device is not None else contextlib.nullcontext():
                return transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype),
                                                                     attn_implementation=implementation)
        except (ValueError, ImportError) as exc:
            if implementation == attention[-1] or "attention" not in str(exc).lower():
                raise ConfigError(f"transformers cannot build {type(config).__name__}: {exc}") from None
    raise AssertionError("unreachable")


@contextmanager
def traceable_experts() -> Iterator[None]:
    """Mixture-of-experts models on fake tensors: transformers runs the experts' matmuls through torch's grouped
    matmul, whose shape check (a CUDA kernel's) refuses fp32 weights, or through its own fallback op, whose fake
    implementation gives the same output shapes for any dtype. The plan models the fused kernel either way (one
    output per routed token, no workspace), so while it traces, transformers is told to take the fallback.
    Models without experts never reach this switch; a transformers without it is left as it is."""
    try:
        from transformers.integrations import moe
    except ImportError:
        yield
        return
    original = getattr(moe, "_can_use_grouped_mm", None)
    if original is None:
        yield
        return
    moe._can_use_grouped_mm = lambda *args, **kwargs: False
    try:
        yield
    finally:
        moe._can_use_grouped_mm = original


def load_pretrained(directory: "str | Path", device: "str | torch.device" = "cpu",
                    dtype: "str | torch.dtype" = "float32", attention: tuple[str, ...] = CPU_ATTENTION,
                    **kwargs: Any) -> "nn.Module":
    """The causal LM saved in the local directory (config.json + *.safetensors), or a GGUF file's dequantised copy;
    never touches the network.

    `kwargs` go to `from_pretrained` (e.g. `quantization_config` for QLoRA)."""
    transformers = require("transformers", "loading a Hugging Face model")
    path = model_directory(directory)
    if not (path / "config.json").is_file():
        named = None if path.exists() else catalogue.canonical_name(str(directory))
        advice = (f" {directory!r} names an architecture in trainwise's catalogue: model.hf_config={directory} "
                  f"builds a randomly initialised {named} (no pretrained weights). For the pretrained model, "
                  "download it once into a directory and give model.hf=DIR; trainwise never downloads."
                  if named else " Give the directory that holds the model's config.json and *.safetensors.")
        raise ConfigError(f"model.hf={directory}: not a Hugging Face model directory (no config.json there)."
                          + advice)
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ConfigError(f"model.hf={directory} has a config.json but no weights (*.safetensors). To train from "
                          f"random initialisation use model.hf_config={directory} instead.")
    for implementation in attention:
        try:
            return transformers.AutoModelForCausalLM.from_pretrained(
                str(path), dtype=torch_dtype(dtype), device_map=None if str(device) == "cpu" else {"": str(device)},
                local_files_only=True, attn_implementation=implementation, **kwargs)
        except (OSError, ValueError, ImportError) as exc:
            if implementation == attention[-1] or "attention" not in str(exc).lower():
                raise ConfigError(f"cannot load the model in {directory}: {exc}") from None
    raise AssertionError("unreachable")
