"""Shared by every benchmark: describe the machine, write benchmarks/results/NAME.json atomically."""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import psutil
    import torch

    from trainwise.plan.probe import read_machine

    info = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": read_machine().cpu_model,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    record = {"benchmark": name, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(), **payload}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path}")
    return path
