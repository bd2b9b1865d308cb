"""explain's accuracy on error texts it was never tuned on.

tests/diagnose/corpus/<category>/ holds the texts the rules were written against (tuned);
tests/diagnose/corpus/heldout/<category>/ holds texts written from other trainers' and tools' wording, in
batches (by file prefix), each committed before it was scored. A batch is unseen only until its misses change
the rules, so the target is measured on the latest batch (UNSEEN_BATCH), scored against the current rules;
HISTORY keeps every batch's unseen figure. The tuned figure is printed beside it to show how much the rules
overfit their own corpus.

    .venv/bin/python benchmarks/explain.py      -> benchmarks/results/explain.json
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

from trainwise.diagnose import explain  # noqa: E402

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "diagnose" / "corpus"
TARGET = 0.90
LONG_LOG_TARGET_S = 15.0  # ~1 s on a laptop; pattern-per-line matching took ~20 s
# Earlier held-out sets, measured by this script and then folded into the tuned texts (their misses informed
# the widened rules, so they no longer count as unseen).
HISTORY = [
    {"set": "held-out batch 1 (60 texts, commit e664195)", "rules": "before widening", "accuracy": 0.5833},
    {"set": "held-out batch 2 (30 texts, commit 5cc9a41)", "rules": "first widening", "accuracy": 0.7667},
    {"set": "held-out, 47 earlier texts", "rules": "before issue 35", "accuracy": 0.9574},
    {"set": "issue 35 batch (10 texts: no GPU visible, NCCL timeouts, NaN losses; written before the rules "
            "were changed)", "rules": "before issue 35", "accuracy": 0.8},
    {"set": "u35 batch (57 texts, commit c9616f9, written before the rules or any earlier text were read)",
     "rules": "as merged for issue 35 (before the u35 changes)", "accuracy": 0.9123, "right": "52/57",
     "misses": ["slurm oom_kill event -> unknown", "rendezvous connection refused -> unknown",
                "deserialize on CUDA without a GPU -> checkpoint_load", "collate 'stack expects each tensor to be "
                "equal size' -> unknown", "tokenizer 'Unable to create tensor' (ragged lengths) -> unknown"]},
    {"set": "v35 batch (21 texts, commit b480ed5, written after the u35 changes by someone who had read the "
            "rules, so its wording leans away from the patterns: a search for gaps more than a sample of logs)",
     "rules": "after the u35 changes", "accuracy": 0.619, "right": "13/21",
     "wrong_cause_claimed": 0, "misses": "8, every one answered 'unknown' (no wrong category): a DCP missing key, "
     "an extension's undefined symbol, a CUDA tensor to numpy, PTX from an unsupported toolchain, nll_loss 'not "
     "implemented for Float', Lightning's 'No supported gpu backend found', 'expanded size ... must match the "
     "existing size', 'unable to mmap ... </torch_'"},
    {"set": "w35 batch (22 texts, commit 735e3d6: the commonest pastes, not a search for gaps; written after the "
            "v35 changes)", "rules": "after the v35 changes", "accuracy": 0.8636, "right": "19/22",
     "wrong_cause_claimed": 0, "misses": "3, each answered 'unknown': Colab's 'session crashed after using all "
     "available RAM', a Categorical whose logits were NaN ('constraint IndependentConstraint(Real(), 1), but found "
     "invalid values'), 'store->get('0') got error: Socket Timeout' while setting up the NCCL communicator"},
    {"set": "x35 batch (30 texts, commit fbf9aed: the commonest pastes, written after every rule change of the "
            "branch)", "rules": "current (as at commit fbf9aed)", "accuracy": 1.0, "right": "30/30",
     "wrong_cause_claimed": 0},
]
# The fresh batch scored against the current rules and never tuned on: the target is measured on it. It stays
# unseen only while the rules are as they were when it was scored (commit fbf9aed); a rule change it informs
# needs a new fresh batch here.
UNSEEN_BATCH = "x35 batch"
# Every issue-35 batch, each scored once, unseen, against the rules of its day (right, texts).
ISSUE_35_UNSEEN = {"i35": (8, 10), "u35": (52, 57), "v35": (13, 21), "w35": (19, 22), "x35": (30, 30)}


def texts(split: str) -> list[tuple[str, Path, str]]:
    """(category, path, log) of every text of a split; the first line of a file says where it comes from."""
    root = CORPUS / "heldout" if split == "heldout" else CORPUS
    found = []
    for path in sorted(root.glob("*/*.txt")):
        if split == "tuned" and path.parent.parent.name == "heldout":
            continue
        log = path.read_text(encoding="utf-8").partition("\n")[2]
        found.append((path.parent.name, path, log))
    return found


def score(split: str) -> dict:
    rows = texts(split)
    started = time.perf_counter()
    misses, per_category, per_batch = [], Counter(), Counter()
    for category, path, log in rows:
        got = explain(log).code
        per_category[category, got == category] += 1
        per_batch[batch(path), got == category] += 1
        if got != category:
            misses.append({"text": str(path.relative_to(CORPUS)), "expected": category, "got": got})
    seconds = time.perf_counter() - started
    categories = sorted({category for category, _, _ in rows})
    right = sum(count for (_, ok), count in per_category.items() if ok)
    return {
        "texts": len(rows), "categories": len(categories), "right": right,
        "accuracy": round(right / len(rows), 4),
        "per_category": {c: f"{per_category[c, True]}/{per_category[c, True] + per_category[c, False]}"
                         for c in categories},
        "by_batch": {b: f"{per_batch[b, True]}/{per_batch[b, True] + per_batch[b, False]}"
                     for b in sorted({batch(path) for _, path, _ in rows})},
        "misses": misses, "seconds": round(seconds, 3),
    }


def batch(path: Path) -> str:
    """Which set a text came in: issue 35's ten (i35-*, written before the rules were changed for that issue),
    the 57 of issue 35's second look (u35-*, written before the rules or the earlier texts were read), the 21
    written after the changes the u35 misses led to (v35-*), or the earlier ones."""
    if path.name.startswith(("u35-", "v35-", "w35-", "x35-")):
        return f"{path.name[:3]} batch"
    return "issue 35 batch" if path.name.startswith("i35-") else "earlier"


def unseen(heldout: dict) -> dict:
    """The unseen figure of the current rules (the latest fresh batch, scored live) beside every issue-35 batch
    pooled (each scored once against the rules of its day)."""
    right, texts = map(int, heldout["by_batch"][UNSEEN_BATCH].split("/"))
    pooled_right = sum(r for r, _ in ISSUE_35_UNSEEN.values())
    pooled_texts = sum(t for _, t in ISSUE_35_UNSEEN.values())
    return {"batch": UNSEEN_BATCH, "right": f"{right}/{texts}", "accuracy": round(right / texts, 4),
            "issue_35_pooled": f"{pooled_right}/{pooled_texts} = {pooled_right / pooled_texts:.1%} "
                               + ", ".join(f"{name} {r}/{t}" for name, (r, t) in ISSUE_35_UNSEEN.items()),
            "note": "x35's writer had read the rules (the only batch written blind, u35, scored 91.2%); the pooled "
                    "figure mixes rule versions and includes v35, chosen to lean away from the patterns. Of the "
                    "130 texts of u35-x35, one miss named a wrong cause (u35's GPU checkpoint on a machine "
                    "without a GPU, read as checkpoint_load); every other miss was 'unknown'."}


def long_log() -> dict:
    """Seconds to explain a 50,001-line log (an OOM, then progress lines); tests count its pattern searches."""
    progress = [f"step {i} loss 0.{i % 97:02d} lr 3e-4 grad_norm 1.{i % 7} 1234 samples/s" for i in range(50_000)]
    log = "\n".join(["RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", *progress])
    started = time.perf_counter()
    code = explain(log).code
    return {"lines": len(progress) + 1, "code": code, "seconds": round(time.perf_counter() - started, 3),
            "target_s": LONG_LOG_TARGET_S}


def main() -> None:
    heldout, tuned, long = score("heldout"), score("tuned"), long_log()
    print(f"long log: {long['lines']} lines in {long['seconds']:.2f} s ({long['code']})")
    for name, result in (("held-out", heldout), ("tuned", tuned)):
        print(f"{name}: {result['right']}/{result['texts']} = {result['accuracy']:.1%} {result['by_batch']}")
        for miss in result["misses"]:
            print(f"  miss {miss['text']}: {miss['got']}")
    figure = unseen(heldout)
    print(f"unseen ({figure['batch']}): {figure['right']}; issue 35 pooled: {figure['issue_35_pooled']}")
    write_result("explain", {
        "description": "explain names the right category of crash texts; the target counts the latest fresh "
                       "batch only (written for it, scored against the current rules, never tuned on). The "
                       "held-out split as a whole holds batches whose misses were since fixed, so its accuracy "
                       "is no unseen figure.",
        "target": f"the unseen batch's accuracy >= {TARGET:.0%}; a 50,001-line log in < {LONG_LOG_TARGET_S:g} s",
        "heldout": heldout, "tuned": tuned, "long_log": long, "unseen": figure,
        "meets_targets": figure["accuracy"] >= TARGET and long["code"] == "cuda_oom"
                         and long["seconds"] < LONG_LOG_TARGET_S,
        "history": HISTORY,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "issue_35": "The ten issue-35 texts scored 8/10 with the rules as they were (missed: a progress table whose "
                    "loss columns read nan; 'ProcessGroupNCCL ... no GPUs found'). Those two misses were seen "
                    "before the rules changed; the changes are general patterns (nan loss columns, a printed loss "
                    "tensor, 'no GPUs found' / 'CUDA is not available', a timeout named beside its collective, a "
                    "DistBackendError that timed out is a timeout, not an NCCL error), but the batch's 10/10 "
                    "afterwards is not an unseen figure: 8/10 is. The 47 earlier texts were not read.",
        "u35_batch": "57 texts (u35-*) written for issue 35 before explain's rules or any earlier text were read. "
                     "Unseen figure: 52/57 = 91.2% with the rules as merged (history). Its five misses led to "
                     "general patterns (a scheduler's or shell's report of a memory kill, a rank that cannot "
                     "reach the rendezvous, a GPU checkpoint loaded without a GPU is no_gpu_visible, samples of "
                     "different lengths batched without padding), each tested on other texts in "
                     "tests/diagnose/test_explain_general_patterns.py; the batch's figure after those changes "
                     "(by_batch above) is therefore not unseen.",
        "v35_batch": "21 texts (v35-*) written after the u35 changes, committed before they were scored. Unseen "
                     "figure: 13/21 = 61.9%, every miss 'unknown' (history). Their writer had read the rules and "
                     "chose wordings away from them, so this measures gaps, not a typical mix of logs. The "
                     "misses led to general patterns (tested on other texts in test_explain_general_patterns.py); "
                     "the batch's figure after them is not unseen.",
        "w35_batch": "22 texts (w35-*): the commonest pastes, written after the v35 changes, committed before they "
                     "were scored. Unseen figure: 19/22 = 86.4%, every miss 'unknown' (history); the last unseen "
                     "figure this branch measured. Its three misses led to general patterns (a notebook's 'used "
                     "all available RAM', NaN reaching a distribution whatever its constraint, a store->get "
                     "timeout while ranks exchange the NCCL id); 22/22 after them is not unseen.",
        "note": "timings are on a 2-core machine shared by other jobs; the tuned and held-out texts were written "
                "by the same person, so the held-out figure is evidence, not proof, of accuracy on strangers' logs",
    })


if __name__ == "__main__":
    main()
