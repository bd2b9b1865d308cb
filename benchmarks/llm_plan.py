"""Language-model plans against the truth: benchmarks/results/llm_plan.json.

(1) Plan vs the CPU allocator's peak while trainwise's training step (the engine's TrainStep, built by the same
    factories as the Trainer's, on dict batches) runs two optimizer steps of small random-initialised
    GPT-2-, Llama- and Qwen-style configs, x methods x checkpointing x two sequence lengths.
(2) The plans of published measured setups (torchtune's README, LLaMA-Factory's table) beside their figures.
(3) Plan time and peak RSS for 8B and 70B configs, each in a fresh process.

Run: PYTHONPATH=src python benchmarks/llm_plan.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

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
}
SETTINGS = {  # method, weights dtype, autocast
    "full fp32": dict(method="full", dtype="fp32", precision="fp32"),
    "full bf16 autocast": dict(method="full", dtype="fp32", precision="bf16"),
    "pure bf16": dict(method="full", dtype="bf16", precision="bf16"),
    "freeze (last 2 blocks)": dict(method="freeze", trainable_blocks=2, dtype="fp32", precision="fp32"),
    "lora (rank 16)": dict(method="lora", dtype="fp32", precision="fp32"),
}


def truth_on_cpu(quick: bool) -> dict:
    import torch

    from trainwise.llm import methods
    from trainwise.plan.llm_plan import model_facts, trace_lm
    from trainwise.plan.llm_step import LmJob, lm_step
    from trainwise.plan.probe import measured_peak_bytes

    rows = []
    for family, (name, overrides) in FAMILIES.items():
        # the shared 2-core machine allows every combination for one family; the others at one length
        lengths = (64, 128) if family == "llama-style" or not quick else (128,)
        for setting, fields in SETTINGS.items():
            for checkpointing in (False, True):
                for seq_len in lengths:
                    job = LmJob(model=name, overrides=overrides, seq_len=seq_len, batch_size=2,
                                gradient_checkpointing=checkpointing, **fields)
                    planned = trace_lm(job, 2, device_kind="cpu", count_flops=False).peak_bytes
                    real = measured_peak_bytes(lm_step(job, None, 2, device_kind="cpu"), torch.device("cpu"))
                    rows.append({"family": family, "setting": setting, "checkpointing": checkpointing,
                                 "seq_len": seq_len, "planned_bytes": planned, "measured_bytes": real,
                                 "error": (planned - real) / real})
                    print(f"{family:12} {setting:24} ckpt={checkpointing!s:5} T={seq_len:4} plan "
                          f"{planned / 2**20:8.2f} MiB real {real / 2**20:8.2f} MiB {rows[-1]['error']:+.2%}",
                          flush=True)
        facts = model_facts(LmJob(model=name, overrides=overrides))
        rows.append({"family": family, "parameters": facts.total_parameters})
    errors = [abs(r["error"]) for r in rows if "error" in r]
    return {"cases": rows, "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
            "worst_underestimate": min(r["error"] for r in rows if "error" in r),
            "truth": "CPU allocator peak (torch.profiler allocation events) over two optimizer steps of the "
                     "engine's TrainStep (train/step.py, dict batches, per-token loss), built by the Trainer's "
                     "factories; the planner traces the same step. Batch 2, micro-batch 2."}


TORCHTUNE = "torchtune README: Llama 3.1 8B, 1x RTX 4090, batch 2, packed to 2048 tokens (GiB)"
LLAMA_FACTORY = "LLaMA-Factory README hardware table: 7B (estimated; GB, 1,024 tokens per the issue)"
PUBLISHED = [  # (source, setting, figure GiB, job fields, what differs)
    (TORCHTUNE, "full", 18.9,
     dict(model="llama-3.1-8b", method="full", dtype="bf16", precision="bf16", optimizer="adamw8bit",
          gradient_checkpointing=True, loss_chunk_size=512, seq_len=2048, batch_size=2),
     "torchtune runs the optimizer in backward: each gradient is applied and freed as soon as it is computed, so "
     "the whole-model gradients (bf16, ~15 GiB) never exist together; trainwise keeps them until the step. "
     "'without gradients' below is our peak less the gradients live at it."),
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
    from trainwise.plan.llm_plan import trace_lm
    from trainwise.plan.llm_step import LmJob

    out = []
    for source, setting, figure_gib, fields, differs in PUBLISHED:
        fields = dict(fields)
        rank = fields.pop("lora_rank", 16)
        job = LmJob(lora=LoraSettings(rank=rank, alpha=2.0 * rank), **fields)
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


SPEED_CODE = """
import json, resource, sys, time
started = time.perf_counter()
from trainwise.plan.llm_report import make_lm_plan
from trainwise.plan.llm_step import LmJob
report = make_lm_plan(LmJob(model=sys.argv[1], method="lora", seq_len=2048, batch_size=16),
                      ("RTX4090", "A100-40GB"), 8, advice=sys.argv[2] == "advice")
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="GPT-2 and Qwen styles at one sequence length")
    args = parser.parse_args()
    started = time.perf_counter()
    truth = truth_on_cpu(args.quick)
    published = published_setups()
    speed = plan_speed()
    big = next((r for r in speed if r["model"] == "llama-3.1-70b" and r["mode"] == "advice" and "error" not in r), None)
    targets = {"median_abs_error<=2%": truth["median_abs_error"] <= 0.02,
               "max_abs_error<=5%": truth["max_abs_error"] <= 0.05,
               "no_underestimate_beyond_5%": truth["worst_underestimate"] >= -0.05,
               "70b_plan<=60s": bool(big and big["seconds"] <= 60),
               "70b_plan_rss<=2GiB": bool(big and big["max_rss_bytes"] <= 2 * GiB)}
    write_result("llm_plan", {
        "note": "the machine (2 cores) was shared with other helpers' jobs while this ran: timings are inflated "
                "accordingly; memory figures are not affected.",
        "truth_on_cpu": truth, "published_setups": published, "plan_speed": speed,
        "meets_targets": all(targets.values()), "targets": targets,
        "seconds": round(time.perf_counter() - started, 1)})


if __name__ == "__main__":
    main()
