"""The doctor's decisions: pure functions from `Facts` to `Finding`s, software first, then hardware.

    run_checks(facts) -> [Finding, ...]   # Python, PyTorch build, GPU visibility, driver vs CUDA, kernels,
                                          # capabilities, install guidance, then host, disk and GPU health,
                                          # then a job of several ranks (distributed.py)

Each is a `trainwise.findings.Finding`: `code` names the check (stable, for scripts), `title` says what was
checked ("GPU 0 temperature"), `detail` what was found; severity info means the check passed.
"""
from __future__ import annotations

from trainwise.config import TelemetryConfig
from trainwise.data.disk import disk_findings
from trainwise.doctor.distributed import distributed_findings
from trainwise.doctor.facts import Facts
from trainwise.findings import Finding
from trainwise.doctor.gpu_health import gpu_health_findings
from trainwise.doctor.host import host_findings
from trainwise.doctor.install import (driver_for, driver_install_steps, parse_version,
                                      pick_torch_wheel, torch_install_command)

MIN_PYTHON = (3, 10)


def run_checks(facts: Facts, thresholds: TelemetryConfig | None = None) -> list[Finding]:
    """Every finding about this machine, in the order a person should fix them."""
    thresholds = thresholds or TelemetryConfig()
    findings = [python_environment(facts), versions(facts), package_conflicts(facts), torch_build(facts),
                gpu_visibility(facts), driver_vs_cuda(facts), *gpu_kernels(facts), *capabilities(facts),
                peer_access(facts), all_reduce(facts), install_guidance(facts)]
    findings += host_findings(facts.host, gpus=_gpu_count(facts),
                              gpu_memory_bytes=sum(g.memory_total_bytes or 0 for g in facts.nvml.gpus))
    findings += [data_directory(facts), *disk_findings(facts.disk)]
    findings += gpu_health_findings(facts.nvml.gpus, thresholds)
    findings += distributed_findings(facts)  # with --nproc, or inside a launched job
    return [f for f in findings if f is not None]


# ---- the data directory ----------------------------------------------------------------------------
def data_directory(f: Facts) -> Finding | None:
    """`--data-dir` that does not exist (a typo?): the disk checks below are about its nearest existing parent."""
    d = f.disk
    if d.exists:
        return None
    return Finding("data_directory", "warn", "Data directory",
                   f"{d.path} does not exist; the disk checks below are for "
                   f"{d.probed_path}, the nearest existing directory above it",
                   {"path": d.path, "probed_path": d.probed_path},
                   f"Check the spelling, or create it: `mkdir -p {d.path}` (`trainwise prepare --to` creates it "
                   "too).")


# ---- Python ----------------------------------------------------------------------------------------
def python_environment(f: Facts) -> Finding:
    p = f.python
    evidence = {"executable": p.executable, "prefix": p.prefix, "base_prefix": p.base_prefix,
                "conda_prefix": p.conda_prefix}
    if p.in_venv:
        return Finding("python_environment", "info", "Python environment",
                       f"running in the virtual environment {p.prefix}", evidence)
    if p.conda_prefix:
        return Finding("python_environment", "info", "Python environment",
                       f"running in the conda environment {p.conda_prefix}", evidence)
    return Finding("python_environment", "warn", "Python environment",
                   f"running on the system interpreter {p.executable}: "
                   "pip installs here can break OS tools and other projects", evidence,
                   "python3 -m venv .venv && . .venv/bin/activate && pip install trainwise")


def versions(f: Facts) -> Finding:
    p, t = f.python, f.torch
    evidence = {"python": p.version, "torch": t.version, "numpy": p.numpy_version}
    line = f"Python {p.version}, torch {t.version or 'not installed'}, numpy {p.numpy_version or 'not installed'}"
    python = parse_version(p.version)
    if python is not None and python < MIN_PYTHON:
        return Finding("versions", "error", "Versions", f"{line}: trainwise needs Python ≥ 3.10", evidence,
                       "Create the environment with a newer Python, e.g. `uv venv --python 3.11 .venv`.")
    if not t.installed:
        return Finding("versions", "error", "Versions",
                       f"{line}: torch is not installed", evidence, torch_install_command(
            _wheel_for(f)))
    torch_version, numpy_version = parse_version(t.version), parse_version(p.numpy_version)
    if torch_version and numpy_version and numpy_version[0] >= 2 and torch_version < (2, 3):
        return Finding("versions", "error", "Versions",
                       f"{line}: torch < 2.3 was built against NumPy 1.x and fails with "
                       "NumPy 2 (\"A module that was compiled using NumPy 1.x cannot be run in NumPy 2\")",
                       evidence, 'pip install "numpy<2"')
    return Finding("versions", "info", "Versions", line, evidence)


def package_conflicts(f: Facts) -> Finding | None:
    p = f.python
    if not p.pip_check_ran:
        return None
    if not p.pip_conflicts:
        return Finding("package_conflicts", "info", "Package conflicts", "`pip check` finds no broken requirements", {})
    fixes = []
    for line in p.pip_conflicts:  # "a 1.0 requires b, which is not installed." / "a 1.0 has requirement b>=2, ..."
        if " requires " in line and "which is not installed" in line:
            fixes.append(line.split(" requires ", 1)[1].split(",", 1)[0].strip())
        elif " has requirement " in line:
            fixes.append(line.split(" has requirement ", 1)[1].split(", but", 1)[0].strip())
    fix = "pip install " + " ".join(f'"{spec}"' for spec in fixes) if fixes else "pip check  # and reinstall what it names"
    return Finding("package_conflicts", "warn", "Package conflicts",
                   f"`pip check` reports {len(p.pip_conflicts)} broken "
                   f"requirement(s): {p.pip_conflicts[0]}", {"pip_check": p.pip_conflicts}, fix)


# ---- PyTorch build and the GPUs it sees ------------------------------------------------------------------
def torch_build(f: Facts) -> Finding | None:
    t = f.torch
    if not t.installed:
        return None
    evidence = {"torch": t.version, "cuda": t.cuda, "hip": t.hip, "cudnn": t.cudnn_version,
                "nccl_available": t.nccl_available, "nccl": t.nccl_version}
    if t.hip:
        return Finding("torch_build", "info", "PyTorch build", f"ROCm build (HIP {t.hip})", evidence)
    if t.cuda is None:
        return Finding("torch_build", "info", "PyTorch build", f"CPU build of torch {t.version} (no CUDA)", evidence)
    line = f"CUDA {t.cuda} build, cuDNN {_cudnn_text(t.cudnn_version)}, NCCL {t.nccl_version or 'absent'}"
    if t.cudnn_version is None and t.cuda_available:
        return Finding("torch_build", "warn", "PyTorch build",
                       f"{line}: cuDNN cannot be loaded, convolutions will be slow "
                       "or fail", evidence, torch_install_command(_wheel_for(f)))
    if not t.nccl_available and _gpu_count(f) >= 2:
        return Finding("torch_build", "warn", "PyTorch build",
                       f"{line}: no NCCL, so multi-GPU training falls back to gloo "
                       "(much slower)", evidence, torch_install_command(_wheel_for(f)))
    return Finding("torch_build", "info", "PyTorch build", line, evidence)


def gpu_visibility(f: Facts) -> Finding:
    t, n, h = f.torch, f.nvml, f.host
    nvml_count = len(n.gpus) if n.available else 0
    evidence = {"nvml_gpus": nvml_count, "torch_gpus": t.device_count, "nvml_error": n.error,
                "pci_nvidia_devices": h.nvidia_pci_devices, "CUDA_VISIBLE_DEVICES": h.cuda_visible_devices,
                "torch_cuda": t.cuda, "torch_error": t.cuda_error}
    code, title = "gpu_visibility", "GPU visibility"
    if nvml_count == 0 and h.nvidia_pci_devices == 0:
        if t.device_count:
            return Finding(code, "info", title, f"torch sees {t.device_count} GPU(s)", evidence)
        return Finding(code, "info", title, "no NVIDIA GPU on this machine: training runs on the CPU", evidence)
    if nvml_count == 0:
        return Finding(code, "error", title, f"{h.nvidia_pci_devices} NVIDIA GPU(s) on the PCI bus but no working "
                       f"driver ({n.error})", evidence, driver_install_steps(h.os_id, h.os_version_id, h.machine))
    if not t.installed:
        return Finding(code, "error", title, f"{nvml_count} GPU(s) present but torch is not installed", evidence,
                       torch_install_command(_wheel_for(f)))
    if t.cuda is None and not t.hip:
        return Finding(code, "error", title, f"{nvml_count} NVIDIA GPU(s) present, but this is the CPU build of torch "
                       f"{t.version} (\"Torch not compiled with CUDA enabled\")", evidence,
                       f"pip uninstall -y torch && {torch_install_command(_wheel_for(f))}")
    cvd = h.cuda_visible_devices
    if t.device_count == 0 and cvd is not None and cvd.strip() in ("", "-1", "none", "NoDevFiles"):
        return Finding(code, "error", title, f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU from torch", evidence,
                       "unset CUDA_VISIBLE_DEVICES   # or: export CUDA_VISIBLE_DEVICES=0")
    if t.device_count == 0:
        driver, built = parse_version(n.cuda_driver_version), parse_version(t.cuda)
        if driver and built and driver[0] < built[0]:
            return Finding(code, "error", title,
                           f"torch cannot use the GPU: the driver supports CUDA {n.cuda_driver_version}"
                           f", torch was built for CUDA {t.cuda} (driver too old)", evidence, _driver_fix(f))
        return Finding(code, "error", title, f"NVML sees {nvml_count} GPU(s) but torch sees none: "
                       f"{t.cuda_error or 'CUDA failed to initialise'}", evidence,
                       "nvidia-smi && python -c 'import torch; torch.cuda.init()'   # shows the full error")
    if t.device_count < nvml_count:
        if cvd:
            return Finding(code, "info", title, f"torch sees {t.device_count} of {nvml_count} GPUs "
                           f"(CUDA_VISIBLE_DEVICES={cvd})", evidence)
        return Finding(code, "warn", title, f"torch sees {t.device_count} of {nvml_count} GPUs", evidence,
                       "nvidia-smi -L   # compare with torch.cuda.device_count(); check the container's --gpus")
    return Finding(code, "info", title, f"torch sees all {t.device_count} GPU(s)", evidence)


def driver_vs_cuda(f: Facts) -> Finding | None:
    t, n = f.torch, f.nvml
    driver, built = parse_version(n.cuda_driver_version), parse_version(t.cuda)
    if not n.available or driver is None or built is None:
        return None
    evidence = {"driver": n.driver_version, "driver_max_cuda": n.cuda_driver_version, "torch_cuda": t.cuda,
                "driver_needed": driver_for(built)}
    code, title = "driver_vs_cuda", "Driver vs CUDA"
    if driver >= built:
        return Finding(code, "info", title,
                       f"driver {n.driver_version} supports CUDA {n.cuda_driver_version} ≥ torch's "
                       f"CUDA {t.cuda}", evidence)
    if driver[0] < built[0]:
        return Finding(code, "error", title, f"driver too old: driver {n.driver_version} supports up to CUDA "
                       f"{n.cuda_driver_version}, torch was built for CUDA {t.cuda}", evidence, _driver_fix(f))
    return Finding(code, "warn", title,
                   f"driver {n.driver_version} (CUDA {n.cuda_driver_version}) is older than torch's "
                   f"CUDA {t.cuda}: it runs by minor-version compatibility, but kernels compiled at run time "
                   "(PTX JIT) fail", evidence, _driver_fix(f))


def gpu_kernels(f: Facts) -> list[Finding]:
    """Each card's compute capability against the architectures the torch wheel was compiled for."""
    arch = f.torch.arch_list
    if not arch:
        return []
    findings = []
    for index, name, cc in _cards(f):
        evidence = {"gpu": index, "name": name, "compute_capability": f"{cc[0]}.{cc[1]}", "arch_list": arch}
        if has_kernels(cc, arch):
            continue
        wheel = pick_torch_wheel(parse_version(f.nvml.cuda_driver_version), [cc])
        fix = (torch_install_command(wheel) if wheel else
               f"No current PyTorch wheel supports compute capability {cc[0]}.{cc[1]}: use an older torch "
               "(1.12 with cu113 for Kepler) or train on the CPU.")
        findings.append(Finding("gpu_kernels", "error", "GPU kernels",
                                f"GPU {index} ({name}, sm_{cc[0]}{cc[1]}) has no kernels in "
                                f"this torch build (built for {', '.join(arch)}): expect \"no kernel image is "
                                "available for execution on the device\"", evidence, fix))
    if not findings:
        findings.append(Finding("gpu_kernels", "info", "GPU kernels",
                                f"torch has kernels for every card ({', '.join(arch)})",
                                {"arch_list": arch, "cards": [f"{c[0]}.{c[1]}" for _, _, c in _cards(f)]}))
    return findings


def has_kernels(cc: tuple[int, int], arch_list: list[str]) -> bool:
    """True when a card of capability `cc` can run this build: a cubin of the same major version and no newer
    minor (sm_80 code runs on an 8.6 card), or PTX (compute_XY) at or below the card, JIT-compiled."""
    for entry in arch_list:
        kind, _, digits = entry.partition("_")
        digits = digits.rstrip("af")  # sm_90a / sm_100f: arch-specific builds of the same major
        if not digits.isdigit() or len(digits) < 2:
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "sm" and built[0] == cc[0] and built[1] <= cc[1]:
            return True
        if kind == "compute" and built <= cc:
            return True
    return False


def capabilities(f: Facts) -> list[Finding]:
    """bf16 and TF32 support, one finding per kind of card."""
    groups: dict[tuple[str, tuple[int, int]], list[int]] = {}
    for index, name, cc in _cards(f):
        groups.setdefault((name, cc), []).append(index)
    findings = []
    tf32_on = f.torch.tf32_matmul or f.torch.float32_matmul_precision in ("high", "medium")
    for (name, cc), indexes in groups.items():
        who = f"{len(indexes)} × {name}" if len(indexes) > 1 else f"GPU {indexes[0]} ({name})"
        evidence = {"gpus": indexes, "compute_capability": f"{cc[0]}.{cc[1]}", "bf16": cc >= (8, 0),
                    "tf32": cc >= (8, 0), "tf32_enabled": tf32_on}
        if cc < (8, 0):
            findings.append(Finding("precision", "info", "Precision", f"{who}: no bf16 or TF32 (compute capability "
                                    f"{cc[0]}.{cc[1]}); mixed precision uses fp16 with loss scaling", evidence))
        elif tf32_on:
            findings.append(Finding("precision", "info", "Precision",
                                    f"{who}: bf16 and TF32 supported, TF32 enabled", evidence))
        else:
            findings.append(Finding("precision", "info", "Precision",
                                    f"{who}: bf16 and TF32 supported; TF32 is off (torch's "
                                    "default), so fp32 matmuls run at full fp32 cost", evidence,
                                    "Train in bf16 (train.precision=bf16), or for fp32 runs call "
                                    "torch.set_float32_matmul_precision('high')."))
    return findings


def peer_access(f: Facts) -> Finding | None:
    matrix = f.torch.peer_access
    if not matrix or len(matrix) < 2:
        return None
    missing = [(i, j) for i, row in enumerate(matrix) for j, ok in enumerate(row) if i < j and not (ok and matrix[j][i])]
    evidence = {"peer_access": matrix}
    if not missing:
        return Finding("peer_access", "info", "Peer access",
                       f"all {len(matrix)} GPUs can access each other directly (P2P)", evidence)
    pairs = ", ".join(f"{i}↔{j}" for i, j in missing)
    return Finding("peer_access", "warn", "Peer access",
                   f"no direct P2P between GPUs {pairs}: all-reduce goes through host "
                   "memory and multi-GPU training slows down", evidence,
                   "nvidia-smi topo -m   # shows the links; in VMs enable P2P/ACS passthrough. If NCCL hangs: "
                   "export NCCL_P2P_DISABLE=1")


def all_reduce(f: Facts) -> Finding | None:
    result = f.torch.all_reduce
    if result is None:
        return None
    evidence = {"backend": result.backend, "world_size": result.world_size, "seconds": result.seconds,
                "error": result.error}
    if result.ok:
        return Finding("all_reduce", "info", "All-reduce",
                       f"{result.backend} all-reduce over {result.world_size} GPUs works "
                       f"({result.seconds:.1f} s including start-up)", evidence)
    return Finding("all_reduce", "error", "All-reduce",
                   f"{result.backend} all-reduce over {result.world_size} GPUs failed: "
                   f"{result.error}", evidence,
                   f"NCCL_DEBUG=INFO python -m trainwise.doctor.smoke --world-size {result.world_size} "
                   "--backend nccl   # then try NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1")


def install_guidance(f: Facts) -> Finding:
    h, n, t = f.host, f.nvml, f.torch
    gpu_present = bool(n.gpus) or h.nvidia_pci_devices > 0
    os_text = f"{h.os_name or h.os_id or 'unknown OS'} {h.machine}"
    if not gpu_present:
        return Finding("install_guidance", "info", "Install guidance",
                       f"{os_text}, no NVIDIA GPU: the CPU build of torch is the right "
                       "one", {"torch_command": torch_install_command("cpu")})
    wheel = _wheel_for(f)
    driver_steps = driver_install_steps(h.os_id, h.os_version_id, h.machine)
    evidence = {"os": os_text, "driver": n.driver_version, "driver_max_cuda": n.cuda_driver_version,
                "torch_wheel": wheel, "torch_command": torch_install_command(wheel), "driver_steps": driver_steps}
    needs_driver = not n.available or _driver_too_old(f)
    needs_torch = t.installed is False or (t.cuda is None and not t.hip)
    if needs_driver or needs_torch:
        steps = [driver_steps] if needs_driver else []
        steps += [torch_install_command(wheel)]
        return Finding("install_guidance", "warn", "Install guidance",
                       f"{os_text}: install the driver from NVIDIA's repository, then "
                       f"the torch wheel {wheel or '(none fits these cards)'}", evidence, "  &&  ".join(steps))
    return Finding("install_guidance", "info", "Install guidance",
                   f"{os_text}: torch's CUDA {t.cuda or t.hip} fits driver "
                   f"{n.driver_version} (CUDA {n.cuda_driver_version}); the wheel to reinstall is {wheel}", evidence)


# ---- shared facts ---------------------------------------------------------------------------------------
def _cards(f: Facts) -> list[tuple[int, str, tuple[int, int]]]:
    """(index, name, compute capability) of every card, from torch when it sees them, else from NVML."""
    if f.torch.devices:
        return [(d.index, d.name, tuple(d.capability)) for d in f.torch.devices]
    return [(g.index, g.name, tuple(g.compute_capability)) for g in f.nvml.gpus if g.compute_capability]


def _gpu_count(f: Facts) -> int:
    return max(len(f.nvml.gpus), f.torch.device_count)


def _wheel_for(f: Facts) -> str | None:
    if not f.nvml.gpus and f.host.nvidia_pci_devices == 0:
        return "cpu"
    return pick_torch_wheel(parse_version(f.nvml.cuda_driver_version), [cc for _, _, cc in _cards(f)])


def _driver_too_old(f: Facts) -> bool:
    driver, built = parse_version(f.nvml.cuda_driver_version), parse_version(f.torch.cuda)
    return bool(driver and built and driver < built)


def _driver_fix(f: Facts) -> str:
    built = parse_version(f.torch.cuda)
    needed = driver_for(built) if built else None
    steps = driver_install_steps(f.host.os_id, f.host.os_version_id, f.host.machine)
    wheel = pick_torch_wheel(parse_version(f.nvml.cuda_driver_version), [cc for _, _, cc in _cards(f)])
    alternative = f"; or keep the driver and install a torch for it: {torch_install_command(wheel)}" if (
        wheel and wheel != f"cu{f.torch.cuda.replace('.', '')}") else ""
    return f"Upgrade the driver to ≥ {needed or 'the newest'}: {steps}{alternative}"


def _cudnn_text(version: int | None) -> str:
    if version is None:
        return "absent"
    # 90100 -> 9.1.0 (cuDNN ≥ 9), 8902 -> 8.9.2
    if version >= 10000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"
