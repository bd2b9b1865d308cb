"""Language-model plans against the truth: benchmarks/results/llm_plan.json.

(1) Plan vs the CPU allocator's peak inside the step while trainwise's own Trainer (model built from the config
    by the Trainer's builder, in-memory token rows) runs two optimizer steps of small random-initialised
    GPT-2-, Llama- and Qwen-style configs, x methods x checkpointing x two sequence lengths.
(2) The plans of published measured setups (torchtune's README, LLaMA-Factory's table) beside their figures.
(3) Plan time and peak RSS for 8B and 70B configs, each in a fresh process.
(4) Planned step times of published throughput measurements beside their tokens/s (torchtune's README table on
    one RTX 4090; torchtitan's Llama-3.1-8B on 8 H100s): the ratio, nothing tuned to match.

Run: PYTHONPATH=src python benchmarks/llm_plan.py [--part truth|published|speed|throughput ...]  (default: all)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

GiB = 2**30
FAMILIES = {  # small configs of each family (parameters printed in the result)
    "gpt2-style": ("gpt2", dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=512)),
    "llama-style": ("llama-3.2-1b", dict(num_hidden_layers=4, hidden_size=256, intermediate_size=704,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                         vocab_size=8192)),
    "qwen-style": ("qwen2.5-0.5b", dict(num_hidden_layers=4, hidden_size=256, intermediate_size=704,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=8192)),
    # mixture of experts: top-2 routing over 4 fused experts (transformers 5's grouped matmuls)
    "mixtral-style": ({"model_type": "mixtral"}, dict(num_hidden_layers=4, hidden_size=256, intermediate_size=352,
                                                       num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                                       vocab_size=8192, num_local_experts=4, num_experts_per_tok=2)),
}
SETTINGS = {  # method, weights dtype, autocast
    "full fp32": dict(method="full", dtype="fp32", precision="fp32"),
    "full bf16 autocast": dict(method="full", dtype="fp32", precision="bf16"),
    "pure bf16": dict(method="full", dtype="bf16", precision="bf16"),
    "freeze (last 2 blocks)": dict(method="freeze", trainable_blocks=2, dtype="fp32", precision="fp32"),
    "lora (rank 16)": dict(method="lora", dtype="fp32", precision="fp32"),
}


def summarise(rows: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in rows if "error" in r]
    return {"cases": rows, "count": len(errors), "median_abs_error": statistics.median(errors),
            "max_abs_error": max(errors), "worst_underestimate": min(r["error"] for r in rows if "error" in r),
            "source": "measured by this run (a full run of part 'truth')",
            "truth": "CPU allocator peak (torch.profiler allocation events, counted from before the model is built) "
                     "inside the Trainer's step range (trainwise.train_step: forward/backward of the step's "
                     "micro-batches, clipping, optimizer update, zero_grad) while trainwise's own Trainer "
                     "(train/loop/trainer.py) builds the model from the config (model.hf_config, method, dtype, "
                     "checkpointing: text/lm_builder.py) and runs 2 optimizer steps (batch 2, micro-batch 2, "
                     "AdamW, clip 1.0) over an in-memory token dataset; the planner traces the same step. "
                     "'fit_peak_bytes' is the peak over the whole fit (model build, loader, logging, the end of "
                     "the run); no evaluation and no checkpoint ran (eval.every_steps and checkpoint.every_steps "
                     "unset, no validation data). Where it is above the step's peak (LoRA), it is the end of the "
                     "run: the final weights written (Checkpointer.write_final: the state dict gathered on the "
                     "host, the safetensors bytes, peft's adapter files): host RAM, which the plan reports apart "
                     "(host_ram's 'final save'), not the step's device memory.",
            "window": "trainwise.train_step (record_function range of TrainStep.__call__)"}


class TokenRows(Dataset):
    """In-memory token rows of the batch contract (input_ids, labels, position_ids), as text data gives them."""

    def __init__(self, count: int, seq_len: int, vocab: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, seq_len), generator=generator)
        self.labels = torch.randint(0, vocab, (count, seq_len), generator=generator)
        self.positions = torch.arange(seq_len)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.labels[index], "position_ids": self.positions}


def trainer_peak(job, config_path: Path, run_dir: Path) -> tuple[int, int]:
    """(peak inside the step range, peak over the whole fit) while trainwise's Trainer trains 2 steps."""
    from trainwise.config.load import config_from_dict
    from trainwise.data.bundle import DataSpec
    from trainwise.plan.probe import cpu_peaks
    from trainwise.rundir import RunDir
    from trainwise.text.lm_builder import build_language_model
    from trainwise.train.step.train_step import STEP_RANGE
    from trainwise.train.loop.trainer import Trainer

    vocab = job.config().vocab_size
    config = config_from_dict({
        "seed": 0, "model": {"name": None, "hf_config": str(config_path), "method": job.method,
                             "trainable_blocks": job.trainable_blocks, "dtype": job.dtype,
                             "master_weights": "none",  # the plan's bf16 full fine-tuning is pure bf16
                             "gradient_checkpointing": job.gradient_checkpointing},
        "data": {"num_workers": 0},
        "optim": {"name": "adamw", "lr": 1e-4},
        "train": {"max_steps": 2, "batch_size": job.batch_size, "micro_batch_size": job.micro, "log_every": 2,
                  "device": "cpu", "precision": job.precision, "grad_clip_norm": job.grad_clip_norm,
                  "sanity": False},
        "eval": {"every_steps": None}, "checkpoint": {"every_steps": None}, "telemetry": {"enabled": False},
    }, source="benchmark")
    spec = DataSpec(input_shape=(job.seq_len,), num_classes=vocab, task="causal_lm", input_dtype=torch.int64,
                    num_train=2 * job.batch_size)
    rows = TokenRows(2 * job.batch_size, job.seq_len, vocab)

    def fit() -> None:
        model = build_language_model(config.model, spec, seed=0)
        Trainer(model, rows, None, config=config, data_spec=spec, built_from_config=True,
                run_dir=RunDir.create(run_dir / f"run{time.monotonic_ns()}")).fit()

    return cpu_peaks(fit, within=STEP_RANGE)


def lm_job(**fields):
    """The traced job with the fields a case sets; the others as every case here ran them (LmJob has no defaults:
    in `plan` they come from the RunConfig)."""
    from trainwise.llm.methods import LoraSettings
    from trainwise.plan.llm_job import LmJob

    return LmJob(**{**dict(seq_len=2048, batch_size=16, micro_batch_size=None, method="full", trainable_blocks=2,
                           lora=LoraSettings(), dtype="fp32", precision="bf16", optimizer="adamw",
                           gradient_checkpointing=False, loss_chunk_size=None, grad_clip_norm=1.0), **fields})


def truth_on_cpu() -> dict:
    import tempfile

    from trainwise.llm import hf
    from trainwise.plan.llm_estimate import model_facts, trace_lm

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for family, (name, overrides) in FAMILIES.items():
            config_path = Path(scratch) / family / "config.json"
            config_path.parent.mkdir(parents=True)
            config_path.write_text(hf.resolve_config(name, **overrides).to_json_string())
            for seq_len in (64, 128):
                for setting, fields in SETTINGS.items():
                    for checkpointing in (False, True):
                        job = lm_job(model=str(config_path), seq_len=seq_len, batch_size=2,
                                    gradient_checkpointing=checkpointing, **fields)
                        planned = trace_lm(job, 2, device_kind="cpu", count_flops=False).peak_bytes
                        real, fit = trainer_peak(job, config_path, Path(scratch) / "runs")
                        rows.append({"family": family, "setting": setting, "checkpointing": checkpointing,
                                     "seq_len": seq_len, "planned_bytes": planned, "measured_bytes": real,
                                     "fit_peak_bytes": fit, "error": (planned - real) / real})
                        print(f"{family:12} {setting:24} ckpt={checkpointing!s:5} T={seq_len:4} plan "
                              f"{planned / 2**20:8.2f} MiB real {real / 2**20:8.2f} MiB (fit {fit / 2**20:8.2f}) "
                              f"{rows[-1]['error']:+.2%}", flush=True)
            facts = model_facts(lm_job(model=name, overrides=overrides))
            rows.append({"family": family, "parameters": facts.total_parameters})
    return summarise(rows)


TORCHTUNE = "torchtune README: Llama 3.1 8B, 1x RTX 4090, batch 2, packed to 2048 tokens (GiB)"
LLAMA_FACTORY = "LLaMA-Factory README hardware table: 7B (estimated; GB, 1,024 tokens per the issue)"
PUBLISHED = [  # (source, setting, figure GiB, job fields, what differs)
    (TORCHTUNE, "full", 18.9,
     dict(model="llama-3.1-8b", method="full", dtype="bf16", precision="bf16", optimizer="adamw8bit",
          gradient_checkpointing=True, loss_chunk_size=512, seq_len=2048, batch_size=2),
     "two things torchtune does that trainwise does not: it runs the optimizer in backward (each gradient is "
     "applied and freed at once, so the bf16 gradients, ~15 GiB, never exist together: 'planned_without_gradients' "
     "is our peak less them), and its *paged* 8-bit AdamW keeps the moments (2 bytes per weight, ~15 GiB) in CUDA "
     "managed memory outside PyTorch's allocator, which its peak figure does not count and the driver pages to host "
     "RAM on a 24 GB card. Less both, our plan is weights 15 GiB + activations and the chunked loss."),
    *[(TORCHTUNE, setting, gibibytes,
       dict(model="llama-3.1-8b", method=setting, dtype="bf16", precision="bf16", gradient_checkpointing=True,
            loss_chunk_size=512, seq_len=2048, batch_size=2, lora_rank=8), why)
      for setting, gibibytes, why in (
          ("lora", 16.2, "torchtune's LoRA recipe adapts q/v/output projections and the MLP at rank 8 (we adapt all "
                         "linear layers at rank 8) and computes the loss over 8 output chunks whose bf16 logits stay "
                         "alive for backward (ours: 512-token chunks recomputed in backward)."),
          ("qlora", 7.4, "same as LoRA; the 4-bit base is torchao's NF4 (a scale per 64 weights, double-quantised) "
                         "as ours."))],
    *[(LLAMA_FACTORY, setting, gigabytes / 1.073741824,
       dict(model="llama-2-7b", seq_len=1024, batch_size=1, **fields), why)
      for setting, gigabytes, fields, why in (
          ("full mixed", 120.0, dict(method="full", dtype="fp32", precision="bf16"),
           "LLaMA-Factory's figure is a rule of thumb (~18 bytes per parameter: fp32 weights, gradients, two Adam "
           "moments, bf16 copies), not a traced step; ours counts what this step holds at its peak."),
          ("lora", 16.0, dict(method="lora", dtype="bf16", precision="bf16", gradient_checkpointing=True, lora_rank=8),
           "their table counts ~2 bytes per weight plus a margin; activations depend on the unstated batch."),
          ("qlora 4-bit", 6.0, dict(method="qlora", dtype="bf16", precision="bf16", gradient_checkpointing=True,
                                    lora_rank=8),
           "their table counts ~0.5 byte per weight plus a margin."))],
]


def published_setups() -> list[dict]:
    from trainwise.llm.methods import LoraSettings
    from trainwise.plan.llm_estimate import trace_lm

    out = []
    for source, setting, figure_gib, fields, differs in PUBLISHED:
        fields = dict(fields)
        rank = fields.pop("lora_rank", 16)
        job = lm_job(lora=LoraSettings(rank=rank, alpha=2.0 * rank), **fields)
        started = time.perf_counter()
        trace = trace_lm(job, job.micro, count_flops=False)
        gradients = trace.breakdown.get("gradients", 0)
        out.append({"source": source, "setting": setting, "published_gib": round(figure_gib, 2),
                    "job": {k: v for k, v in fields.items()}, "lora_rank": rank,
                    "planned_peak_gib": round(trace.peak_bytes / GiB, 2),
                    "planned_breakdown_gib": {k: round(v / GiB, 2) for k, v in trace.breakdown.items()},
                    "planned_where": trace.peak_where,
                    "planned_without_gradients_gib": round((trace.peak_bytes - gradients) / GiB, 2),
                    "difference_gib": round(trace.peak_bytes / GiB - figure_gib, 2),
                    "why_they_differ": differs, "plan_seconds": round(time.perf_counter() - started, 1)})
        print(out[-1]["setting"], out[-1]["published_gib"], out[-1]["planned_peak_gib"], flush=True)
    return out


# (source, setting, published tokens/s per GPU, card, cards, plan flags, overrides, what the setups share/differ in)
TORCHTUNE = ("torchtune README, 'Memory and training speed' (Llama 3.1 8B, 1x RTX 4090, batch 2, seq 2048, "
             "activation checkpointing, torch.compile)")
THROUGHPUT = [
    (TORCHTUNE, "full (bf16 weights, 8-bit paged AdamW)", 1650, "RTX 4090", 1,
     dict(method="full", dtype="bf16", optimizer="adamw8bit", gradient_checkpointing=True), [],
     "torchtune steps the optimizer inside backward (no whole gradient held) and compiles; we plan eager."),
    (TORCHTUNE, "LoRA", 3083, "RTX 4090", 1, dict(method="lora", lora_rank=8), [],
     "their LoRA wraps q, v, output and the MLP at rank 8; ours all linear layers at rank 8."),
    (TORCHTUNE, "QLoRA", 2413, "RTX 4090", 1, dict(method="qlora", lora_rank=8), [],
     "torchao's NF4 vs our bitsandbytes-shaped dequantisation traffic."),
    ("torchtitan docs/performance.md (Llama 3.1 8B, 8x H100 SXM, FSDP, bf16 mixed precision, local batch 2 x seq "
     "8192, selective activation checkpointing)", "pretraining, FSDP x8", 5762, "H100 SXM", 8,
     dict(method="full", seq_len=8192, batch_size=16, gradient_checkpointing=True), [],
     "selective checkpointing recomputes less than our full checkpointing; torch.compile and float8 off."),
]


def planned_throughput() -> list[dict]:
    from trainwise.plan import advise as rules
    from trainwise.plan.catalog import find_gpus, load_gpus
    from trainwise.cli.plan import plan_config
    from trainwise.plan.advise_layouts import timed
    from trainwise.plan.job import job_from_config
    from trainwise.plan.llm_estimate import advice_estimates, estimate_lm
    from trainwise.plan.llm_time import MFU

    out = []
    for source, setting, published, card, cards, flags, overrides, differs in THROUGHPUT:
        started = time.perf_counter()
        flags = {"seq_len": 2048, "batch_size": 2, **flags}
        job = job_from_config(plan_config("llama-3.1-8b", overrides, flags))
        if flags.get("optimizer") == "adamw8bit":  # plan-only (bitsandbytes): the planner's, as --optimizer gives it
            job = job.with_changes(optimizer="adamw8bit")
        (gpu,) = find_gpus(load_gpus(), [card])
        est = estimate_lm(job)
        row = rules.plan_card(advice_estimates(est), gpu, rules.Options(max_gpus=cards), cards,
                              "single" if cards == 1 else "fsdp")
        layout = timed(est, gpu, cards, row.strategy, row.needed_bytes, row.fits, max(row.micro_batch_size, 1),
                       None, "USD", None)
        per_gpu = layout.tokens_per_s / cards
        out.append({"source": source, "setting": setting, "card": card, "cards": cards,
                    "job": {k: (v if not isinstance(v, (dict, list)) else str(v)) for k, v in flags.items()},
                    "published_tokens_per_s_per_gpu": published, "planned_tokens_per_s_per_gpu": round(per_gpu),
                    "planned_over_published": round(per_gpu / published, 2),
                    "planned_step_s": round(layout.step_time_s, 3), "planned_bound": layout.bound,
                    "planned_fits": layout.fits, "planned_needed_gib": round(layout.needed_bytes / GiB, 1),
                    "micro_batch_size": layout.micro_batch_size or 1, "mfu_assumed": MFU,
                    "why_they_differ": differs, "plan_seconds": round(time.perf_counter() - started, 1)})
        print(setting, published, out[-1]["planned_tokens_per_s_per_gpu"], out[-1]["planned_over_published"],
              flush=True)
    return out


SPEED_CODE = """
import json, resource, sys, time
started = time.perf_counter()
from trainwise.cli.plan import plan_config
from trainwise.plan.catalog import find_gpus, load_gpus
from trainwise.plan.job import job_from_config
from trainwise.plan.planner import PlanRequest, plan_language_model
job = job_from_config(plan_config(sys.argv[1], [], {"method": "lora", "seq_len": 2048, "batch_size": 16,
                                                    "micro_batch_size": 16, "gradient_checkpointing": False}))
report = plan_language_model(job, find_gpus(load_gpus(), ["RTX4090", "A100-40GB"]), PlanRequest(max_gpus=8),
                             advice=sys.argv[2] == "advice")
print(json.dumps({"seconds": time.perf_counter() - started, "planning_seconds": report.seconds,
                  "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_gib": report.estimate.trace_at(16).peak_bytes / 2**30,
                  "levers": len(report.advice.levers)}))
"""


def plan_speed() -> list[dict]:
    out = []
    for model, mode in (("llama-3.1-8b", "traces"), ("llama-3.1-70b", "traces"), ("llama-3.1-70b", "advice")):
        if True:
            done = subprocess.run([sys.executable, "-c", SPEED_CODE, model, mode], capture_output=True, text=True,
                                  timeout=1800)
            if done.returncode:
                out.append({"model": model, "mode": mode, "error": done.stderr[-2000:]})
                continue
            row = {"model": model, "mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])}
            out.append(row)
            print(row, flush=True)
    return out


PARTS = ("truth", "published", "speed", "throughput")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=PARTS, action="append",
                        help="run only this part (repeatable); the others are kept from the existing result")
    args = parser.parse_args()
    parts = args.part or list(PARTS)
    started = time.perf_counter()
    measured, seconds, load = {}, {}, {}
    for part, key, run in (("truth", "truth_on_cpu", truth_on_cpu), ("published", "published_setups", published_setups),
                           ("speed", "plan_speed", plan_speed), ("throughput", "published_throughput",
                                                                 planned_throughput)):
        if part in parts:
            part_started, load[part] = time.perf_counter(), round(os.getloadavg()[0], 1)
            measured[key] = run()
            seconds[part] = round(time.perf_counter() - part_started, 1)
    # the other parts as the file holds them now (read at the end: another part may have run meanwhile)
    path = Path(__file__).resolve().parent / "results" / "llm_plan.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    result = {key: previous.get(key) for key in ("truth_on_cpu", "published_setups", "plan_speed",
                                                 "published_throughput")}
    result.update(measured)
    result["part_seconds"] = {**(previous.get("part_seconds") or {}), **seconds}
    result["part_load_average"] = {**(previous.get("part_load_average") or {}), **load}
    truth, speed = result["truth_on_cpu"] or {}, result["plan_speed"] or []
    big = next((r for r in speed if r["model"] == "llama-3.1-70b" and r["mode"] == "advice" and "error" not in r), None)
    targets = {"median_abs_error<=2%": truth.get("median_abs_error", 1) <= 0.02,
               "max_abs_error<=5%": truth.get("max_abs_error", 1) <= 0.05,
               "no_underestimate_beyond_5%": truth.get("worst_underestimate", -1) >= -0.05,
               "70b_plan<=60s": bool(big and big["seconds"] <= 60),
               "70b_plan_rss<=2GiB": bool(big and big["max_rss_bytes"] <= 2 * GiB)}
    write_result("llm_plan", {
        "note": "Parts run separately (--part truth|published|speed) and merge into this file; 'part_seconds' says "
                "which ran, 'part_load_average' the machine's 1-minute load when each began: timings of a part begun "
                "on a busy machine are inflated (tiny fake-tensor ops lose their time to other jobs); memory figures "
                "are not affected.",
        "parts_run_last": parts, **result,
        "meets_targets": all(targets.values()), "targets": targets,
        "seconds": round(time.perf_counter() - started, 1)})


if __name__ == "__main__":
    main()
