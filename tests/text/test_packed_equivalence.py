"""Packing never lets one document attend to another: a packed batch gives each document the loss it has
alone, for the built-in gpt and for Hugging Face models (through the 4-D mask from position ids)."""
from __future__ import annotations

import json

import pytest
import torch

from tests.data.text.test_packing import write_text_dataset
from trainwise.config import ModelConfig
from trainwise.data.bundle import DataSpec
from trainwise.text.gpt import GPT, GPTConfig
from trainwise.data.text.packing import IGNORE_INDEX, PackedTextDataset

VOCAB = 60
DOCUMENTS = [[5, 9, 11, 3], [7, 7, 2], [1, 2, 3, 4, 5, 6], [8, 13]]  # each gets an end-of-text (59)


def per_document_losses(model, batch):
    """{first token id: summed loss} of each document in a batch of packs."""
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
    logits = getattr(logits, "logits", logits)
    token = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                              ignore_index=IGNORE_INDEX, reduction="none").view(batch["labels"].shape)
    losses = {}
    for row in range(len(batch["input_ids"])):
        starts = (batch["position_ids"][row] == 0).nonzero().flatten().tolist() + [batch["input_ids"].shape[1]]
        for start, end in zip(starts[:-1], starts[1:]):
            if (batch["labels"][row, start:end] != IGNORE_INDEX).any():
                losses[int(batch["input_ids"][row, start])] = token[row, start:end].sum()
    return losses


def check_packed_equals_alone(model, tmp_path):
    model.eval()
    packed = PackedTextDataset(write_text_dataset(tmp_path, DOCUMENTS, vocab_size=VOCAB, eos_id=VOCAB - 1), 10,
                               pad_id=0, split_documents=False)
    assert len(packed) < len(DOCUMENTS)  # some documents do share a row
    together = per_document_losses(model, packed.__getitems__(range(len(packed))))
    for document in DOCUMENTS:
        ids = torch.tensor([document + [VOCAB - 1]])
        labels = torch.cat([ids[:, 1:], torch.full((1, 1), IGNORE_INDEX)], dim=1)
        alone = per_document_losses(model, {"input_ids": ids, "labels": labels,
                                            "position_ids": torch.arange(ids.shape[1])[None]})
        torch.testing.assert_close(together[document[0]], alone[document[0]], rtol=1e-5, atol=1e-5)


def test_builtin_gpt_packed_equals_alone(tmp_path):
    torch.manual_seed(0)
    check_packed_equals_alone(GPT(GPTConfig(vocab_size=VOCAB, context=16, layers=2, heads=2, width=16)), tmp_path)


@pytest.mark.parametrize("config", [
    {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 16, "n_positions": 32},
    {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
     "hidden_size": 16, "intermediate_size": 32, "max_position_embeddings": 32},
])
def test_hugging_face_model_packed_equals_alone(tmp_path, config):
    pytest.importorskip("transformers")
    from trainwise.text.lm_builder import build_language_model

    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    spec = DataSpec(input_shape=(10,), num_classes=VOCAB, task="causal_lm")
    model = build_language_model(ModelConfig(hf_config=str(tmp_path / "config.json")), spec)
    assert model.get_input_embeddings().num_embeddings == VOCAB  # the data's vocabulary
    check_packed_equals_alone(model, tmp_path / "data")
