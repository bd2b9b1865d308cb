"""method=freeze counts its frozen blocks below the trainable ones at 2 FLOPs a weight and a token (forward only:
no gradient is carried through them), not 4; their attention at 4·H·Q·T, not 12. A trained input embedding (a
head tied to it) pulls the gradient to the bottom, so every frozen block then costs 4."""
from __future__ import annotations

from trainwise.llm.methods import apply_method
from trainwise.train.callbacks.token_rates import flops_per_token, lowest_trained_block

BLOCK = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64  # q, o; k, v (2 KV heads of 16); gate, up, down; norms
HEAD, NORM, T = 512 * 64, 64, 16
ATTENTION_LAYER = 4 * 16 * T  # heads x head dim x context, per FLOP factor


def test_freeze_counts_the_blocks_below_the_trainable_ones_forward_only(make_tiny):
    model = apply_method(make_tiny("llama-untied", num_hidden_layers=4), "freeze", trainable_blocks=1)
    assert lowest_trained_block(model) == 3
    expected = 6 * (BLOCK + HEAD) + 4 * NORM + 2 * 3 * BLOCK + (12 * 1 + 4 * 3) * ATTENTION_LAYER
    assert flops_per_token(model, T) == expected == 665_344  # counted at 4 a frozen weight: 911,872 (+37%)


def test_a_trained_tied_embedding_makes_every_frozen_block_carry_the_gradient(make_tiny):
    model = apply_method(make_tiny("llama", num_hidden_layers=4), "freeze", trainable_blocks=1)
    assert model.get_input_embeddings().weight.requires_grad  # tied to the head, which trains
    assert lowest_trained_block(model) == 0
    assert flops_per_token(model, T) == 6 * (BLOCK + HEAD) + 4 * (NORM + 3 * BLOCK) + 12 * 4 * ATTENTION_LAYER


def test_lora_adapters_in_the_first_block_leave_nothing_forward_only(make_tiny):
    model = apply_method(make_tiny("llama-untied", num_hidden_layers=2), "lora")
    assert lowest_trained_block(model) == 0
