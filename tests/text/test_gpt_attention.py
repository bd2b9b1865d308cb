"""The built-in gpt's two ways of keeping packed documents apart agree: FlexAttention's document block mask (its
CUDA path, checked here forward-only on the CPU, where FlexAttention runs without a backward) and causal SDPA per
document (its CPU path)."""
from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import flex_attention

from trainwise.data.batch import document_lengths
from trainwise.text.gpt import document_block_mask, packed_attention


def test_the_flex_block_mask_equals_per_document_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 32, 8) for _ in range(3))
    positions = torch.stack([torch.cat([torch.arange(9), torch.arange(15), torch.arange(8)]), torch.arange(32)])
    with torch.no_grad():
        per_document = packed_attention(q, k, v, document_lengths(positions), dropout=0.0)
        flex = flex_attention(q, k, v, block_mask=document_block_mask(positions))
    torch.testing.assert_close(flex, per_document, rtol=1e-5, atol=1e-5)
    alone = torch.nn.functional.scaled_dot_product_attention(q[:1, :, 9:24], k[:1, :, 9:24], v[:1, :, 9:24],
                                                             is_causal=True)
    torch.testing.assert_close(per_document[:1, :, 9:24], alone)
