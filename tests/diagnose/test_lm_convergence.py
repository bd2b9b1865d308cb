"""A language model's normal curve is not "flat" (issue 35): its loss is judged as the perplexity it stands for,
and a curve that learnt during warmup and keeps falling as a cosine LR decays is levelling off, not stuck. A
language model that learns nothing is still named."""
from __future__ import annotations

import math
import random

import pytest

from trainwise.diagnose.convergence import convergence_findings
from trainwise.diagnose.curves import loss_drop
from trainwise.diagnose.task_profile import language_model_profile, classification_profile

WARMUP, STEPS, EVERY = 100, 2000, 50


def cosine_lr(step: int, peak: float = 1e-3) -> float:
    if step <= WARMUP:
        return peak * step / WARMUP
    done = (step - WARMUP) / (STEPS - WARMUP)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def lm_records(loss_at, noise: float = 0.02, seed: int = 0) -> list[dict]:
    """Train logs every EVERY steps of a 2,000-step cosine run with 100 warmup steps, and validation at the end."""
    rng = random.Random(seed)
    records = [{"split": "train", "step": s, "epoch": 0, "loss": loss_at(s) + rng.gauss(0, noise),
                "lr": cosine_lr(s), "grad_norm": 0.5} for s in range(EVERY, STEPS + 1, EVERY)]
    records.append({"split": "val", "step": STEPS, "epoch": 0, "loss": loss_at(STEPS), "perplexity": 20.0})
    return records


def codes(records, task) -> list[str]:
    return [f.code for f in convergence_findings(records, warmup_steps=WARMUP, task=task)]


def test_a_fine_tune_falling_8_percent_in_nats_is_not_flat():
    # a pretrained model continued on new text: 3.05 -> 2.78 nats after warmup (9%), perplexity 21 -> 16
    curve = lm_records(lambda s: 2.75 + 0.35 * math.exp(-s / 700))
    start, end = curve[2]["loss"], curve[-2]["loss"]
    assert (start - end) / start < 0.10  # what the old rule measured
    task = language_model_profile(49_152)
    assert "loss_flat" not in codes(curve, task)
    assert loss_drop(3.0, 2.75, perplexity=True) == pytest.approx(1 - math.exp(-0.25))


def test_a_from_scratch_curve_that_learnt_in_warmup_and_levels_off_at_the_cosine_tail_is_not_flat():
    # byte-level from scratch: ln 257 = 5.55 at the start, most of the fall inside the warmup, then a slow,
    # steady fall of 4% in nats as the LR decays
    curve = lm_records(lambda s: 1.60 + 3.9 * math.exp(-s / 25) + 0.08 * (1 - s / STEPS), noise=0.01)
    assert "loss_flat" not in codes(curve, language_model_profile(257))


def test_a_language_model_that_learns_nothing_is_still_flat():
    curve = lm_records(lambda s: 5.55 - 0.00001 * s, noise=0.02)  # LR far too low: chance all run
    found = convergence_findings(curve, warmup_steps=WARMUP, task=language_model_profile(257))
    assert [f.code for f in found] == ["loss_flat"]
    assert found[0].title.startswith("train perplexity is flat") and found[0].evidence["measured_on"] == "perplexity"


def test_a_plateau_after_warmup_with_jitter_is_still_flat_for_a_classifier():
    # learnt in warmup, then not at all: jitter, no steady fall
    curve = lm_records(lambda s: 1.2 if s > WARMUP else 2.3, noise=0.03)
    assert "loss_flat" in codes(curve, classification_profile(10))
