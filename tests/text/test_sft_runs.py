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
    loaded = PeftModel.from_pretrained(base, str(straight.adapter_dir())).eval()
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


def test_fsdp_shards_the_decoder_layers_and_trains_the_adapter_as_one_process(data, straight):
    """FSDP2 on a peft-wrapped Hugging Face model: each decoder layer (frozen base and LoRA weights together) is a
    unit, the checkpoint holds the adapter and its optimizer state only, the adapter is peft's."""
    from torch.distributed.checkpoint import FileSystemReader

    from tests.train.lora_models import fsdp_world_of_one
    from trainwise.train.parallel.fsdp import fsdp_blocks

    config = sft_config(data)
    config = config.model_copy(update={"train": config.train.model_copy(update={"strategy": "fsdp"})})
    run = RunDir.create(data / "fsdp")
    with fsdp_world_of_one():
        trainer = build_trainer(config, run)
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        blocks = fsdp_blocks(trainer.model)
        assert len(blocks) == 1 and isinstance(blocks[0], LlamaDecoderLayer)
        trainer.fit()
    a, b = load_file(straight.model_path), load_file(run.model_path)
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    stored = FileSystemReader(run.checkpoint_dirs.pointer("last")).read_metadata().state_dict_metadata
    tensors = [name for name in stored if name.startswith(("model.", "optimizer.state."))]
    assert tensors and all("lora_" in name for name in tensors)
    adapter = load_file(run.adapter_dir() / "adapter_model.safetensors")
    single = load_file(straight.adapter_dir() / "adapter_model.safetensors")
    assert adapter.keys() == single.keys() and all(adapter[k].equal(single[k]) for k in adapter)


GPT_LORA = {"name": "gpt", "hf_config": None, "args": {"layers": 1, "heads": 2, "width": 32}}


@pytest.mark.parametrize("model", [{}, GPT_LORA], ids=["hf", "builtin"])
def test_out_of_memory_in_a_lora_run_recovers_with_checkpointing_that_recomputes(data, model, one_thread):
    """Out of memory at every micro-batch until the blocks recompute their activations: the run halves the
    micro-batch down to 1, then turns on gradient checkpointing in the model peft wraps (set on the wrapper it
    would change nothing), every block runs twice per micro-batch from then on, gradients still reach the
    adapter through the recomputed blocks (the frozen embeddings' outputs need none), only the adapter trains
    and is saved."""
    from collections import Counter

    from trainwise.llm.methods import wrapped_model

    run = RunDir.create(data / f"oom-{model.get('name', 'hf')}")
    config = sft_config(data, **model)
    config = config.model_copy(update={"train": config.train.model_copy(update={"max_steps": 3})})
    trainer = build_trainer(config, run)
    inner = wrapped_model(trainer.model)
    block = inner.model.layers[0] if hasattr(inner, "model") else inner.h[0]
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    calls = []

    def out_of_memory_unless_recomputed(module, args):
        recomputes = getattr(module, "gradient_checkpointing", None)  # a Hugging Face layer's own switch
        if module.training and not (inner.gradient_checkpointing if recomputes is None else recomputes):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")

    block.register_forward_pre_hook(out_of_memory_unless_recomputed)
    # inside the block (a Hugging Face layer checkpoints its forward, past its own hooks), on the way in (the
    # recomputation stops as soon as backward has what it needs)
    block.mlp.register_forward_pre_hook(lambda module, args: calls.append(trainer.step) if module.training else None)
    assert trainer.fit()["status"] == "completed"
    recoveries = [e["evidence"] for e in run.read_events() if e["kind"] == "oom_recovered"]
    assert [r.get("micro_batch_size", "checkpointing") for r in recoveries] == [2, 1, "checkpointing"]
    assert set(Counter(calls).values()) == {2 * trainer.accumulation_steps} and len(set(calls)) == 3
    assert {n for n, p in trainer.model.named_parameters() if p.requires_grad} == trainable
    final = load_file(run.model_path)
    assert set(final) == trainable and (run.adapter_dir() / "adapter_model.safetensors").is_file()
    assert all(final[n].abs().sum() > 0 for n in final if "lora_B" in n)  # zero at the start: all trained


def test_the_sanity_probe_passes_lora_on_a_trained_like_base_and_names_a_random_one(data, capsys, one_thread):
    """`trainwise train` on a Llama whose output layer spans logits as a trained model's does (wide init): the
    adapters memorise the probe's batch, no warning. On the usual random init (std 0.02) a frozen head cannot,
    whatever the adapters: the warning says that, not 'raise the rank'."""
    import json

    from tests.text.sft_data import TINY_LLAMA
    from trainwise.check.sanity import sanity_check
    from trainwise.config import dump_yaml

    wide = data / "llama-wide"
    wide.mkdir(exist_ok=True)
    (wide / "config.json").write_text(json.dumps({**TINY_LLAMA, "initializer_range": 0.5}))
    config = sft_config(data, hf_config=str(wide))
    config = config.model_copy(update={"train": config.train.model_copy(update={"sanity": True, "max_steps": 3})})
    recipe = data / "sanity.yaml"
    recipe.write_text(dump_yaml(config))
    done = invoke(capsys, "train", str(recipe), "--out", str(data / "sanity"), show_warnings=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "overfit" not in done.stdout + done.stderr and "not memorised" not in done.stdout + done.stderr
    random_base = config.model_copy(update={"model": config.model.model_copy(update={"hf_config": str(data / "llama")})})
    probe = [f for f in sanity_check(random_base) if f.code.startswith("overfit")][0]
    assert probe.code == "overfit_probe_slow" and "initialised at random" in probe.detail
    assert "model.hf=DIR" in probe.fixes[0]


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
    assert "merged in fp32, saved in fp32" in " ".join(done.stdout.split())  # an fp32 base stays fp32
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
    # every held-out answer, tuned and base, with exact match per prompt; base vs tuned over the whole split
    rows = [json.loads(line) for line in (straight.path / "eval" / "answers.jsonl").read_text().splitlines()]
    assert len(rows) == tuned["answers"] == tuned["held_out"] == 8
    assert {"prompt", "reference", "tuned", "tuned_correct", "base", "base_correct"} <= set(rows[0])
    assert tuned["correct"] == sum(r["tuned_correct"] for r in rows)
    assert tuned["base_exact_match"] == sum(r["base_correct"] for r in rows) / 8
    # generations: the split's prompts through the template, not continuations of raw markup
    assert [g["prompt"] for g in result["generations"]] == [r["prompt"] for r in tuned["side_by_side"]]
    assert not any("<|im_start|>" in g["prompt"] for g in result["generations"])
    table = invoke(capsys, "eval", str(straight.path), "--split", "val", "--checkpoint", "final", "--before")
    assert "held-out prompts" in table.stdout and "base and tuned answers" in table.stdout
    assert "(base model: " in table.stdout and "answers.jsonl" in table.stdout
    assert "answer tokens" in table.stdout  # what the metrics above count (issue 35: not "samples")
    # --before: the model as the run started, on the same answers, beside the tuned one
    assert "before (untrained)" in table.stdout and "exact match" in table.stdout
    before = json.loads((straight.path / "eval" / "metrics.json").read_text())["before"]
    assert before["tokens"] == result["tokens"] and before["exact_match"] == tuned["base_exact_match"]
    assert before["loss"] > result["loss"], (before, result["loss"])
    task = straight.read_summary()["task"]
    assert task["kind"] == "language_model" and task["detail"].startswith("instruction fine-tune")
    report = invoke(capsys, "report", str(straight.path), "--format", "md")
    assert report.returncode == 0, report.stderr
    assert "Fine-tune: exact match" in (straight.path / "report.md").read_text()
