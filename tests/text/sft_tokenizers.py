"""Tokenizers for the instruction-data tests, built here with no network: a byte-level BPE trained on a few
sentences with `tokenizers`, and a Hugging Face tokenizer directory (PreTrainedTokenizerFast) with a
chat_template in its tokenizer_config.json."""
from __future__ import annotations

from pathlib import Path

CHATML_JINJA = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["copy the words: red green blue", "reverse: one two three", "sort these numbers 3 1 2",
          "add 12 and 30 gives 42", "the quick brown fox jumps over the lazy dog"] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]


def train_bpe(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_hf_tokenizer_dir(directory: Path, chat_template: str | None = CHATML_JINJA) -> Path:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=train_bpe(), eos_token="<|endoftext|>", pad_token="<pad>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(directory)
    return directory

