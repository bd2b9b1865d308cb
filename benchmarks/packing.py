"""Memory and speed of a packed language-model step on the CPU: no T² term from an attention mask.

    python benchmarks/packing.py            # -> benchmarks/results/packing.json

A Llama-3.2-1B-shaped slice (hidden 2048, 32 heads, 8 KV heads, intermediate 8192; 2 layers, and a vocabulary
of 2,048 instead of 128,256 so that the head does not swamp the attention's share) runs one training step (forward,
backward, SGD) on one packed row of T = 1,024 / 2,048 / 4,096 tokens (documents of T/8 tokens), each case in a
fresh subprocess whose peak resident memory (ru_maxrss) above its memory before the step is the step's.

- after: packing told by position ids alone (what trainwise does): transformers builds the mask it needs;
- before: the old path, a hand-made [B, 1, T, T] bool mask passed as the attention mask (on SDPA it is kept as
  given: K/V repeated for GQA, the memory-efficient kernel instead of causal skipping).

The step's memory is fitted as a + b·T + c·T² over the three lengths; the T² share is c·T² / memory at 4,096.
Tokens/s: the packed row vs the same tokens as unpacked rows of one document each (T/8 tokens a row, the
batch of 8 rows that packing replaces). Target: the packed step's T² share at 4,096 ≤ 10%.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
LENGTHS = (1024, 2048, 4096)
DOCUMENTS = 8
SLICE = dict(hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
             num_hidden_layers=2, vocab_size=2048, max_position_embeddings=8192, tie_word_embeddings=True,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
T2_SHARE_TARGET = 0.10


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def current_rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def case(length: int, mode: str) -> dict:
    """One step in this process (a fresh subprocess per case): its peak memory above the model's, its time."""
    import torch
    import transformers

    from trainwise.llm import hf

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model = hf.build_model(transformers.LlamaConfig(**SLICE), device="cpu", attention=("sdpa",)).train()
    model.config.use_cache = False
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    rows, width = (DOCUMENTS, length // DOCUMENTS) if mode == "unpacked" else (1, length)
    ids = torch.randint(0, SLICE["vocab_size"], (rows, width))
    positions = torch.arange(length // DOCUMENTS).repeat(DOCUMENTS if mode != "unpacked" else 1)
    positions = positions.expand(rows, width)
    inputs = {"input_ids": ids, "labels": ids}
    if mode == "after":
        inputs["position_ids"] = positions
    elif mode == "before":
        document = (positions == 0).cumsum(dim=1)
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        inputs.update(position_ids=positions,
                      attention_mask=((document[:, :, None] == document[:, None, :]) & causal)[:, None])
    before = current_rss()
    started = time.perf_counter()
    model(**inputs).loss.backward()
    optimizer.step()
    elapsed = time.perf_counter() - started
    return {"T": length, "mode": mode, "step_peak_bytes": rss_bytes() - before, "seconds": elapsed,
            "tokens_per_s": rows * width / elapsed}


def run_case(length: int, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, __file__, "--case", str(length), mode], check=True, capture_output=True,
                         text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def quadratic_share(cases: list[dict]) -> dict:
    """Exact fit of a + b·T + c·T² through the three lengths; the T² term's share of the step at the longest."""
    import numpy as np

    lengths = np.array([c["T"] for c in cases], dtype=float)
    memory = np.array([c["step_peak_bytes"] for c in cases], dtype=float)
    a, b, c = np.linalg.solve(np.stack([np.ones_like(lengths), lengths, lengths ** 2], axis=1), memory)
    longest = lengths[-1]
    return {"constant_mib": a / 2**20, "per_token_kib": b / 2**10, "per_token_squared_bytes": c,
            "t2_share_at_longest": float(max(c, 0.0) * longest ** 2 / memory[-1])}


def main() -> None:
    from common import write_result

    results: dict = {"model": "Llama-3.2-1B-shaped slice: 2 layers, hidden 2048, 32 heads, 8 KV heads, "
                              f"intermediate 8192, vocabulary {SLICE['vocab_size']} (small, said so: the real "
                              "128,256 would make the head dominate the step's memory)",
                     "documents_per_row": DOCUMENTS, "attention": "sdpa (CPU)"}
    for mode in ("after", "before"):
        cases = [run_case(length, mode) for length in LENGTHS]
        results[mode] = {"cases": cases, "fit": quadratic_share(cases)}
        print(mode, json.dumps(results[mode]["fit"]))
    unpacked = run_case(LENGTHS[-1], "unpacked")
    packed = results["after"]["cases"][-1]
    results["tokens_per_s"] = {"T": LENGTHS[-1], "packed": packed["tokens_per_s"],
                               "unpacked": unpacked["tokens_per_s"],
                               "packed_over_unpacked": packed["tokens_per_s"] / unpacked["tokens_per_s"],
                               "unpacked_step_peak_bytes": unpacked["step_peak_bytes"]}
    results["before_over_after_peak_at_longest"] = (results["before"]["cases"][-1]["step_peak_bytes"]
                                                    / packed["step_peak_bytes"])
    share = results["after"]["fit"]["t2_share_at_longest"]
    results["targets"] = {"t2_share_at_longest_at_most": T2_SHARE_TARGET}
    results["meets_targets"] = share <= T2_SHARE_TARGET
    results["load_average"] = os.getloadavg()
    write_result("packing", results)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--case":
        print(json.dumps(case(int(sys.argv[2]), sys.argv[3])))
    else:
        main()
