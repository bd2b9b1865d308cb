"""Fine-tuning a Hugging Face causal LM with LoRA on instruction data through the engine: the run leaves an
adapter peft loads (same logits as the run's model), resumes bit for bit from adapter + optimizer state, and
QLoRA is refused on the CPU with the reason."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import invoke, stop_at
from tests.text.sft_data import prepared_chats, sft_config
from trainwise.recipes.factories import build_data, build_model
from trainwise.rundir.checkpoint_files import read_checkpoint
from trainwise.rundir.adapter import adapter_dir
from trainwise.rundir.layout import RunDir
from trainwise.runtime.model_state import load_kept_state, saved_record
from trainwise.launch.runs import build_trainer, train_run

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_chats(tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def straight(data):
    return train_run(sft_config(data), data / "straight")


def trained_model(run: RunDir):
    config = run.read_config()
    model = build_model(config, build_data(config).spec)
    load_kept_state(model, load_file(run.model_path), saved_record(run.model_path))
    return model.eval()


def test_the_adapter_loads_in_peft_with_the_runs_logits(straight):
    from peft import PeftModel

    from trainwise.llm.hf import build_model as build_hf, resolve_config

    tuned = trained_model(straight)
    config = straight.read_config()
    vocab = build_data(config).spec.num_classes
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        base = build_hf(resolve_config(config.model.hf_config, vocab_size=vocab), device="cpu")
    loaded = PeftModel.from_pretrained(base, str(adapter_dir(straight))).eval()
    ids = torch.randint(0, vocab, (2, 12))
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, tuned(input_ids=ids).logits, atol=1e-6)
    assert set(load_file(straight.model_path)) == {n for n, p in tuned.named_parameters() if p.requires_grad}


def test_a_stopped_lora_run_resumes_bit_identical(data, straight):
    config = sft_config(data)
    run = RunDir.create(data / "stopped")
    build_trainer(config, run, [stop_at(3)]).fit()
    assert read_checkpoint(run.checkpoint_path("last"))["weights_scope"] == "trainable"
    assert build_trainer(config, RunDir(run.path)).fit(resume=True)["status"] == "completed"
    a, b = load_file(straight.model_path), load_file(run.model_path)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_qlora_is_refused_on_the_cpu_with_the_reason(data, capsys):
    config = sft_config(data, method="qlora")
    recipe = data / "qlora.yaml"
    from trainwise.config import dump_yaml

    recipe.write_text(dump_yaml(config))
    result = invoke(capsys, "train", str(recipe), "--out", str(data / "qlora"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "model.method=qlora cannot train here" in result.stderr and "CUDA" in result.stderr


def test_export_merge_writes_a_plain_model_with_the_adapter_models_logits(straight, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    refused = invoke(capsys, "export", str(straight.path), "--to", str(tmp_path / "plain"))
    assert refused.returncode == 2 and "--merge" in refused.stderr
    done = invoke(capsys, "export", str(straight.path), "--merge", "--to", str(tmp_path / "merged"))
    assert done.returncode == 0, done.stderr
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), local_files_only=True).eval()
    assert not any("lora" in name for name in merged.state_dict())
    tuned = trained_model(straight)
    ids = torch.randint(0, merged.config.vocab_size, (2, 12))
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, tuned(input_ids=ids).logits, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "merged"))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "reverse a b"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nreverse a b<|im_end|>\n<|im_start|>assistant\n"


def test_generate_answers_through_the_chat_template(straight, capsys):
    import json

    done = invoke(capsys, "generate", str(straight.path), "--prompt", "reverse a b c d", "--temperature", "0",
                  "--max-tokens", "6", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["chat_template"] == "chatml"
    raw = invoke(capsys, "generate", str(straight.path), "--prompt", "reverse", "--raw", "--temperature", "0",
                 "--max-tokens", "3", "--json")
    assert json.loads(raw.stdout.strip().splitlines()[-1])["chat_template"] is None


@pytest.mark.slow
def test_eval_scores_held_out_answers_and_the_report_shows_base_and_tuned(straight, capsys):
    import json

    done = invoke(capsys, "eval", str(straight.path), "--split", "val", "--checkpoint", "final", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    tuned = result["finetune"]
    assert tuned["chat_template"] == "chatml" and tuned["answers"] == 8 and 0 <= tuned["exact_match"] <= 1
    assert len(tuned["side_by_side"]) == 5 and tuned["side_by_side"][0]["reference"].count(" ") == 3
    assert result["tokens"] > 0  # loss / perplexity / token accuracy over the answers' tokens only
    table = invoke(capsys, "eval", str(straight.path), "--split", "val", "--checkpoint", "final")
    assert "held-out prompts" in table.stdout and "base and tuned answers" in table.stdout
    report = invoke(capsys, "report", str(straight.path), "--format", "md")
    assert report.returncode == 0, report.stderr
    assert "Fine-tune: exact match" in (straight.path / "report.md").read_text()
