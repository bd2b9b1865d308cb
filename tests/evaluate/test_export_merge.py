"""Exact merges: the adapter folded into its base in fp32, saved in the base's dtype unless asked otherwise.
The merged model's logits equal the adapter model's (≤1e-4 relative on an fp32 base, within bf16 rounding on a
bf16 base), and an fp32 base never comes out bf16 unasked."""
from __future__ import annotations

import pytest
import torch

from trainwise.errors import ConfigError
from trainwise.evaluate.export import merged_model

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def adapted(dtype: torch.dtype):
    """A tiny random Llama with LoRA adapters whose B is non-zero (a trained adapter), the base in `dtype`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base = transformers.LlamaForCausalLM(config).to(dtype)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    return model.eval()


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))


def test_an_fp32_base_merges_exactly_and_stays_fp32():
    model = adapted(torch.float32)
    expected = logits(model, IDS)
    merged, note = merged_model(model)
    assert all(p.dtype == torch.float32 for p in merged.parameters())
    assert note == "merged in fp32, saved in fp32 (the base model's dtype)"
    got = logits(merged, IDS)
    assert float((got - expected).abs().max() / expected.abs().max()) <= 1e-4


def test_a_bf16_base_merges_in_fp32_within_bf16_rounding():
    model = adapted(torch.bfloat16)
    exact = logits(adapted(torch.bfloat16).float(), IDS)  # the adapter model computed without rounding
    merged, note = merged_model(model)
    assert all(p.dtype == torch.bfloat16 for p in merged.parameters())
    assert note.startswith("merged in fp32, saved in bf16")
    error = float((logits(merged, IDS) - exact).abs().max() / exact.abs().max())
    in_base, _ = merged_model(adapted(torch.bfloat16), merge_in="base")
    in_base_error = float((logits(in_base, IDS) - exact).abs().max() / exact.abs().max())
    assert error <= 2 ** -6 and error <= in_base_error  # bf16 keeps 8 bits; fp32 merging adds no error of its own


def test_dtype_is_saved_as_asked_and_bad_choices_are_named():
    merged, note = merged_model(adapted(torch.bfloat16), dtype="fp32")
    assert all(p.dtype == torch.float32 for p in merged.parameters()) and "as asked" in note
    with pytest.raises(ConfigError, match="--dtype fp8"):
        merged_model(adapted(torch.float32), dtype="fp8")
    with pytest.raises(ConfigError, match="--merge-in"):
        merged_model(adapted(torch.float32), merge_in="fp64")
