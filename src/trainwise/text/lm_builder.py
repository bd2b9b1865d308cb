"""The language model a run trains: the built-in `gpt`, or a Hugging Face causal LM (`model.hf`: a local
model directory with weights; `model.hf_config`: random init from a catalogue name or config.json), with
`model.method` (full / freeze / LoRA / QLoRA), `model.dtype` and gradient checkpointing applied.

Packed rows reach a Hugging Face model as position ids restarting at each document and nothing else: transformers
derives the family's own mask from them (causal, sliding window, eager's additive mask; GQA kept), or FlashAttention
the documents' boundaries, so a packed row computes each document exactly as if alone, as the built-in gpt does.
The attention implementation is the best this machine runs (llm/hf.py attention_choices); no KV cache is built
while training (`use_cache` off; generation asks for its cache itself).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from trainwise.data.bundle import DataSpec
from trainwise.errors import ConfigError


def is_language_model_config(model_config: Any) -> bool:
    return bool(model_config.hf or model_config.hf_config)


def build_language_model(model_config: Any, spec: DataSpec, seed: int = 0) -> nn.Module:
    """A Hugging Face causal LM for this data: model.hf loaded, or model.hf_config initialised at random
    with the data's vocabulary and context; then model.method, dtype and checkpointing.

    The random base is drawn from `seed` apart from the global RNG: every rebuild (resume, evaluation,
    export, generation) gets the same base, which LoRA and freeze runs need, since their checkpoints keep only
    what trains (runtime/model_state.py)."""
    import torch

    from trainwise.llm.hf import attention_choices, build_model, load_pretrained, resolve_config
    from trainwise.llm.methods import apply_model_config

    if spec.num_classes is None or spec.task != "causal_lm":
        raise ConfigError("model.hf / model.hf_config train on text: prepare it with `trainwise prepare CORPUS "
                          "--to DIR` (with --tokenizer MODEL_DIR for model.hf) and set data.path=DIR.")
    attention = attention_choices("cuda" if torch.cuda.is_available() else "cpu",
                                  getattr(model_config, "attention", "auto"))
    if model_config.hf:
        check_tokenizer(model_config.hf, spec)
        model = load_pretrained(model_config.hf, dtype=_dtype(model_config), attention=attention)
        vocab = model.get_input_embeddings().num_embeddings
        if spec.num_classes > vocab:
            raise ConfigError(f"the data has ids up to {spec.num_classes - 1} but model.hf={model_config.hf} embeds "
                              f"{vocab}; prepare the data with the model's tokenizer (--tokenizer {model_config.hf}).")
    else:
        overrides: dict[str, Any] = {"vocab_size": spec.num_classes}
        fields = _config_fields(model_config.hf_config)
        for key in ("n_positions", "max_position_embeddings"):
            if key in fields and spec.input_shape and fields[key] < spec.input_shape[0]:
                overrides[key] = spec.input_shape[0]
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            model = build_model(resolve_config(model_config.hf_config, **overrides), device="cpu",
                                dtype=_dtype(model_config), attention=attention)
    model.config.use_cache = False  # training builds no KV cache
    return apply_model_config(model, model_config)


def apply_language_model_settings(model: nn.Module, model_config: Any) -> nn.Module:
    """The built-in gpt under model.method, model.dtype and checkpointing (as a Hugging Face model gets)."""
    from trainwise.llm.methods import apply_model_config

    if _dtype(model_config) == "bfloat16":
        import torch

        model = model.to(torch.bfloat16)
    return apply_model_config(model, model_config)


def _dtype(model_config: Any) -> str:
    """The weights' torch dtype name; `auto` (decided and recorded by a run's resolve step, open here for
    lr-find and check) by the same rule, for the device this process would train on."""
    import torch

    from trainwise.runtime.precision import resolve_weight_dtype

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return "bfloat16" if resolve_weight_dtype(model_config.dtype, device) == "bf16" else "float32"


def _config_fields(spec: str) -> dict[str, Any]:
    from trainwise.llm.hf import config_dict

    return config_dict(spec)


def check_tokenizer(model_dir: str, spec: DataSpec) -> None:
    """The prepared tokens must come from the model's own tokenizer: the same fingerprint."""
    if spec.tokenizer_fingerprint is None:
        return
    from trainwise.llm.gguf import model_directory
    from trainwise.data.text.tokenizer import ModelTokenizer

    path = model_directory(model_dir)
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return  # a weights-only directory: the vocabulary size check below the load still applies
    fingerprint = ModelTokenizer.from_directory(path).fingerprint
    if fingerprint != spec.tokenizer_fingerprint:
        raise ConfigError(f"the data was tokenized with another tokenizer than model.hf={model_dir}'s (fingerprint "
                          f"{spec.tokenizer_fingerprint[:12]}, the model's {fingerprint[:12]}); its ids would mean "
                          f"other words. Prepare it again with `trainwise prepare CORPUS --to DIR --tokenizer "
                          f"{model_dir}`.")

