"""Fine-tune evaluation: answers generated through the chat template, compared exactly with the references;
base and tuned answers side by side (a LoRA model's base: its adapter switched off)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.text.sft_tokenizers import CORPUS
from trainwise.evaluate.finetune import exact_match, side_by_side
from trainwise.data.text.chat import Conversation, Turn
from trainwise.data.text.chat_templates import BUILTIN_TEMPLATES
from trainwise.data.text.instruct import encode_conversation
from trainwise.data.text.tokenizer import BpeTokenizer


@pytest.fixture(scope="module")
def bpe():
    return BpeTokenizer.train(CORPUS, 300)


class Oracle(nn.Module):
    """Predicts the next token of whichever known sequence the input starts: a model that learnt them all."""

    def __init__(self, sequences, vocab, eos):
        super().__init__()
        self.sequences, self.vocab, self.eos = sequences, vocab, eos
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, position_ids=None):
        ids = input_ids[0].tolist()
        follow = next((s[len(ids)] for s in self.sequences if s[:len(ids)] == ids and len(s) > len(ids)), self.eos)
        logits = torch.zeros(1, len(ids), self.vocab)
        logits[0, -1, follow] = 1.0
        return logits

    def generate(self, ids, max_new_tokens, **options):  # what text/generate.py calls on a non-built-in model
        for _ in range(max_new_tokens):
            token = self(ids)[0, -1].argmax().view(1, 1)
            ids = torch.cat([ids, token], dim=1)
            if int(token) == self.eos:
                break
        return ids


def chat(question, answer):
    return Conversation((Turn("user", question), Turn("assistant", answer)))


@pytest.mark.parametrize("name", ["chatml", "plain", "llama3"])
def test_a_model_that_learnt_the_answers_scores_them_all_and_one_that_did_not_scores_none(bpe, name):
    template = BUILTIN_TEMPLATES[name]
    held_out = [chat("reverse: one two three", "three two one"), chat("sort 3 1 2", "1 2 3")]
    learnt = Oracle([encode_conversation(c, template, bpe).ids for c in held_out], bpe.vocab_size, bpe.eos_id)
    result = exact_match(learnt, bpe, template, held_out)
    assert result["exact_match"] == 1.0 and result["examples"][0]["answer"] == "three two one"
    wrong = [chat("reverse: one two three", "one two three"), chat("sort 3 1 2", "1 2 3")]
    assert exact_match(learnt, bpe, template, wrong)["exact_match"] == 0.5


def test_side_by_side_shows_the_base_with_the_adapter_switched_off(bpe):
    model = _tiny_lora_llama(bpe)
    template = BUILTIN_TEMPLATES["chatml"]
    rows = side_by_side(model, bpe, template, ["copy red green"], max_new_tokens=4)
    before = rows[0]["base"]
    assert rows[0]["tuned"] == before  # LoRA's B starts at zero: the adapter changes nothing yet
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 5.0)
    rows = side_by_side(model, bpe, template, ["copy red green", chat("sort 3 1 2", "1 2 3")], max_new_tokens=4)
    assert rows[0]["base"] == before and rows[0]["tuned"] != before  # the base is untouched by the adapter
    assert rows[1]["reference"] == "1 2 3"


def test_every_held_out_answer_is_kept_with_the_base_and_an_empty_one_is_said(bpe):
    from trainwise.evaluate.finetune import held_out_answers
    from trainwise.evaluate.report_lm import exact_match_headline, shown_answer

    model = _tiny_lora_llama(bpe)
    held_out = [chat("sort 3 1 2", "1 2 3"), chat("copy red green", "red green"), chat("copy a", "a")]
    rows = held_out_answers(model, None, bpe, BUILTIN_TEMPLATES["chatml"], held_out, max_new_tokens=4)
    assert [r["reference"] for r in rows] == ["1 2 3", "red green", "a"]
    assert all(r["base"] == r["tuned"] for r in rows)  # LoRA's B starts at zero: base and tuned agree
    assert all(r["tuned_correct"] == (r["tuned"].strip() == r["reference"]) for r in rows)
    assert shown_answer("  ") == "(empty)" and shown_answer("a") == "a"
    headline = exact_match_headline({"exact_match": 0.5, "base_exact_match": 0.0, "answers": 8,
                                     "chat_template": "chatml"})
    assert headline.startswith("exact match 50.0% (base model: 0.0%) on 8 held-out prompts")


def _tiny_lora_llama(bpe):
    """A one-layer Llama with LoRA on q/v (B at zero: the adapter changes nothing until trained)."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=bpe.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
