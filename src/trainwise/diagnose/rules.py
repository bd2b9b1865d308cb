"""The table `explain` reads: for each failure category, the log lines that show it, the cause in plain words
and the fixes, simplest first.

Patterns are exact phrases PyTorch, CUDA, NCCL, the driver and other trainers print (tests/diagnose/corpus holds
real logs with their source and texts in other tools' wording; corpus/heldout is never tuned on, see
benchmarks/explain.py). A pattern must name the failure itself, never something a
healthy run also prints, because a match is a diagnosis. A rule's patterns are tried only on lines
holding one of its keywords, so every pattern must contain one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """A more specific reading of a rule, taken when one of its patterns shows anywhere in the log."""
    patterns: tuple[re.Pattern[str], ...]
    title: str
    cause: str
    fixes: tuple[str, ...]
    exclusive: bool = False
    """Taken only when exactly one of its patterns shows: for the two sides of a comparison, where both
    showing means something else (missing AND unexpected keys with `module.` is not a prefix problem)."""


@dataclass(frozen=True)
class Rule:
    code: str
    """The category id `explain --json` prints; several rules may share one."""
    title: str
    cause: str
    fixes: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]
    keywords: tuple[str, ...]
    """Lower-case words one of which every matching line contains: a cheap test that spares the patterns
    the thousands of progress lines of a long log (tests check each pattern holds one)."""
    fallout: bool = False
    """A symptom other failures cause (a collective timing out because a rank died): it is the diagnosis
    only when no other rule matched anywhere in the log."""
    variants: tuple[Variant, ...] = ()


def patterns(*texts: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(text) for text in texts)


def variant(texts: tuple[str, ...], title: str, cause: str, *fixes: str, exclusive: bool = False) -> Variant:
    return Variant(patterns(*texts), title, cause, fixes, exclusive)


LAUNCH_BLOCKING = "Re-run with `CUDA_LAUNCH_BLOCKING=1` (or on the CPU) so the traceback stops at the op that fails."

ENVIRONMENT_RULES: tuple[Rule, ...] = (
    # /dev/shm before host RAM and disk: "unable to write to file </torch_…>: No space left on device" is
    # shared memory, although it also reads like a full disk.
    Rule(
        "shm_too_small", "Shared memory (/dev/shm) too small",
        "DataLoader workers hand each batch to the training process through shared memory (/dev/shm). It "
        "filled up, so a worker died with a bus error or could not write its batch. Docker gives a container "
        "only 64 MB of /dev/shm unless told otherwise.",
        ("See how big it is: `df -h /dev/shm` (`trainwise doctor` checks it too).",
         "In Docker start the container with `--ipc=host` or `--shm-size=16g`; in Kubernetes mount an "
         "`emptyDir` with `medium: Memory` at /dev/shm.",
         "Use fewer DataLoader workers or smaller batches (trainwise: `data.num_workers=2`); "
         "`data.num_workers=0` needs no shared memory, at the cost of speed."),
        patterns(r"killed by signal: Bus error", r"insufficient shared memory \(shm\)",
                 r"unable to (?:write to file|open shared memory object|mmap \d+ bytes from file) </torch_",
                 r"^(?!.*NCCL WARN).*(?:/dev/shm.*No space left on device|No space left on device.*/dev/shm)"),
        keywords=("bus error", "shm", "torch_", "memory"),
    ),
    Rule(
        "cpu_oom_killed", "Host RAM ran out: a process was killed",
        "The machine's memory (RAM, not the GPU's) ran out: the kernel's out-of-memory killer sent SIGKILL "
        "(signal 9, exit code -9/137) to a training or DataLoader process, or a CPU allocation failed. Every "
        "worker process holds its own copy of the dataset object and its prefetched batches, so many workers "
        "over an in-memory dataset multiply the RAM needed. A job scheduler enforcing a memory limit also "
        "kills with SIGKILL.",
        ("Confirm it was memory: `sudo dmesg -T | grep -i -E 'out of memory|killed process'`.",
         "Use fewer DataLoader workers (trainwise: `data.num_workers=2`) or a smaller `prefetch_factor`.",
         "Keep the data on disk and read it per item instead of loading it into every process "
         "(`trainwise prepare` writes memory-mapped shards that are read without per-worker copies).",
         "Under Slurm or Kubernetes, ask for more memory (`--mem=64G`, `resources.limits.memory`)."),
        patterns(r"is killed by signal: Killed", r"(?i:out of memory: kill(?:ed)? process)", r"invoked oom-killer",
                 r"exitcode\s*:\s*-9\b", r"Signal 9 \(SIGKILL\) received by PID",
                 r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)",
                 r"(?<![A-Za-z])(?:_Array)?MemoryError\b", r"^\s*Killed\s*$",
                 # Slurm ("oom_kill event", "OOM Killed"), Kubernetes ("OOMKilled"), a shell's job report
                 # ("line 19: 40718 Killed   python train.py"), 137 = 128 + SIGKILL
                 r"(?i:\boom[ _-]?kill(?:ed|er)?\b)", r"\b\d+ Killed\s{2,}\S",
                 r"(?i:\bexit(?:ed)?(?: with)?(?: status| code)?:? ?137\b)",
                 r"(?i:\b(?:used|using) all (?:the )?available (?:RAM|system memory|host memory)\b)",   # Colab
                 r"\[Errno 12\] Cannot allocate memory"),   # fork() of a DataLoader worker, os calls
        keywords=("kill", "exitcode", "alloc", "memory", "137", "all available", "all the available"),
    ),
    Rule(
        "cuda_oom", "GPU out of memory",
        "The GPU ran out of memory: the weights, gradients, optimizer state and the activations of one "
        "micro-batch did not fit. The error line says how much was asked for and how much was free; memory "
        "held by another process on the same GPU counts against you too.",
        ("Halve the batch per step and accumulate to keep the effective batch (trainwise: "
         "`train.micro_batch_size=<half of train.batch_size>`).",
         "Use mixed precision (trainwise: `train.precision=bf16`, or `auto`) and activation checkpointing "
         "(`model.gradient_checkpointing=true`).",
         "Check what fits before running: `trainwise plan RECIPE` estimates peak memory per batch size.",
         "Look for other processes on the GPU with `nvidia-smi`; if reserved memory is much larger than "
         "allocated, set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`."),
        patterns(r"(?i:CUDA out of memory)", r"CUDA error: out of memory", r"(?i:Cuda failure '?out of memory)",
                 r"\bOutOfMemoryError\b", r"CUBLAS_STATUS_ALLOC_FAILED", r"cudaErrorMemoryAllocation",
                 r"(?i:HIP out of memory)"),   # ROCm's wording
        keywords=("memory", "alloc"),
    ),
    Rule(
        "checkpoint_load", "Checkpoint could not be loaded",
        "The saved state does not match the model it is loaded into: a different architecture or "
        "configuration, or modules renamed since it was saved.",
        ("Compare the names: `print(list(state)[:5], list(model.state_dict())[:5])`.",
         "Build the model with the configuration the checkpoint was trained with.",
         "Pass `strict=False` only when the difference is intended, and read the missing/unexpected keys it "
         "returns."),
        patterns(r"Error\(s\) in loading state_dict",
                 # "key(s) in state_dict" (load_state_dict), "key in checkpoint state_dict" (distributed.checkpoint)
                 r"(?:Missing|Unexpected) keys?(?:\(s\))? in (?:checkpoint )?state_dict",
                 r"Unable to load weights from (?:pytorch |PyTorch )?checkpoint file",
                 r"size mismatch for [\w.]+: copying a param with shape", r"Weights only load failed",
                 r"WeightsUnpickler error", r"PytorchStreamReader failed", r"invalid load key",
                 r"unexpected key \"module\.",
                 r"SafetensorError: Error while deserializing"),
        keywords=("state_dict", "mismatch", "weights", "pytorchstream", "deserializ", "key"),
        variants=(
            variant((r"Unexpected key\(s\) in state_dict: \"(?:state_dict|model|model_state_dict|net|module)\"",),
                    "Checkpoint wraps the state dict in another dict",
                    "The file holds a dict with the weights under a key (`state_dict`, `model`, ...) next to "
                    "other things (optimizer, epoch), and that outer dict was passed to `load_state_dict`.",
                    "Load the inner dict: `model.load_state_dict(torch.load(path)['state_dict'])` (the key "
                    "is the one quoted as unexpected)."),
            variant((r"Missing key\(s\) in state_dict: \"(?:module|_orig_mod)\.",
                     r"Unexpected key\(s\) in state_dict: \"(?:module|_orig_mod)\.", r"unexpected key \"module\."),
                    "State dict keys differ by a `module.` prefix",
                    "The checkpoint was saved from a wrapped model (DataParallel/DistributedDataParallel add "
                    "`module.` to every key, torch.compile adds `_orig_mod.`) and loaded into an unwrapped "
                    "one, or the other way round.",
                    "Strip the prefix before loading: `torch.nn.modules.utils."
                    "consume_prefix_in_state_dict_if_present(state, 'module.')` (or `'_orig_mod.'`).",
                    "Save the inner model from now on: `torch.save(model.module.state_dict(), path)`.",
                    exclusive=True),
            variant((r"Weights only load failed", r"WeightsUnpickler error"),
                    "torch.load refused the file (weights_only)",
                    "Since PyTorch 2.6 `torch.load` defaults to `weights_only=True` and refuses checkpoints "
                    "that contain Python objects other than tensors and plain containers (optimizer "
                    "classes, numpy scalars, argparse Namespaces).",
                    "If you trust the file: `torch.load(path, weights_only=False)`.",
                    "Or allow the named class: `torch.serialization.add_safe_globals([TheClass])`.",
                    "Save plain state_dicts (or safetensors) from now on."),
            variant((r"PytorchStreamReader failed", r"invalid load key", r"failed finding central directory",
                     r"SafetensorError: Error while deserializing"),
                    "Checkpoint file is truncated or not a PyTorch file",
                    "The file is incomplete or is something else: a download or copy that stopped early, a "
                    "save interrupted by a kill or a full disk, or a Git LFS pointer / HTML error page saved "
                    "under the checkpoint's name.",
                    "Compare its size with the original: `ls -l FILE` (a few hundred bytes means an LFS "
                    "pointer: `git lfs pull`).",
                    "Download or copy it again; load an earlier checkpoint if this one was cut short.",
                    "Save atomically (write a temp file, then rename), as trainwise's checkpoints do."),
            variant((r"size mismatch for [\w.]+: copying a param",),
                    "Checkpoint shapes differ from the model",
                    "The checkpoint was trained with a different configuration (number of classes, hidden "
                    "size, vocabulary): the named tensors have other shapes than the model's.",
                    "Build the model with the checkpoint's configuration.",
                    "To fine-tune with a new head, drop the mismatched keys and load with `strict=False`."),
        ),
    ),
    Rule(
        "driver_too_old", "NVIDIA driver too old for this PyTorch",
        "This PyTorch ships a CUDA runtime newer than the installed NVIDIA driver supports. (In 'found "
        "version 11040' the driver supports CUDA 11.4.) The driver must support at least the CUDA version "
        "torch was built with.",
        ("Compare the two: `nvidia-smi` (top right: newest CUDA the driver supports) and "
         "`python -c 'import torch; print(torch.version.cuda)'`.",
         "Install a torch built for a CUDA the driver supports, e.g. "
         "`pip install torch --index-url https://download.pytorch.org/whl/cu118`.",
         "Or upgrade the driver (Ubuntu: `sudo ubuntu-drivers install`) and reboot."),
        patterns(r"The NVIDIA driver on your system is too old",
                 r"CUDA driver version is insufficient for CUDA runtime version", r"cudaErrorInsufficientDriver",
                 # PTX (torch.compile / Triton / extensions) from a newer CUDA than the driver can compile
                 r"provided PTX was compiled with an unsupported toolchain",
                 r"(?i:UNSUPPORTED_PTX_VERSION|cudaErrorUnsupportedPtxVersion)"),
        keywords=("driver", "ptx"),
    ),
    Rule(
        "cuda_mismatch", "PyTorch's CUDA build does not fit this GPU",
        "The installed PyTorch (or a compiled extension) has no GPU code for this card's architecture "
        "(compute capability: sm_80 A100, sm_86 RTX 30xx/A10, sm_89 L4/RTX 40xx, sm_90 H100, sm_120 "
        "RTX 50xx). Old wheels lack new cards, and new wheels drop very old ones.",
        ("Compare: `python -c 'import torch; print(torch.__version__, torch.version.cuda, "
         "torch.cuda.get_arch_list(), torch.cuda.get_device_capability())'`.",
         "Install a wheel that includes this architecture, e.g. "
         "`pip install --upgrade torch --index-url https://download.pytorch.org/whl/cu128`.",
         "If the traceback is inside a compiled extension, rebuild it for this GPU: "
         "`TORCH_CUDA_ARCH_LIST=\"8.6\" pip install --no-build-isolation --force-reinstall PACKAGE`."),
        patterns(r"no kernel image is available for execution on the device",
                 r"is not compatible with the current PyTorch installation", r"Torch not compiled with CUDA enabled",
                 r"CUDA error: invalid device function",
                 r"The detected CUDA version \([\d.]+\) mismatches the version that was used to compile",
                 # a compiled extension that calls into another torch build (c10::, at::, torch:: mangled)
                 r"\.so: undefined symbol: _ZNK?(?:3c10|2at|5torch)\w*",
                 r"invalid value for --gpu-architecture"),   # nvrtc (JIT) too old for the card
        keywords=("kernel", "compatible", "cuda", "device", "undefined symbol", "gpu-architecture"),
        variants=(
            variant((r"Torch not compiled with CUDA enabled",),
                    "PyTorch is a CPU-only build",
                    "The installed torch has no CUDA support at all (a `+cpu` wheel, or the default pip "
                    "wheel on Windows and macOS), so any `.cuda()` fails.",
                    "Check: `python -c 'import torch; print(torch.__version__, torch.version.cuda)'` "
                    "(None means CPU-only).",
                    "Install a CUDA wheel: `pip install torch --index-url https://download.pytorch.org/whl/cu124`.",
                    "Or run on the CPU (trainwise: `train.device=cpu`)."),
            variant((r"The detected CUDA version \([\d.]+\) mismatches",),
                    "CUDA toolkit differs from torch's CUDA",
                    "A CUDA extension is being compiled with a toolkit (nvcc) of another CUDA version than "
                    "the one torch was built with.",
                    "Compare `nvcc --version` with `python -c 'import torch; print(torch.version.cuda)'`.",
                    "Point the build at a matching toolkit (`export CUDA_HOME=/usr/local/cuda-12.4`) or "
                    "install the torch wheel for your toolkit's CUDA."),
            variant((r"\.so: undefined symbol: _ZNK?(?:3c10|2at|5torch)\w*",),
                    "Compiled extension built for another PyTorch",
                    "A compiled extension (the `.so` named) was built against a different torch version "
                    "than the one installed, so a torch function it calls does not exist under that name. "
                    "Upgrading torch after installing the extension, or a prebuilt wheel for another torch, "
                    "does this.",
                    "Rebuild it against the installed torch: `pip install --no-build-isolation "
                    "--force-reinstall --no-cache-dir PACKAGE`.",
                    "Or install the extension's wheel made for your torch and CUDA version (its release page "
                    "names them), or the torch version it was built for."),
        ),
    ),
    Rule(
        "no_gpu_visible", "No GPU visible to PyTorch",
        "This process sees no usable NVIDIA GPU (or fewer than the code asks for): `CUDA_VISIBLE_DEVICES` "
        "is empty or names a GPU that does not exist (visible GPUs are renumbered from 0), the container was "
        "started without GPU access, or the driver is not loaded.",
        ("See what the process sees: `echo $CUDA_VISIBLE_DEVICES; nvidia-smi -L; "
         "python -c 'import torch; print(torch.cuda.device_count())'`.",
         "Fix or unset the variable: `unset CUDA_VISIBLE_DEVICES`, or `CUDA_VISIBLE_DEVICES=0`.",
         "In Docker add `--gpus all`; under Slurm request GPUs (`--gres=gpu:1`).",
         "If `nvidia-smi` fails too, install or load the driver (`trainwise doctor` shows which part is "
         "missing)."),
        patterns(r"No CUDA GPUs are available", r"Found no NVIDIA driver on your system",
                 r"no CUDA-capable device is detected", r"CUDA driver initialization failed", r"cudaErrorNoDevice",
                 r"invalid device ordinal", r"AssertionError: Invalid device id",
                 r"CUDA-capable device\(s\) (?:is/are|are|is) busy or unavailable",   # exclusive mode, taken
                 r"CUDA unknown error - this may be due to an incorrectly set up environment",
                 r"Error 802: system not yet initialized",
                 r"You requested gpus?: \[", r"(?:CUDA|GPU)Accelerator can not run on your system",
                 r"couldn't communicate with the NVIDIA driver", r"nvml error: driver not loaded",
                 r"could not select device driver \"[^\"]*\" with capabilities: \[\[gpu\]\]",
                 r"(?i:mixed precision requires a GPU)",
                 # the words of scripts and libraries that checked and found none
                 r"(?i:\bno (?:supported |usable |available )?(?:cuda |nvidia )?(?:gpus?|cuda devices?)(?: backend)? "
                 r"(?:were |was )?(?:found|available|detected)\b)",
                 r"(?i:\bcuda is not available\b)", r"is_available\(\) (?:is|returned|==) False",
                 r"device_count\(\) (?:is|returned|==) 0\b",
                 # the checkpoint is fine: it was saved on a GPU and this process has none
                 r"Attempting to deserialize object on (?:a )?CUDA device"),
        keywords=("gpu", "driver", "device", "environment", "error 802", "accelerator", "cuda", "is_available"),
        variants=(
            variant((r"Attempting to deserialize object on (?:a )?CUDA device",),
                    "GPU checkpoint loaded where no GPU is visible",
                    "The checkpoint's tensors were saved on a GPU and this process has none (or torch "
                    "cannot see it). The file itself is fine.",
                    "Load onto the CPU and move afterwards: `torch.load(path, map_location='cpu')`.",
                    "If this machine should have a GPU, check `nvidia-smi` and `CUDA_VISIBLE_DEVICES`."),
        ),
    ),
    Rule(
        "disk_full", "Disk full",
        "A write failed because the file system, or your quota on it, is full: typically while saving a "
        "checkpoint (torch.save then reports `PytorchStreamWriter failed` or `unexpected pos`), preparing a "
        "dataset cache, or writing logs and databases. A checkpoint cut short this way is truncated and will "
        "not load.",
        ("Find the full file system: `df -h` on the output directory (`df -i` for inodes, `quota -s` for "
         "quotas).",
         "Free space: old runs and checkpoints (`du -sh runs/* | sort -h`), caches (`~/.cache/huggingface`, "
         "`~/.cache/torch`, `pip cache purge`).",
         "Keep fewer checkpoints (trainwise: `checkpoint.keep_last=1`) or write the run to a bigger disk "
         "(`--out /data/runs/NAME`)."),
        # NCCL's own shared-memory segment failing is NCCL's rule (a /dev/shm too small), not a full disk
        patterns(r"^(?!.*NCCL WARN)(?i:.*no space left on device)", r"\[Errno 28\]", r"errno = 28\b",
                 r"\bENOSPC\b", r"Disk quota exceeded", r"\[Errno 122\]", r"StorageFull",
                 r"(?i:not enough (?:free )?disk space)", r"database or disk is full",
                 r"PytorchStreamWriter failed writing file", r"inline_container\.cc:\d+\] \. unexpected pos \d+",
                 r"OSError: \d+ requested and \d+ written"),   # numpy's tofile cut short
        keywords=("space", "errno", "enospc", "quota", "storagefull", "disk", "pytorchstreamwriter",
                  "unexpected pos", "requested and"),
    ),
    Rule(
        "ecc_xid_hardware", "GPU fault: illegal memory access or launch failure",
        "A CUDA kernel read or wrote memory it should not have, or crashed. Most often this is software: an "
        "out-of-range index in a custom or compiled kernel (fused attention, a CUDA extension), a bug in one "
        "torch or driver version, or an earlier error that CUDA reports late. Faulty hardware is the rarer "
        "cause; the Xid code in the kernel log tells them apart (13, 31 and 43 are usually the program; 48, "
        "63, 64, 79, 94 and 95 the card).",
        (LAUNCH_BLOCKING + " Then try without custom kernels (torch.compile, fused attention, fused "
         "optimizers) to isolate the one at fault.",
         "Update torch and the extension named in the traceback: a fault that comes with one version is a "
         "known bug more often than a broken card.",
         "Read the driver's log: `sudo dmesg -T | grep -i xid` and `nvidia-smi -q -d ECC`.",
         "If it follows one GPU whatever the code (`CUDA_VISIBLE_DEVICES=N`), reset it when idle "
         "(`sudo nvidia-smi -r -i N`) and have it checked if it recurs."),
        patterns(r"an illegal memory access was encountered", r"unspecified launch failure",
                 r"an illegal instruction was encountered", r"CUDA error: misaligned address",
                 r"uncorrectable ECC error", r"ECC_UNCORRECTABLE|cudaErrorECCUncorrectable", r"NVRM: Xid",
                 r"fallen off the bus", r"\bS?Xid(?: \(PCI|=| error| \d)", r"\bXidCriticalError\b",
                 r"uncorrectable NVLink error", r"\bGPU is lost\b|\bGpuIsLost\b",
                 r"Remapping Failure Occurred\s*: Yes", r"(?i:double[- ]bit (?:ECC )?error)"),
        keywords=("illegal", "launch", "misaligned", "ecc", "xid", "fallen", "nvlink", "lost", "remapping"),
        variants=(
            variant((r"uncorrectable ECC error", r"ECC_UNCORRECTABLE|cudaErrorECCUncorrectable",
                     r"fallen off the bus", r"(?i:double[- ]bit (?:ECC )?error)", r"uncorrectable NVLink error",
                     r"\bGPU is lost\b|\bGpuIsLost\b", r"Remapping Failure Occurred\s*: Yes",
                     r"\bSXid \([^)]*\): \d+, (?:Non-)?[Ff]atal",
                     r"Xid(?: \([^)]*\):|=| error detected: Xid=)\s*(?:48|63|64|74|79|92|94|95)\b"),
                    "GPU hardware error (ECC / Xid)",
                    "The driver reports a memory error the GPU could not correct, a failed NVLink or NVSwitch "
                    "link, or a GPU that stopped answering. A program cannot cause these, though a reset "
                    "often clears a one-off.",
                    "Retry on another GPU (`CUDA_VISIBLE_DEVICES=1`) to confirm the error follows the card.",
                    "Read the driver's log: `sudo dmesg -T | grep -i xid`, and the counters: "
                    "`nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`.",
                    "Reset the idle GPU (`sudo nvidia-smi -r -i N`) or reboot: retired pages and remapped rows "
                    "take effect only then.",
                    "If it recurs after a reset (or Xid 79 repeats: check power and cooling), take the card out "
                    "of service and contact the vendor."),
        ),
    ),
)
