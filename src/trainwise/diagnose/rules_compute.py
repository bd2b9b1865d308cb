"""The second half of the table `explain` reads: failures inside the model's computation and between
processes (asserts, NaN, devices, dtypes, shapes, cuDNN, DDP, NCCL). See rules.py for the first half and
the rules every pattern follows."""
from __future__ import annotations

from trainwise.diagnose.rules import LAUNCH_BLOCKING, Rule, patterns, variant

COMPUTE_RULES: tuple[Rule, ...] = (
    Rule(
        "device_side_assert", "CUDA device-side assert",
        "A check inside a CUDA kernel failed and stopped the process. CUDA reports errors asynchronously, so "
        "the Python traceback may point at a later line than the op that failed.",
        (LAUNCH_BLOCKING,
         "Check the value ranges the kernel indexes with: labels in [0, num_classes), embedding indices "
         "below `num_embeddings`, gather/scatter indices within the dimension.",
         "The CUDA context is unusable after this error: restart the process."),
        patterns(r"device-side assert(?:ion)? triggered",
                 r"block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion `"),
        keywords=("assert",),
        variants=(
            variant((r"t >= 0 && t < n_classes", r"cur_target >= 0 && cur_target < n_classes",
                     r"index out of bounds", r"srcIndex < srcSelectDimSize", r"idx_dim >= 0 && idx_dim <",
                     r"ind >= 0 && ind < ind_dim_size"),
                    "Label or index out of range",
                    "A CUDA kernel checked an index and found it out of range (the quoted Assertion line "
                    "names the check). In a classification loss this means a label is negative or not below "
                    "the number of classes the model outputs; in an embedding or gather, an index is past "
                    "the end of the table.",
                    "Print the range: `print(labels.min(), labels.max(), logits.shape[-1])`; labels must "
                    "run from 0 to num_classes - 1.",
                    "Set the model's output size to the number of classes in the data (count background "
                    "too); shift 1-based labels down by one.",
                    LAUNCH_BLOCKING),
            variant((r"input_val >= zero && input_val <= one",),
                    "Loss input outside [0, 1]",
                    "BCELoss was given values outside [0, 1]: raw logits instead of probabilities, or NaN.",
                    "Use `nn.BCEWithLogitsLoss` on the raw logits instead of sigmoid + `nn.BCELoss`.",
                    "Check the model output for NaN: `torch.isnan(out).any()`."),
        ),
    ),
    Rule(
        "nan_loss", "Loss became NaN or Inf",
        "The loss (or a gradient) stopped being a finite number; from then on every update spreads NaN "
        "into the weights. Usual causes: a learning rate too high (often right after warmup), fp16 overflow, "
        "a log, division or square root of zero or a negative number in the loss, or NaN/Inf already in "
        "the data. An fp16 loss scaler that reached its minimum means the same: every step overflowed.",
        ("Lower the learning rate (e.g. ten times; trainwise: `optim.lr=...`) and warm up "
         "(`schedule.warmup_steps=500`).",
         "Clip gradients (trainwise: `train.grad_clip_norm=1.0`; plain PyTorch: "
         "`torch.nn.utils.clip_grad_norm_`).",
         "Prefer bf16 to fp16 where the GPU has it (`train.precision=bf16`); with fp16 keep the GradScaler.",
         "Check the data with `torch.isfinite(x).all()`, and find the first bad op with "
         "`torch.autograd.set_detect_anomaly(True)`."),
        patterns(r"(?i:(?<![a-z])loss\b[ a-z]{0,12}?\b(?:is|became|=|:)\s*(?:nan|inf)\b)",
                 r"(?i:(?<![a-z])loss['\"]?\s*[:=]?\s*['\"]?(?:nan|-?inf(?:inity)?)\b)",   # dicts, JSON, bars
                 r"(?i:loss became infinite or nan)", r"returned nan values in its \d+(?:st|nd|rd|th) output",
                 # (not "inf gradients": an fp16 loss scaler skipping a step is healthy)
                 r"non-finite loss", r"(?i:\b(?:nan|inf|non-finite) loss\b|\bnan gradients\b)",
                 r"(?i:found (?:nan|inf) in (?:local )?grad)", r"Invalid loss, terminating training",
                 r"Detected nan and/or inf values in", r"is non-finite, so it cannot be clipped",
                 r"(?i:minimum loss scale reached)", r"loss scale already at minimum",
                 # NaN reaching a distribution, whatever its constraint: Real(), IndependentConstraint(Real(), 1)
                 r"to satisfy the constraint .{0,120}?, but found invalid values",
                 r"(?i:(?<![a-z])loss\w*['\"]?\s*[:=]\s*tensor\((?:nan|-?inf)\b)",   # a printed loss tensor
                 # a progress table whose loss columns read nan (torch prints it in lower case; pandas' NaN
                 # in a data dump is not a loss)
                 r"(?:^|\s)nan(?:\s+nan)+(?:\s|$)"),
        keywords=("nan", "inf", "finite", "invalid loss", "loss scale", "invalid values"),
    ),
    Rule(
        "ddp_unused_parameters", "DDP: parameters that received no gradient",
        "DistributedDataParallel waits for a gradient for every parameter before it all-reduces. Some "
        "parameters took no part in the loss this step (an unused layer or head, a branch taken only "
        "sometimes, an output left out of the loss), so the reduction never finished.",
        ("Name them: re-run with `TORCH_DISTRIBUTED_DEBUG=DETAIL`.",
         "Delete unused layers, or make every output you compute contribute to the loss.",
         "If the unused set really changes from step to step, use "
         "`DistributedDataParallel(model, find_unused_parameters=True)` (slower: one more graph walk per step)."),
        patterns(r"Expected to have finished reduction in the prior iteration", r"did not receive grad for rank",
                 r"parameters that were not used in producing (?:the )?loss"),
        keywords=("reduction", "grad", "not used"),
    ),
    Rule(
        "device_mismatch", "Tensors on different devices",
        "One operation got tensors on different devices: the model on the GPU and the batch still on the CPU, "
        "or a tensor created inside `forward` without `device=`. The error line names both devices.",
        ("Move the model once and every batch each step to the same device: `model.to(device)`, "
         "`x, y = x.to(device), y.to(device)`.",
         "Create tensors inside `forward` on the input's device (`torch.zeros(n, device=x.device)`) and keep "
         "constant tensors as buffers (`self.register_buffer`) so `.to()` moves them.",
         "Create layers in `__init__`, never in `forward`: a layer built in `forward` is never moved."),
        patterns(r"Expected all tensors to be on the same device",
                 r"Expected object of device type \w+ but got device type \w+",
                 r"Input type \(torch\.cuda\.\w+\) and weight type \(torch\.(?!cuda\.)\w+\)",
                 r"Input type \(torch\.(?!cuda\.)\w+\) and weight type \(torch\.cuda\.\w+\)",
                 r"is on CPU, but expected (?:it|them) to be on GPU",
                 r"indices should be either on cpu or on the same device as the indexed tensor",
                 r"can't convert \w+(?::\d+)? device type tensor to numpy",
                 r"tensors are not at the same device"),   # RNNs: input and hidden state
        keywords=("device", "type", "expected", "indices"),
        variants=(
            variant((r"can't convert \w+(?::\d+)? device type tensor to numpy",),
                    "A GPU tensor handed to numpy",
                    "numpy (or a library built on it: scikit-learn, matplotlib, pandas) was given a tensor "
                    "that lives on the GPU; numpy reads only host memory.",
                    "Copy it to the host first: `t.detach().cpu().numpy()` (or `.tolist()` for a few values).",
                    "Keep metrics on the GPU where you can (`torchmetrics`), and move results once per "
                    "evaluation, not per batch."),
        ),
    ),
    Rule(
        "dtype_mismatch", "Tensors of different dtypes",
        "An operation got inputs of different dtypes: fp16/bf16 activations meeting fp32 weights, or "
        "float64 data meeting a float32 model. With mixed precision this happens when an op runs outside "
        "`torch.autocast`, or when the model was cast with `.half()` and its inputs were not.",
        ("Let autocast choose: run forward and loss in `with torch.autocast('cuda', dtype=torch.bfloat16):` "
         "and keep the weights fp32 (trainwise does this for `train.precision=bf16` or `fp16`).",
         "Convert data once in the Dataset: `torch.as_tensor(x, dtype=torch.float32)` (numpy defaults to "
         "float64); class labels as `torch.long`.",
         "Where you mix dtypes on purpose, cast at the boundary: `x.to(layer.weight.dtype)`."),
        patterns(r"expected scalar type \w+ but found \w+",
                 r"Expected object of scalar type \w+ but got scalar type \w+",
                 r"mat1 and mat2 must have the same dtype", r"expected mat1 and mat2 to have the same dtype",
                 r"Input type \(torch\.(?P<in_cuda>cuda\.)?(?P<in_type>\w+)\) and weight type "
                 r"\(torch\.(?(in_cuda)cuda\.)(?!(?P=in_type)\))\w+\)",
                 r"but type torch\.(?P<a_cuda>cuda\.)?(?P<a_type>\w+) does not equal "
                 r"torch\.(?(a_cuda)cuda\.)(?!(?P=a_type)\b)\w+",
                 r"result type \w+ can't be cast to the desired output type \w+", r"Found dtype \w+ but expected \w+",
                 # an op with no kernel for the dtype it got (float class labels, fp16 on the CPU)
                 r"\"\w+\" not implemented for '(?:Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool)'",
                 r"to have (?:one of the following )?scalar types?:? [\w, ]+; but got \S+ instead",
                 # dtype names (c10::Half, float), never tensor types (torch.cuda.FloatTensor: a device question)
                 r"Input type \((?:c10::)?\w+\) and bias type \((?:c10::)?\w+\) should be the same"),
        keywords=("type", "not implemented for"),
        variants=(
            variant((r"\"\w+\" not implemented for '(?:Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool)'",),
                    "Operation not available for this dtype",
                    "The operation has no kernel for the dtype it got (named after 'not implemented for'): "
                    "class labels stored as floats where a loss wants integer indices, or fp16 on the CPU, "
                    "where many operations have no half-precision kernel.",
                    "Class labels for cross-entropy / NLL: `y.long()` (store them as integers in the "
                    "Dataset).",
                    "On the CPU compute in fp32 (or bf16): `model.float()`, or autocast with "
                    "`dtype=torch.bfloat16`; keep fp16 for the GPU.",
                    "Print the dtypes going in: `print(x.dtype, y.dtype, next(model.parameters()).dtype)`."),
        ),
    ),
    Rule(
        "cudnn_error", "cuDNN error",
        "cuDNN, NVIDIA's library for convolutions and RNNs, failed. Common triggers: a shape or memory "
        "layout an algorithm mishandles, the autotuner (`cudnn.benchmark`) picking a broken algorithm, a "
        "second cuDNN library that does not match torch, or GPU memory running out.",
        ("Re-run with `torch.backends.cudnn.benchmark = False`; if that passes, an autotuned algorithm was at "
         "fault.",
         "Make the input contiguous (`x.contiguous()`) and try a smaller batch to rule out memory.",
         "Look for a second cuDNN: `python -c 'import torch; print(torch.backends.cudnn.version())'` and "
         "`echo $LD_LIBRARY_PATH` (the pip wheel brings its own).",
         "To confirm cuDNN is the failing part, run once with `torch.backends.cudnn.enabled = False` "
         "(slower; a diagnosis, not a fix)."),
        patterns(r"CUDNN_STATUS_[A-Z_]+", r"(?i:cuDNN error)", r"Unable to find a valid cuDNN algorithm",
                 r"(?:GET|FIND) was unable to find an engine to execute this computation",
                 r"cuDNN version incompatibility",
                 r"Could not load library libcudnn\w*", r"(?i:unable to load any of \{?libcudnn)"),
        keywords=("cudnn", "engine"),
        variants=(
            variant((r"CUDNN_STATUS_NOT_INITIALIZED", r"CUDNN_STATUS_ALLOC_FAILED",
                     r"Unable to find a valid cuDNN algorithm", r"unable to find an engine to execute"),
                    "cuDNN could not start or find an algorithm",
                    "cuDNN could not initialise or found no algorithm that fits: most often the GPU was "
                    "(nearly) out of memory when cuDNN asked for its workspace, less often a cuDNN library "
                    "that does not match torch.",
                    "Try a smaller batch, and check other processes on the GPU with `nvidia-smi`.",
                    "Check `python -c 'import torch; print(torch.backends.cudnn.version())'` and that "
                    "`LD_LIBRARY_PATH` does not point at another cuDNN."),
            variant((r"Could not load library libcudnn\w*", r"(?i:unable to load any of \{?libcudnn)"),
                    "cuDNN library could not be loaded",
                    "The cuDNN library torch needs could not be found or opened: a torch wheel whose cuDNN "
                    "package is missing or of another version, or an `LD_LIBRARY_PATH` that points at a "
                    "different one.",
                    "See which one is found: `python -c 'import torch; print(torch.backends.cudnn.version())'` "
                    "and `echo $LD_LIBRARY_PATH`.",
                    "Reinstall torch so its own cuDNN comes with it: `pip install --force-reinstall torch` "
                    "(the wheel depends on `nvidia-cudnn-cu12`); remove other cuDNN paths from "
                    "`LD_LIBRARY_PATH`."),
            variant((r"cuDNN version incompatibility",),
                    "cuDNN version differs from torch's",
                    "torch loaded a cuDNN library of another version than it was built against, usually "
                    "one found through `LD_LIBRARY_PATH`.",
                    "Remove the other cuDNN from `LD_LIBRARY_PATH` so torch uses the one its wheel brings.",
                    "Or reinstall torch: `pip install --force-reinstall torch`."),
        ),
    ),
    Rule(
        "shape_mismatch", "Tensor shapes do not fit",
        "Two tensors met in an operation with shapes that do not fit. For `mat1 and mat2 shapes cannot be "
        "multiplied (AxB and CxD)` a Linear layer expecting C input features got B, typically because the "
        "flattened size after the convolutions changed with the input size. For a loss, the output and the "
        "target differ in batch size or shape.",
        ("Print the shapes just before the failing line (`print(x.shape)`) and compare them with the layer's "
         "`in_features` / `in_channels`.",
         "For a Linear after convolutions, set `in_features` to the flattened size actually produced, or "
         "use `nn.LazyLinear` or `nn.AdaptiveAvgPool2d` so it follows the input size.",
         "Check the data: every sample resized to the size the model was built for; targets shaped like the "
         "output (class indices of shape `(N,)` for CrossEntropyLoss)."),
        patterns(r"mat1 and mat2 shapes cannot be multiplied",
                 r"size of tensor a(?: \(\d+\))? must match the size of tensor b",
                 r"expanded size of the tensor \(\d+\) must match the existing size \(\d+\)",
                 r"Expected target size \([\d, ]+\), got torch\.Size",
                 r"Calculated output size: \([^)]*\)\. Output size is too small",
                 r"only batches of spatial targets supported",
                 r"expected input\[.*\] to have \d+ channels, but got \d+ channels instead",
                 r"Expected input batch_size \(\d+\) to match target batch_size \(\d+\)",
                 r"shape '\[[^\]]*\]' is invalid for input of size \d+", r"size mismatch, m1: \[",
                 r"Target size \(torch\.Size\(\[[^\]]*\]\)\) must be the same as input size",
                 r"Sizes of tensors must match except in dimension \d+",
                 r"Expected \d+D \(unbatched\) or \d+D \(batched\) input to \w+, but got input of size",
                 r"The shape of the mask \[[^\]]*\] at index \d+ does not match the shape of the indexed tensor",
                 r"0D or 1D target tensor expected, multi-target not supported",
                 # sequences of different lengths batched without padding (collate, torch.tensor, tokenizers)
                 r"stack expects each tensor to be equal size",
                 r"expected sequence of length \d+ at dim \d+ \(got \d+\)",
                 r"Unable to create tensor, you should probably activate truncation and/or padding"),
        keywords=("shape", "size", "channels", "target", "sequence of length", "padding"),
        variants=(
            variant((r"stack expects each tensor to be equal size",
                     r"expected sequence of length \d+ at dim \d+ \(got \d+\)",
                     r"Unable to create tensor, you should probably activate truncation and/or padding"),
                    "Samples of different lengths in one batch",
                    "The samples of a batch have different lengths (token sequences, variable-size images), "
                    "and were stacked into one tensor without padding: the default collate and "
                    "`torch.tensor` need equal sizes.",
                    "Pad in the collate function: `torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, "
                    "padding_value=pad_id)`, or transformers' `DataCollatorWithPadding(tokenizer)`.",
                    "When tokenizing a batch: `tokenizer(texts, padding=True, truncation=True, "
                    "max_length=N, return_tensors='pt')`.",
                    "Or make every sample the same length up front (truncate and pad, or pack sequences; "
                    "`trainwise prepare` packs text)."),
            variant((r"The shape of the mask \[\d+, 1\] at index \d+ does not match",
                     r"0D or 1D target tensor expected, multi-target not supported"),
                    "Targets shaped (N, 1) where class labels (N,) were expected",
                    "The targets have one column per sample, as regression targets do, and met code that expects "
                    "class labels: a regression run handled as classification (cross-entropy, accuracy), or class "
                    "labels kept as a column.",
                    "Regression: float targets and a model with one output (trainwise infers regression from "
                    "them; or pass `data_spec=DataSpec(..., task='regression')` to the Trainer).",
                    "Classification: integer labels of shape `(N,)` (`y.squeeze(1).long()`) and one model output "
                    "per class."),
        ),
    ),
    Rule(
        "nccl_error", "NCCL communication error",
        "A collective (all-reduce, broadcast, ...) between the processes failed inside NCCL, the library "
        "that moves tensors between GPUs. The lines after the error (`Last error:`) or the `NCCL WARN` lines "
        "of a run with `NCCL_DEBUG=INFO` say which call failed.",
        ("Re-run with `NCCL_DEBUG=INFO` and read the `NCCL WARN` lines just before the error.",
         "If a socket, host or address is named, point NCCL at the right network interface: "
         "`NCCL_SOCKET_IFNAME=eth0` (see `ip addr`); without InfiniBand try `NCCL_IB_DISABLE=1`.",
         "On GPUs without working peer-to-peer (many consumer cards, some VMs) try `NCCL_P2P_DISABLE=1`.",
         "Give every rank the same torch build, and call `torch.cuda.set_device(local_rank)` before "
         "`init_process_group`."),
        patterns(r"(?i:NCCL error)", r"\bnccl(?:System|Internal|UnhandledCuda|InvalidUsage|InvalidArgument)Error\b",
                 r"DistBackendError: (?!.*(?i:timed? ?out|timeout))",   # one that timed out is a timeout
                 r"NCCL WARN .*(?:shared memory|posix_fallocate|failed to extend /dev/shm)",
                 # a rank that cannot reach the rendezvous / TCP store at all (not one that timed out; a
                 # "[W] client socket has failed to connect" alone is a retry, and may still succeed)
                 r"RendezvousConnectionError",
                 r"DistNetworkError: .*(?:Connection refused|No route to host|Name or service not known)"),
        keywords=("nccl", "distbackend", "rendezvousconnection", "distnetwork"),
        variants=(
            variant((r"(?i:client socket has failed to connect)", r"RendezvousConnectionError",
                     r"DistNetworkError: .*(?:Connection refused|No route to host|Name or service not known)"),
                    "The ranks could not reach the rendezvous address",
                    "A process could not connect to the master's TCP store (`MASTER_ADDR:MASTER_PORT`, "
                    "torchrun's `--rdzv-endpoint`): the first node is not running yet or has exited, the "
                    "address or port is wrong, or a firewall blocks it.",
                    "Check the endpoint every node uses (`MASTER_ADDR`, `MASTER_PORT`, `--rdzv-endpoint`) "
                    "and that the first node started its launcher.",
                    "Test the path from this node: `nc -zv HOST PORT` (open the port in the firewall or "
                    "security group)."),
            variant((r"socketStartConnect", r"No route to host", r"Connection refused", r"NET/IB",
                     r"NCCL_SOCKET_IFNAME"),
                    "NCCL could not connect the ranks",
                    "NCCL could not open a connection between the processes: it picked a network interface "
                    "the other machine cannot reach, a firewall blocks the ports, or the address is wrong.",
                    "Name the interface the machines share: `NCCL_SOCKET_IFNAME=eth0` (see `ip addr`); "
                    "without InfiniBand add `NCCL_IB_DISABLE=1`.",
                    "Check `MASTER_ADDR` / `--rdzv-endpoint` and that the nodes reach each other "
                    "(`ping`, open firewall ports)."),
            variant((r"NCCL WARN .*(?:shared memory|posix_fallocate|failed to extend /dev/shm)",),
                    "NCCL could not create its shared-memory segment",
                    "NCCL moves data between GPUs of one machine through files in /dev/shm, and it could "
                    "not create or grow one: /dev/shm is too small (Docker gives 64 MB unless told "
                    "otherwise). The disk is not what is full.",
                    "In Docker start the container with `--ipc=host` or `--shm-size=16g`; in Kubernetes mount "
                    "an `emptyDir` with `medium: Memory` at /dev/shm. Check with `df -h /dev/shm`.",
                    "As a stopgap, `NCCL_SHM_DISABLE=1` makes NCCL go through the network or P2P instead "
                    "(slower)."),
            variant((r"Duplicate GPU detected",),
                    "Two ranks on the same GPU",
                    "Two processes of one job selected the same GPU, which NCCL refuses.",
                    "Call `torch.cuda.set_device(local_rank)` (from `LOCAL_RANK`) before "
                    "`init_process_group`, and start one process per GPU (`torchrun --nproc-per-node=N`)."),
        ),
    ),
    # Consequences: they say another process failed or never arrived, so they are the diagnosis only
    # when the log holds no error of its own.
    Rule(
        "nccl_error", "Another rank exited or the network dropped",
        "This rank's collective failed because a peer process exited or the connection to it broke. That "
        "process's own error, earlier in this log or in its own log, is the cause.",
        ("Find the first rank that failed: the first `Traceback` or `Error` in the logs of all ranks "
         "(torchrun's `Root Cause (first observed failure)` names it).",
         "If no rank shows an error, check the network between the nodes and `dmesg` on each for a killed "
         "process."),
        patterns(r"remote process exited or there was a network error", r"\bncclRemoteError\b"),
        keywords=("remote",),
        fallout=True,
    ),
    Rule(
        "nccl_timeout", "Collective operation timed out",
        "A collective waited longer than the process group's timeout (10 minutes by default) because not "
        "every rank reached it: a rank crashed or hung, or the ranks run different code (evaluation or "
        "saving on rank 0 only, a different number of batches per rank). When another error shows earlier in "
        "the log, that error is the cause.",
        ("Find the first rank that failed: the first `Traceback` or `Error` before the watchdog lines "
         "(torchrun's `Root Cause (first observed failure)` names it).",
         "Make every rank run the same collectives: the same number of batches (`DistributedSampler` with "
         "`drop_last=True`), and rank-0-only work outside collectives, followed by `dist.barrier()`.",
         "If one step is legitimately slow (a large checkpoint save), raise the timeout: "
         "`init_process_group(timeout=datetime.timedelta(minutes=60))`.",
         "See where each rank waits: `TORCH_NCCL_TRACE_BUFFER_SIZE=2000` records the last collectives."),
        patterns(r"Watchdog caught collective operation timeout", r"Some NCCL operations have failed or timed out",
                 r"Timed out initializing process group in store based barrier",
                 r"DistStoreError: .*(?i:timed out|timeout)", r"watchdog got stuck for \d+ seconds",
                 r"Heartbeat monitor timed out", r"failed to pass monitoredBarrier",
                 r"Timed out waiting \d+ms for (?:send|recv) operation to complete",
                 r"\bTimeout at NCCL work: \d+", r"Dist(?:Network|Backend)Error: .*(?i:timed out|timeout)",
                 # a rank waiting in the key-value store for another's NCCL id or address
                 r"store->(?:get|wait)\([^)]*\) got error: .*(?i:timed out|timeout)",
                 # a collective or the process group named with a timeout, in any order, on one line
                 r"(?i:\b(?:nccl|gloo|collective|barrier|all_?reduce|all_?gather|reduce_?scatter|broadcast)\b"
                 r".{0,80}\b(?:timed out|timeout)\b)",
                 r"(?i:\b(?:timed out|timeout)\b.{0,80}\b(?:nccl|collective|barrier|all_?reduce|all_?gather|"
                 r"broadcast|process group)\b)", r"RendezvousTimeoutError"),
        keywords=("watchdog", "timed out", "timeout", "monitoredbarrier"),
        fallout=True,
    ),
)
