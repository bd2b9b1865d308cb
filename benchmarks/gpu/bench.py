"""GPU benchmark of the product: what trainwise's own Trainer reaches on a real card.

    benchmarks/gpu/run.sh            # on the GPU server (under 8 minutes on one H200)
    benchmarks/gpu/run.sh --dry-run  # tiny sizes on the CPU: proves the script runs (CI does this)

1. Smoke: `trainwise train digits` under torchrun with one rank, strategy ddp and fsdp.
2. ResNet-50 on synthetic ImageNet-size images (3×224×224), bf16 autocast + channels_last, through
   Trainer.fit(): images/s from the Trainer's own log lines. NVIDIA publishes about 2,500 img/s on an
   A100 with AMP; the H200 target is ≥ 3,500.
3. GPT-2 small (124M) with torch.compile and bf16 through Trainer.fit(): tokens/s and model FLOPs
   utilisation against the card's dense bf16 peak (H200: 989 TFLOP/s); target ≥ 50% MFU.
4. A 1B Llama-style model (Llama-3.2-1B's config, random init) trained in pure bf16 through the Trainer on
   token batches: tokens/s, MFU (the Trainer's own figures) and the allocator's peak.
5. The recommenders (benchmarks/recsys.py's throughput): `shop-sasrec` and `shop-din` at the default
   generator size with the recipes' precision (bf16 on the card), training events/s through the Trainer.
6. The 1B Llama packed: rows of 4,096 tokens holding 8 documents vs the same documents one a row, with the
   attention trainwise chooses on the card (packed.py): tokens/s and the allocator's peak of each.
Beside each: the data-wait share the Trainer measured and the telemetry it recorded (GPU utilisation,
temperature). Results go to benchmarks/results/gpu.json (gpu_dry_run.json for a dry run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"  # this checkout's trainwise, whether or not one is installed on the GPU server
sys.path.insert(0, str(SRC))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from common import machine, write_result  # noqa: E402
from models import GPT, ResNet50, next_token_loss  # noqa: E402
from packed import llama_1b_packed  # noqa: E402

from trainwise import ArrayDataset, DataSpec, RunDir, Trainer, config_from_dict  # noqa: E402

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "RTX 4090": 165e12}
TARGETS = {"resnet50_images_per_s": 3500, "gpt2_mfu": 0.50}


def precision(dry: bool) -> str:
    return "fp32" if dry else "bf16"  # CPU bf16 convolutions are slow on CPUs without native bf16


def train_config(steps: int, batch: int, precision: str, compile_model: bool, device: str) -> dict:
    return {"optim": {"name": "adamw", "lr": 1e-4, "weight_decay": 0.01}, "schedule": {"warmup_steps": 2},
            "model": {"compile": compile_model},
            "train": {"max_steps": steps, "batch_size": batch, "precision": precision, "device": device,
                      "log_every": max(1, steps // 6), "grad_clip_norm": 1.0},
            "eval": {"every_epoch": False}, "checkpoint": {"every_steps": None},
            "telemetry": {"enabled": True, "interval_s": 1.0}}


def fit(model, dataset, spec, raw_config, out: Path, **kwargs) -> dict:
    config = config_from_dict(raw_config, source="gpu benchmark")
    run = RunDir.create(out)
    started = time.perf_counter()
    summary = Trainer(model, dataset, config=config, run_dir=run, data_spec=spec, **kwargs).fit()
    records = run.read_metrics("train")[1:] or run.read_metrics("train")  # the first interval compiles/warms
    samples = [r["samples_per_s"] for r in records]
    system = run.read_system()
    gpus = [gpu for sample in system for gpu in sample.get("gpus") or []]
    utilisation = [g["utilization_pct"] for g in gpus if g.get("utilization_pct") is not None]
    temperature = [g["temperature_c"] for g in gpus if g.get("temperature_c") is not None]
    return {"status": summary["status"], "wall_s": round(time.perf_counter() - started, 1),
            "samples_per_s": statistics.median(samples),
            "data_wait_fraction": statistics.median(r["data_wait_fraction"] for r in records),
            "telemetry": {"samples": len(system), "gpu_util_pct_mean": statistics.fmean(utilisation) if utilisation
                          else None, "gpu_temp_c_max": max(temperature) if temperature else None}}


def resnet50(tmp: Path, dry: bool, device: str) -> dict:
    size, batch, steps, base = (32, 4, 3, 4) if dry else (224, 256, 60, 64)
    n = batch * 4
    images = torch.randn(n, 3, size, size)
    labels = torch.randint(0, 1000, (n,))
    model = ResNet50(base=base).to(memory_format=torch.channels_last)
    result = fit(model, ArrayDataset(images, labels), DataSpec(input_shape=(3, size, size), num_classes=1000),
                 train_config(steps, batch, precision(dry), False, device), tmp / "resnet50",
                 augment=lambda x: x.contiguous(memory_format=torch.channels_last))
    result["images_per_s"] = result.pop("samples_per_s")
    result["setup"] = {"image_size": size, "batch_size": batch, "steps": steps, "precision": precision(dry),
                       "memory_format": "channels_last"}
    return result


def gpt2(tmp: Path, dry: bool, device: str, peak: float | None) -> dict:
    shape = dict(vocabulary=512, context=64, width=64, layers=2, heads=4) if dry else {}
    batch, steps = (4, 3) if dry else (16, 40)
    model = GPT(**shape)
    context, vocabulary = model.config["context"], model.config["vocabulary"]
    tokens = torch.randint(0, vocabulary, (batch * 4, context + 1))
    data = ArrayDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    result = fit(model, data, DataSpec(input_shape=(context,), num_classes=vocabulary, input_dtype=torch.long),
                 train_config(steps, batch, precision(dry), not dry, device), tmp / "gpt2", loss_fn=next_token_loss)
    tokens_per_s = result.pop("samples_per_s") * context
    result["tokens_per_s"] = tokens_per_s
    result["model_flops_per_token"] = model.flops_per_token()
    result["mfu"] = model.flops_per_token() * tokens_per_s / peak if peak else None
    result["setup"] = {**model.config, "batch_size": batch, "steps": steps, "precision": precision(dry),
                       "compile": not dry, "parameters": sum(p.numel() for p in model.parameters())}
    return result


class RandomTokens(torch.utils.data.Dataset):
    """Token batches of random ids (the batch contract: input_ids, labels aligned, position_ids)."""

    batched = True
    reads_in_place = True

    def __init__(self, rows: int, length: int, vocabulary: int):
        self.ids = torch.randint(0, vocabulary, (rows, length + 1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {key: value[0] for key, value in self.__getitems__([index]).items()}

    def __getitems__(self, indices) -> dict:
        rows = self.ids[torch.as_tensor(indices)]
        length = rows.shape[1] - 1
        return {"input_ids": rows[:, :-1], "labels": rows[:, 1:], "position_ids": torch.arange(length).expand(len(rows), -1)}


def llama_1b(tmp: Path, dry: bool, device: str) -> dict:
    """Llama-3.2-1B's architecture at random init (model.hf_config), full training in pure bf16 weights
    (model.dtype=bf16) through the Trainer on token batches: tokens/s and MFU from the Trainer's own log, the
    allocator's peak beside the planner's estimate when the planner can make one."""
    from trainwise.llm.catalogue import lookup
    from trainwise.plan.planner import device_peak_flops
    from trainwise.train.callbacks.token_rates import PeakFlops

    fields = dict(lookup("llama-3.2-1b").config)
    if dry:
        fields.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=512)
    config_file = tmp / "llama-1b.json"
    config_file.write_text(json.dumps(fields))
    length, batch, steps = (32, 2, 3) if dry else (2048, 8, 20)
    raw = train_config(steps, batch, precision(dry), False, device)
    raw["model"] = {"hf_config": str(config_file), "dtype": "bf16", "master_weights": "none"}
    raw["telemetry"] = {"enabled": False}
    config = config_from_dict(raw, source="gpu benchmark")
    spec = DataSpec(input_shape=(length,), num_classes=fields["vocab_size"], task="causal_lm", input_dtype=torch.long)
    from trainwise.recipes.factories import build_model

    model = build_model(config, spec)
    parameters = sum(p.numel() for p in model.parameters())
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run = RunDir.create(tmp / "llama-1b")
    started = time.perf_counter()
    summary = Trainer(model, RandomTokens(batch * 4, length, fields["vocab_size"]), config=config, run_dir=run,
                      data_spec=spec, callbacks=[PeakFlops(device_peak_flops)]).fit()
    records = run.read_metrics("train")[1:] or run.read_metrics("train")
    return {"status": summary["status"], "wall_s": round(time.perf_counter() - started, 1),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in records),
            "mfu": statistics.median(r["mfu"] for r in records) if all("mfu" in r for r in records) else None,
            "flops_per_token": records[-1]["flops_per_token"],
            "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
            "planned_peak_bytes": None,  # the LLM planner's figure for this step is issue M's GPU check
            "setup": {"config": "llama-3.2-1b" + (" (shrunk for the dry run)" if dry else ""), "parameters": parameters,
                      "seq_len": length, "batch_size": batch, "steps": steps, "weights": "bf16",
                      "precision": precision(dry)}}


def recommenders(tmp: Path, dry: bool, device: str) -> dict:
    from recsys import throughput

    size = ["data.args.users=200", "data.args.items=100", "data.args.events=5000", "data.args.categories=5",
            "data.args.max_eval_queries=50"] if dry else []
    return throughput(size, 3 if dry else 200, device=device, work=tmp / "recsys")


def smoke(tmp: Path, dry: bool) -> dict:
    """One rank under torchrun per strategy: the launch path users take, end to end."""
    results = {}
    for strategy in ("ddp", "fsdp"):
        out = tmp / f"smoke-{strategy}"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                   "-m", "trainwise", "train", "digits", "--out", str(out), *(["train.max_steps=5", "schedule.warmup_steps=1"] if dry else ["train.max_steps=40"]),
                   f"train.strategy={strategy}", "telemetry.enabled=false"] + (["train.device=cpu"] if dry else [])
        done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
                                  filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))})
        results[strategy] = {"exit_code": done.returncode,
                             "tail": done.stderr.strip().splitlines()[-3:] if done.returncode else []}
    return results


def card() -> tuple[str, float | None]:
    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name(0)
    peak = next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)
    return name, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: the script runs")
    parser.add_argument("--output", type=Path, help="write the JSON here instead of benchmarks/results/")
    args = parser.parse_args()
    name, peak = card()
    if not args.dry_run and name == "cpu":
        sys.exit("no CUDA device: run on the GPU server, or use --dry-run to check the script on the CPU")
    device = "cpu" if args.dry_run else "cuda"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        result = {"card": name, "peak_bf16_flops": peak, "dry_run": args.dry_run, "smoke": smoke(tmp, args.dry_run),
                  "resnet50": resnet50(tmp, args.dry_run, device), "gpt2": gpt2(tmp, args.dry_run, device, peak),
                  "llama_1b": llama_1b(tmp, args.dry_run, device), "recsys": recommenders(tmp, args.dry_run, device),
                  "llama_1b_packed": llama_1b_packed(args.dry_run, device)}
    for recipe, figures in result["recsys"].items():
        print(f"{recipe}: {figures['events_per_s']:,.0f} training events/s")
    measured = {"resnet50_images_per_s": result["resnet50"]["images_per_s"], "gpt2_mfu": result["gpt2"]["mfu"]}
    result["targets"] = TARGETS
    result["meets_targets"] = None if args.dry_run else all(
        measured[key] is not None and measured[key] >= target for key, target in TARGETS.items())
    for key, value in measured.items():
        print(f"{key}: {value}")
    if args.output:
        args.output.write_text(json.dumps({"benchmark": "gpu", "machine": machine(), **result}, indent=2) + "\n")
    else:
        write_result("gpu_dry_run" if args.dry_run else "gpu", result)


if __name__ == "__main__":
    main()
