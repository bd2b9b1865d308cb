"""Only the assistant's tokens carry loss: every prompt and system token is -100, in every turn, with the
built-in templates and with a tokenizer's own Jinja template; over-long samples truncated or dropped, counted."""
from __future__ import annotations

import pytest

from tests.text.sft_tokenizers import CHATML_JINJA, CORPUS, write_hf_tokenizer_dir
from trainwise.errors import DataError
from trainwise.data.text.chat import Conversation, Turn
from trainwise.data.text.chat_templates import BUILTIN_TEMPLATES, choose_template
from trainwise.data.text.instruct import IGNORE_INDEX, encode_all, encode_conversation, fit_length, labels_for
from trainwise.data.text.tokenizer import BpeTokenizer, ModelTokenizer

CHAT = Conversation((Turn("system", "Be brief."), Turn("user", "reverse: one two"), Turn("assistant", "two one"),
                     Turn("user", "sort 3 1 2"), Turn("assistant", "1 2 3")))


@pytest.fixture(scope="module")
def bpe():
    return BpeTokenizer.train(CORPUS, 300)


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    tokenizer = ModelTokenizer.from_directory(write_hf_tokenizer_dir(tmp_path_factory.mktemp("tok")))
    assert tokenizer.chat_template == CHATML_JINJA
    return tokenizer


def trained_text(sample, tokenizer):
    """The text of each run of loss-carrying tokens (the end-of-text id written as <|endoftext|>)."""
    def text(ids):
        return "".join("<|endoftext|>" if i == tokenizer.eos_id else tokenizer.decode([i]) for i in ids)

    runs, current = [], []
    for token, trains in zip(sample.ids, sample.trains):
        if trains:
            current.append(token)
        elif current:
            runs.append(text(current)), current.clear()
    return runs + ([text(current)] if current else [])


@pytest.mark.parametrize("name,answers", [
    # a sample ends with end-of-text; after a closing answer it is the answer's, so the model learns to stop
    ("chatml", ["two one<|im_end|>\n", "1 2 3<|im_end|>\n<|endoftext|>"]),
    ("llama3", ["two one<|eot_id|>", "1 2 3<|eot_id|><|endoftext|>"]),
    ("plain", ["two one\n\n<|endoftext|>", "1 2 3\n\n<|endoftext|>"]),
])
def test_builtin_templates_train_on_every_answer_and_nothing_else(bpe, name, answers):
    sample = encode_conversation(CHAT, BUILTIN_TEMPLATES[name], bpe)
    assert trained_text(sample, bpe) == answers
    full = bpe.decode(sample.ids)
    assert "Be brief." in full and "reverse: one two" in full and "sort 3 1 2" in full


def test_the_tokenizers_own_template_masks_each_turn(hf_tokenizer):
    template = choose_template(None, hf_tokenizer)
    sample = encode_conversation(CHAT, template, hf_tokenizer)
    assert trained_text(sample, hf_tokenizer) == ["two one<|im_end|>\n", "1 2 3<|im_end|>\n<|endoftext|>"]
    # generation encodes the same prompt text the training sample had before its last answer
    prompt = template.prompt(CHAT.as_messages()[:-1])
    assert hf_tokenizer.decode(sample.ids).startswith(prompt)


def test_labels_are_shifted_and_minus_100_wherever_the_next_token_is_prompt(bpe):
    sample = encode_conversation(CHAT, BUILTIN_TEMPLATES["chatml"], bpe)
    labels = labels_for(sample)
    assert len(labels) == len(sample.ids) and labels[-1] == IGNORE_INDEX
    for t in range(len(labels) - 1):
        assert labels[t] == (sample.ids[t + 1] if sample.trains[t + 1] else IGNORE_INDEX)
    assert sum(label != IGNORE_INDEX for label in labels) == sum(sample.trains)  # the first token is prompt


def test_a_tokenizer_without_a_template_names_the_fix(bpe):
    with pytest.raises(DataError, match="--template NAME with one of chatml, llama3, plain"):
        choose_template(None, bpe)
    with pytest.raises(DataError, match="no built-in chat template 'vicuna'"):
        choose_template("vicuna", bpe)


def test_without_prompt_masking_every_token_trains(bpe):
    sample = encode_conversation(CHAT, BUILTIN_TEMPLATES["chatml"], bpe, mask_prompt=False)
    assert all(sample.trains)


def test_over_long_samples_are_truncated_from_the_prompt_side_or_dropped_and_counted(bpe):
    template = BUILTIN_TEMPLATES["chatml"]
    sample = encode_conversation(CHAT, template, bpe)
    last_answer = len(bpe.encode("1 2 3<|im_end|>\n"))
    kept, what = fit_length(sample, last_answer + 3, "truncate")
    assert what == "truncated" and kept.ids == sample.ids[-(last_answer + 3):]
    assert fit_length(sample, last_answer, "truncate") == (None, "dropped")  # the answer would lose its start
    assert fit_length(sample, last_answer + 3, "drop") == (None, "dropped")
    short = Conversation((Turn("user", "hi"), Turn("assistant", "yo")))
    limit = len(encode_conversation(short, template, bpe))
    assert last_answer < limit < len(sample)
    samples, stats = encode_all([CHAT, short, CHAT], template, bpe, max_tokens=limit)
    assert (stats.samples, stats.truncated, stats.dropped_too_long) == (3, 2, 0)
    assert stats.lengths == [len(sample), limit, len(sample)] and len(samples[0]) == limit
    _, stats = encode_all([CHAT, short], template, bpe, max_tokens=limit, too_long="drop")
    assert (stats.samples, stats.dropped_too_long) == (1, 1)
    assert 0 < stats.loss_share < 1 and len(stats.lengths) == 2
    with pytest.raises(DataError, match="no sample is left"):
        encode_all([CHAT], template, bpe, max_tokens=4, too_long="drop")


@pytest.mark.parametrize("name", ["chatml", "llama3", "plain"])
def test_each_builtin_template_has_a_jinja_twin_that_renders_the_same_text(name):
    """Exported tokenizers carry the Jinja form: transformers' apply_chat_template must write what trained."""
    from trainwise.data.text.chat_templates import JinjaTemplate

    builtin = BUILTIN_TEMPLATES[name]
    twin = JinjaTemplate(builtin.jinja, {"eos_token": ""})  # the built-in appends the EOS id, not its text
    messages = CHAT.as_messages()
    assert "".join(s.text for s in twin.segments(messages)) == "".join(s.text for s in builtin.segments(messages))
    assert twin.prompt(messages[:3]) == builtin.prompt(messages[:3])


def test_the_tokenizers_template_ends_an_answer_where_it_writes_its_end_marker(hf_tokenizer):
    """Generation cuts an answer at the template's own end-of-turn text, not only at end-of-text."""
    assert choose_template(None, hf_tokenizer).stop_text == "<|im_end|>"
