"""model.hf: the data must be tokenized by the model's own tokenizer; the fingerprints say whether it was."""
from __future__ import annotations

import pytest

from tests.data.text.test_tokenizer import TEXTS
from trainwise.config import ModelConfig
from trainwise.data.bundle import DataSpec
from trainwise.errors import ConfigError
from trainwise.text.lm_builder import build_language_model
from trainwise.data.text.tokenizer import BpeTokenizer, ByteTokenizer, ModelTokenizer


@pytest.fixture
def model_dir(tmp_path):
    transformers = pytest.importorskip("transformers")
    bpe = BpeTokenizer.train(TEXTS, 300)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe.backend, eos_token="<|endoftext|>")
    fast.save_pretrained(str(tmp_path))
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=len(fast))
    transformers.GPT2LMHeadModel(config).save_pretrained(str(tmp_path))
    return tmp_path


def spec(fingerprint: str, vocab: int) -> DataSpec:
    return DataSpec(input_shape=(16,), num_classes=vocab, task="causal_lm", tokenizer_fingerprint=fingerprint)


def test_data_of_another_tokenizer_is_refused(model_dir):
    with pytest.raises(ConfigError, match=f"--tokenizer {model_dir}"):
        build_language_model(ModelConfig(hf=str(model_dir)), spec(ByteTokenizer().fingerprint, 257))


def test_data_of_the_models_tokenizer_loads_the_weights(model_dir):
    tokenizer = ModelTokenizer.from_directory(model_dir)
    model = build_language_model(ModelConfig(hf=str(model_dir)), spec(tokenizer.fingerprint, tokenizer.vocab_size))
    assert model.get_input_embeddings().num_embeddings == tokenizer.vocab_size
