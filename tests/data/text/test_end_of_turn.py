"""A tokenizer whose eos is the template's end-of-turn (<|im_end|>, Qwen/SmolLM-style): each answer is trained to
end with it once, never twice, and plain text is separated by the model's <|endoftext|>, not by <|im_end|>."""
from __future__ import annotations

import pytest

from tests.text.sft_tokenizers import CHATML_JINJA, train_bpe
from trainwise.data.text.chat import Conversation, Turn
from trainwise.data.text.chat_templates import BUILTIN_TEMPLATES, choose_template
from trainwise.data.text.instruct import encode_conversation
from trainwise.data.text.tokenizer import ModelTokenizer

CHAT = Conversation((Turn("user", "reverse: one two"), Turn("assistant", "two one"),
                     Turn("user", "sort 3 1 2"), Turn("assistant", "1 2 3")))


@pytest.fixture(scope="module")
def qwen_style(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=train_bpe(), eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>",
                                                additional_special_tokens=["<|im_start|>", "<|endoftext|>"])
    fast.chat_template = CHATML_JINJA
    directory = tmp_path_factory.mktemp("qwen-style")
    fast.save_pretrained(directory)
    return ModelTokenizer.from_directory(directory)


def trained_text(sample, tokenizer) -> str:
    return tokenizer.decode([token for token, trains in zip(sample.ids, sample.trains) if trains])


@pytest.mark.parametrize("template", ["builtin", "jinja"])
def test_an_answer_ends_with_one_end_of_turn(qwen_style, template):
    chosen = BUILTIN_TEMPLATES["chatml"] if template == "builtin" else choose_template(None, qwen_style)
    sample = encode_conversation(CHAT, chosen, qwen_style)
    assert sample.ids.count(qwen_style.eos_id) == 4  # two prompts and two answers, each closed once
    assert sample.ids[-1] != qwen_style.eos_id  # "...1 2 3<|im_end|>\n": no second <|im_end|> appended
    assert trained_text(sample, qwen_style).count("<|im_end|>") == 2


def test_plain_text_is_separated_by_end_of_text_not_end_of_turn(qwen_style):
    separator = qwen_style.backend.convert_tokens_to_ids("<|endoftext|>")
    assert qwen_style.separator_id == separator != qwen_style.eos_id
