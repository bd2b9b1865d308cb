"""Does a training step run as fast after a validation pass as before it? -> benchmarks/results/after_validation.json

A LoRA run on a pretrained 135M Llama-family model (CPU) was seen to slow by 40-50% per step after its first
validation pass. This measures it on the sft-lora recipe as a user runs it (`trainwise prepare`, then `trainwise
train sft-lora model.hf=DIR`), over a small random-init Llama saved as a Hugging Face directory (config.json,
model.safetensors and a tokenizer with a chat template), so the model is loaded with `from_pretrained`, as a real
one is. Each try validates at step VALIDATE_AT (and after its last step); the median step time before it (steps
3..VALIDATE_AT, the first two warm up) is compared with the median after it (steps VALIDATE_AT + 1 on, whose logged
time leaves the validation pass out, train/loop/timing.py). Several tries: the median of their ratios.

The sanity checks are off (`train.sanity=false`): their one-batch probe trains the model before step 1 and so put
every module in training mode, which hid what the engine itself did. The cause found: transformers loads a model
in eval mode, peft's wrapper is built in training mode, and nothing put the blocks in training mode, so they ran
without gradient checkpointing until the first validation pass restored the wrapper's mode to every module
(checkpointing on from then: every step recomputes its forward). TrainStep now puts the model in training mode.

    python benchmarks/after_validation.py            # ~5 min on 2 busy CPU cores
    python benchmarks/after_validation.py --quick    # one short try, to check the plumbing (no target)

Target: the median after-rate within 5% of the median before-rate (`meets_targets`).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from benchmarks.common import write_result  # noqa: E402

MODEL = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 512,
         "tie_word_embeddings": True}
SEQ_LEN = 128
BATCH = 8
VALIDATE_AT = 10
TARGET = 0.05  # after within 5% of before
THREADS = 1  # one OpenMP thread: a shared machine's other jobs disturb two threads' barriers more than one
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ("red blue green apple river stone cloud bird tree lamp music paper sun moon wind fire water light "
         "house road city night day book table chair window door garden field").split()


def write_model(directory: Path) -> None:
    """A tokenizer (byte-level BPE trained here, ChatML template) and a random-init Llama of its vocabulary,
    saved as a Hugging Face model directory."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    corpus = [" ".join(rng.choices(WORDS, k=12)) for _ in range(400)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<pad>",
                                                     additional_special_tokens=["<|im_start|>", "<|endoftext|>"])
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(directory)
    fields = {k: v for k, v in MODEL.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model("llama", vocab_size=len(tokenizer), **fields)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def write_chats(path: Path, count: int) -> None:
    """Instruction rows long enough that a packed row of SEQ_LEN tokens holds one or two of them."""
    rng = random.Random(1)
    with path.open("w") as out:
        for _ in range(count):
            words = rng.choices(WORDS, k=rng.randint(15, 30))
            out.write(json.dumps({"instruction": "copy: " + " ".join(words), "output": " ".join(words)}) + "\n")


def trainwise(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(THREADS)}
    done = subprocess.run([sys.executable, "-m", "trainwise", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"trainwise {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def one_try(work: Path, model: Path, data: Path, index: int, steps: int) -> dict:
    """One sft-lora run validating once at VALIDATE_AT; the per-step times before and after it."""
    run = work / f"run{index}"
    trainwise("train", "sft-lora", f"model.hf={model}", f"data.path={data}", f"data.seq_len={SEQ_LEN}",
              "model.dtype=fp32", f"train.batch_size={BATCH}", f"train.micro_batch_size={BATCH}",
              f"train.max_steps={steps}", "train.log_every=1", "train.device=cpu", "train.precision=fp32",
              f"eval.every_steps={VALIDATE_AT}", "eval.every_epoch=false", "telemetry.enabled=false",
              "data.num_workers=0", "train.sanity=false", "--out", str(run))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    times = {row["step"]: row["step_time_s"] for row in rows if row.get("split") == "train"}
    before = [times[s] for s in range(3, VALIDATE_AT + 1)]
    after = [times[s] for s in range(VALIDATE_AT + 1, steps + 1)]
    before_s, after_s = statistics.median(before), statistics.median(after)
    return {"before_s_per_step": before_s, "after_s_per_step": after_s, "after_over_before": after_s / before_s,
            "before_steps": len(before), "after_steps": len(after)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short try (no target)")
    parser.add_argument("--tries", type=int, default=5)
    args = parser.parse_args()
    tries, steps = (1, VALIDATE_AT + 4) if args.quick else (args.tries, 2 * VALIDATE_AT)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        write_model(work / "model")
        write_chats(work / "chats.jsonl", 600)
        trainwise("prepare", str(work / "chats.jsonl"), "--to", str(work / "data"), "--tokenizer",
                  str(work / "model"), "--seq-len", str(SEQ_LEN))
        results = [one_try(work, work / "model", work / "data", i, steps) for i in range(tries)]
        for result in results:
            print(json.dumps(result))
    before = statistics.median(r["before_s_per_step"] for r in results)
    after = statistics.median(r["after_s_per_step"] for r in results)
    # each try's own ratio (its before and after ran minutes apart on the same machine), then their median:
    # steadier than a ratio of medians when other jobs come and go between tries. Above 1: slower after
    ratio = statistics.median(r["after_over_before"] for r in results)
    write_result("after_validation", {
        "setup": {"recipe": "sft-lora", "model": MODEL, "seq_len": SEQ_LEN, "batch_size": BATCH,
                  "method": "lora (recipe defaults: rank 16, all-linear, dropout 0.05, gradient checkpointing)",
                  "dtype": "fp32", "sanity_checks": False, "validate_at_step": VALIDATE_AT, "steps_per_try": steps,
                  "tries": tries,
                  "omp_threads": THREADS, "quick": args.quick},
        "load_average": list(os.getloadavg()),
        "tries": results,
        "before_s_per_step": before, "after_s_per_step": after,
        "after_over_before": ratio,
        "target": f"after within {TARGET:.0%} of before",
        "meets_targets": None if args.quick else abs(ratio - 1) <= TARGET,
    })


if __name__ == "__main__":
    main()
