"""Tiny language-model configs (each well under 2M parameters) for the llm tests."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

TINY = {  # catalogue families, shrunk: same model_type and structure (GQA, tying, biases)
    "llama": ("llama-3.2-1b", dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=512)),
    "qwen": ("qwen2.5-0.5b", dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=512)),
    "gpt2": ("gpt2", dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=128)),
    "llama-untied": ("llama-3.1-8b", dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512)),
}


def tiny_config(family: str = "llama", **more):
    from trainwise.llm import hf
    name, overrides = TINY[family]
    return hf.resolve_config(name, **{**overrides, **more})


def tiny_model(family: str = "llama", device: str = "cpu", dtype: str = "fp32", **more):
    import torch
    from trainwise.llm import hf
    torch.manual_seed(0)
    return hf.build_model(tiny_config(family, **more), device=device, dtype=dtype)


@pytest.fixture
def make_tiny():
    return tiny_model
