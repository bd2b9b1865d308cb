"""Exports that work in plain transformers: a from-scratch byte-level and BPE `lm-gpt` run and a ChatML LoRA
fine-tune exported with --merge are loaded with AutoTokenizer / AutoModelForCausalLM alone (`plain`, `ends_at`
import nothing of trainwise), special tokens encode as one id, config.json and generation_config.json carry the
tokenizer's ids, generate stops at the end of text or the end of turn, and runs past a short context."""
from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import invoke
from tests.text.sft_data import prepared_chats, sft_config
from tests.data.text.test_prepare_text import make_corpus
from trainwise.data.prepare import PrepareOptions
from trainwise.evaluate.export import check_export_matches, export_run
from trainwise.evaluate.export_tokens import byte_characters, export_tokens
from trainwise.launch.runs import train_run
from trainwise.recipes import load_recipe
from trainwise.data.text.chat_templates import BUILTIN_TEMPLATES
from trainwise.data.prepare import prepare_corpus as prepare
from trainwise.data.text.tokenizer import BpeTokenizer

pytest.importorskip("transformers")

TINY = ["model.args.layers=1", "model.args.width=16", "model.args.heads=2", "train.max_steps=2",
        "train.batch_size=4", "data.seq_len=32", "eval.every_steps=2", "schedule.warmup_steps=1",
        "telemetry.enabled=false", "train.sanity=false", "train.device=cpu", "data.num_workers=0"]


def plain(directory):
    """The export as anyone would load it: transformers only."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), local_files_only=True).eval()
    return tokenizer, model


def ends_at(model, token_id: int, after: int = 3):
    """Make the model's head emit `token_id` as its (after+1)-th generated token, and no stop id before."""
    stops = model.generation_config.eos_token_id
    stops = stops if isinstance(stops, list) else [stops]
    calls = iter(range(10_000))

    def hook(module, inputs, output):
        output = output.clone()
        if next(calls) >= after:
            output[..., token_id] += 1e4
        else:
            output[..., stops] = -1e4
        return output

    return model.get_output_embeddings().register_forward_hook(hook)


def generated(model, tokenizer, prompt_ids: list[int], **options) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, **options)
    return out[0, len(prompt_ids):].tolist()


def text_run(root, **options):
    prepare(make_corpus(root / "corpus", documents=16), root / "data", PrepareOptions(**options))
    return train_run(load_recipe("lm-gpt", [*TINY, f"data.path={root / 'data'}"]), root / "run").path


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    return text_run(tmp_path_factory.mktemp("bpe"), train_tokenizer=300)


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return text_run(tmp_path_factory.mktemp("bytes"))


@pytest.mark.slow  # trains a tiny run first (a few seconds on 2 shared cores)
def test_a_bpe_export_says_the_tokenizers_ids_and_stops_at_end_of_text(bpe_run, tmp_path):
    result = export_run(bpe_run, tmp_path / "hf")
    tokenizer, model = plain(tmp_path / "hf")
    end = tokenizer.eos_token_id
    assert tokenizer.encode("<|endoftext|>") == [end] and "<|endoftext|>" in tokenizer.all_special_tokens
    assert model.config.eos_token_id == model.config.bos_token_id == model.config.pad_token_id == end
    assert model.generation_config.eos_token_id == end == tokenizer.bos_token_id == tokenizer.pad_token_id
    assert tokenizer.model_max_length == 32 and result["context"].startswith("32 positions")
    prompt = tokenizer.encode("Document 3.")
    with_hook = ends_at(model, end)
    new = generated(model, tokenizer, prompt, max_new_tokens=20)
    with_hook.remove()
    assert len(new) == 4 and new[-1] == end  # three tokens, then the end of text: generate stopped there
    assert check_export_matches(bpe_run, tmp_path / "hf") < 1e-4


@pytest.mark.slow  # trains a tiny run first (a few seconds on 2 shared cores)
def test_a_byte_level_export_has_a_tokenizer_and_generates_past_its_context(byte_run, tmp_path, capsys):
    result = invoke(capsys, "export", str(byte_run), "--to", str(tmp_path / "hf"))
    assert result.returncode == 0, result.stderr
    message = " ".join(result.stdout.split())
    assert "context 32 positions" in message and "generation stops at <|endoftext|> (256)" in message
    assert "saved in fp32" in message
    tokenizer, model = plain(tmp_path / "hf")
    text = "Document héllo\n\t 日本"
    assert tokenizer.encode(text) == list(text.encode("utf-8")) and tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("<|endoftext|>") == [256] == [model.config.eos_token_id]
    assert model.generation_config.eos_token_id == 256
    prompt = tokenizer.encode("Document 1")
    new = generated(model, tokenizer, prompt, max_new_tokens=100)  # 10 + 100 > the 32 positions it learned
    assert 1 <= len(new) <= 100
    assert check_export_matches(byte_run, tmp_path / "hf") < 1e-4  # inside the context: the run's logits


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    pytest.importorskip("peft")
    data = prepared_chats(tmp_path_factory.mktemp("chat"), n=40)
    config = sft_config(data)
    config = config.model_copy(update={"train": config.train.model_copy(update={"max_steps": 3})})
    return train_run(config, data / "run").path


@pytest.mark.slow  # trains a tiny run first (a few seconds on 2 shared cores)
def test_a_chatml_lora_export_merged_stops_at_end_of_turn(chat_run, tmp_path, capsys):
    result = invoke(capsys, "export", str(chat_run), "--merge", "--to", str(tmp_path / "hf"))
    assert result.returncode == 0, result.stderr
    tokenizer, model = plain(tmp_path / "hf")
    end_of_turn, end_of_text = tokenizer.encode("<|im_end|>"), tokenizer.encode("<|endoftext|>")
    assert len(end_of_turn) == len(tokenizer.encode("<|im_start|>")) == 1
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(tokenizer.all_special_tokens)
    assert model.config.eos_token_id == tokenizer.eos_token_id == end_of_text[0]  # not LlamaConfig's default 2
    assert model.config.bos_token_id == tokenizer.bos_token_id and model.config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == end_of_text + end_of_turn
    assert "<|im_end|>" in " ".join(result.stdout.split())
    saved = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["added_tokens"]
    assert all(token["special"] for token in saved)
    messages = [{"role": "user", "content": "reverse a b c d"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nreverse a b c d<|im_end|>\n<|im_start|>assistant\n"
    with_hook = ends_at(model, end_of_turn[0])
    new = generated(model, tokenizer, tokenizer.encode(prompt), max_new_tokens=30)
    with_hook.remove()
    assert len(new) == 4 and new[-1] == end_of_turn[0]
    assert "<|im_end|>" not in tokenizer.decode(new, skip_special_tokens=True)


def test_an_end_of_turn_of_several_ids_is_said_not_silently_dropped():
    """A BPE trained before template markers were special ids: <|im_end|> is ~5 ordinary ids."""
    pytest.importorskip("tokenizers")
    old = BpeTokenizer.train(["<|im_start|>user\nhi there<|im_end|>\n"] * 20, 300)
    tokens = export_tokens(old, BUILTIN_TEMPLATES["chatml"], None)
    assert tokens.stops == (old.eos_id,) and "is 5 ids" in tokens.warning and "prepare the chat data" in tokens.warning
    new = BpeTokenizer.train(["<|im_start|>user\nhi there<|im_end|>\n"] * 20, 300, ("<|im_start|>", "<|im_end|>"))
    tokens = export_tokens(new, BUILTIN_TEMPLATES["chatml"], None)
    assert tokens.stops == (new.eos_id, new.encode("<|im_end|>")[0]) and not tokens.warning
    assert new.decode(new.encode("a<|im_end|>\n") + [new.eos_id]) == "a<|im_end|>\n"  # markers kept, eos dropped


def test_the_byte_alphabet_is_the_one_tokenizers_uses():
    tokenizers = pytest.importorskip("tokenizers")
    assert set(byte_characters().values()) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    assert byte_characters()[ord("A")] == "A" and byte_characters()[ord(" ")] == "Ġ"


def test_a_model_directorys_tokenizer_keeps_a_pretrained_models_own_end_ids(tmp_path):
    """SmolLM/Qwen-style: the tokenizer's eos, its end of text and the template's end of turn all stop; a
    pretrained model's own ids stay where they are special tokens of its tokenizer, others are dropped."""
    from types import SimpleNamespace

    from tests.text.sft_tokenizers import write_hf_tokenizer_dir
    from trainwise.data.text.chat_templates import choose_template
    from trainwise.data.text.tokenizer import ModelTokenizer

    tokenizer = ModelTokenizer.from_directory(write_hf_tokenizer_dir(tmp_path))
    ids = {text: tokenizer.backend.convert_tokens_to_ids(text) for text in ("<|endoftext|>", "<|im_start|>",
                                                                            "<|im_end|>", "<pad>")}
    pretrained = SimpleNamespace(config=SimpleNamespace(bos_token_id=ids["<|im_start|>"], eos_token_id=9),
                                 generation_config=SimpleNamespace(eos_token_id=[ids["<pad>"], 9]))
    tokens = export_tokens(tokenizer, choose_template(None, tokenizer), pretrained)
    assert tokens.eos == ids["<|endoftext|>"] and tokens.pad == ids["<pad>"] and tokens.bos == ids["<|im_start|>"]
    assert tokens.stops == (ids["<|endoftext|>"], ids["<|im_end|>"], ids["<pad>"])  # 9 is no special token
    plain_text = export_tokens(tokenizer, None, None)
    assert plain_text.stops == (ids["<|endoftext|>"],) and plain_text.bos is None
