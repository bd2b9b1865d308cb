"""Records a reader lets through but no trainer writes (hand-edited, foreign, from older versions) never
crash a diagnosis: the rules skip what they cannot use."""
from __future__ import annotations

import math
import random

from trainwise.diagnose.run_rules import RunFacts, diagnose, live_findings

ODD_VALUES = [None, True, "0.5", [], {}, -1.0, 0.0, 1e308, float("nan"), float("inf"), -float("inf"), 3, 10**30]


def test_odd_values_in_every_field_are_skipped_not_fatal():
    rng = random.Random(0)
    for trial in range(40):
        metrics = []
        for step in range(1, 60):
            record = {"split": rng.choice(["train", "val", "test", "weird"]), "step": step}
            for key in ("loss", "lr", "grad_norm", "data_wait_fraction", "data_wait_s", "compute_s",
                        "samples_per_s", "step_time_s", "cuda_allocated_bytes", "accuracy"):
                if rng.random() < 0.7:
                    record[key] = rng.choice(ODD_VALUES + [rng.random(), math.exp(-step / 20)])
            metrics.append(record)
        system = [{"time": float(i), "step": rng.choice([i, None, "x", True]),
                   "gpus": rng.choice([None, 3, "gpu", {"index": 0}, [1, "a"],
                                       [{"index": 0, "temperature_c": rng.choice(ODD_VALUES + [95]),
                                         "utilization_pct": rng.choice(ODD_VALUES + [10.0]),
                                         "memory_used_bytes": rng.choice(ODD_VALUES + [i * 2**30]),
                                         "throttle_reasons": rng.choice([None, "hw_slowdown", ["hw_slowdown", 3, []]]),
                                         "name": rng.choice([None, 7, "NVIDIA H100"])}]]),
                   "ram_used_bytes": rng.choice(ODD_VALUES + [i * 2**30])} for i in range(30)]
        events = [{"kind": "x", "message": "Xid 79", "step": None, "severity": "error"}]
        summary = rng.choice([{}, {"device": 3, "precision": None}, {"device": "cuda:0", "precision": "fp32",
                                                                     "max_steps": "many"}])
        findings = diagnose(RunFacts(metrics=metrics, events=events, system=system, summary=summary))
        assert all(f.code and f.title for f in findings), trial
        live_findings(metrics, system)


def test_a_run_with_nothing_recorded_yet_has_no_findings():
    # the report of a run that has just started still renders: an empty Diagnosis section
    assert diagnose(RunFacts(metrics=[])) == [] and live_findings([]) == []
