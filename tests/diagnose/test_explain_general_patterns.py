"""The patterns added after the u35 held-out batch (benchmarks/explain.py), each checked on texts other than
that batch's: host-memory kills as schedulers and shells report them, a rank that cannot reach the rendezvous,
a GPU checkpoint loaded without a GPU, and samples of different lengths batched without padding."""
from __future__ import annotations

import pytest

from trainwise.diagnose import explain


def assert_read_as(log: str, code: str, title_words: str, fix_words: str) -> None:
    """`log` is named `code`, under a title holding `title_words`, with a fix holding `fix_words`."""
    finding = explain(log)
    assert finding.code == code and title_words in finding.title, (finding.code, finding.title)
    assert any(fix_words in fix for fix in finding.fixes), finding.fixes


@pytest.mark.parametrize("log", [
    "srun: error: gn-17: task 3: Out Of Memory\n"
    "slurmstepd: error: Detected 2 oom-kill event(s) in StepId=99120.0. Some of your processes may have been "
    "killed by the cgroup out-of-memory handler.",
    "NAME          READY   STATUS      RESTARTS   AGE\n"
    "trainer-0     0/1     OOMKilled   3          41m",
    "Epoch 4: 12%|█▏ | 120/1000\n"
    "run.sh: line 7: 118204 Killed                  torchrun --nproc-per-node 8 fit.py",
    "2026-10-02 10:00:01 step 900 loss 1.02\n"
    "Job finished: container exited with code 137",
], ids=["slurm-oom-kill-events", "kubernetes-oomkilled", "shell-job-report", "exit-code-137"])
def test_host_memory_kills_as_schedulers_and_shells_report_them(log):
    assert explain(log).code == "cpu_oom_killed"


@pytest.mark.parametrize("log", [
    "step 137 loss 0.52\nValueError: bad value in row 1370",   # 137 as a step, not an exit status
    "Killed 3 zombie workers before starting\nKeyError: 'label'",
])
def test_numbers_and_words_that_only_look_like_a_kill_are_not_one(log):
    assert explain(log).code == "unknown"


@pytest.mark.parametrize("log", [
    "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store "
    "has failed. See inner exception for details.",
    "[rank2]: torch.distributed.DistNetworkError: Failed to connect to 10.1.0.4:23456: "
    "No route to host",
    "torch.distributed.DistNetworkError: The client socket has failed to connect to any network address of "
    "(head-node, 29500). getaddrinfo: Name or service not known",
], ids=["rendezvous-connection", "no-route", "unknown-host"])
def test_a_rank_that_cannot_reach_the_rendezvous_is_a_connection_error(log):
    assert_read_as(log, "nccl_error", "rendezvous", "MASTER_ADDR")


def test_a_port_already_in_use_is_not_claimed_as_a_network_failure():
    log = ("torch.distributed.DistNetworkError: The server socket has failed to bind to [::]:29500 "
           "(errno: 98 - Address already in use).")
    assert explain(log).code == "unknown"


def test_a_retried_connect_warning_before_a_store_timeout_stays_a_timeout():
    log = ("[W socket.cpp:700] [c10d] The client socket has failed to connect to [node-a]:12355 "
           "(errno: 111 - Connection refused).\n"
           "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 2/8 clients joined.")
    assert explain(log).code == "nccl_timeout"


def test_a_gpu_checkpoint_without_a_gpu_is_no_gpu_visible_and_says_map_location():
    log = ("  File \"eval.py\", line 12, in <module>\n"
           "    sd = torch.load('ckpt/epoch_9.pth')\n"
           "RuntimeError: Attempting to deserialize object on CUDA device 1 but torch.cuda.device_count() is 1. "
           "Please use torch.load with map_location to map your storages to an existing device.")
    assert_read_as(log, "no_gpu_visible", "no GPU", "map_location='cpu'")


@pytest.mark.parametrize("log", [
    "RuntimeError: Caught RuntimeError in DataLoader worker process 1.\n"
    "RuntimeError: stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and "
    "[3, 224, 180] at entry 2",
    ">>> torch.tensor([[1, 2, 3], [4, 5]])\nValueError: expected sequence of length 3 at dim 1 (got 2)",
    "ValueError: Unable to create tensor, you should probably activate truncation and/or padding with "
    "'padding=True' 'truncation=True' to have batched tensors with the same length.",
], ids=["collate-images", "ragged-list", "tokenizer"])
def test_samples_of_different_lengths_batched_without_padding_are_a_shape_mismatch(log):
    assert_read_as(log, "shape_mismatch", "different lengths", "pad")


# --- after the v35 batch: each pattern on a text other than the batch's ---

@pytest.mark.parametrize("log, code", [
    ("RuntimeError: unable to mmap 1048576 bytes from file </torch_33_1044_0>: Cannot allocate memory (12)",
     "shm_too_small"),
    ("RuntimeError: Missing key in checkpoint state_dict: optim.state.lm_head.weight.exp_avg.", "checkpoint_load"),
    ("OSError: Unable to load weights from pytorch checkpoint file for 'ckpt/model.bin' at 'ckpt/model.bin'.",
     "checkpoint_load"),
    ("RuntimeError: Triton Error [CUDA]: CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "driver_too_old"),
    ("RuntimeError: No available GPUs found on this machine", "no_gpu_visible"),
    ("RuntimeError: The expanded size of the tensor (77) must match the existing size (64) at non-singleton "
     "dimension 0.  Target sizes: [77].  Tensor sizes: [64]", "shape_mismatch"),
], ids=["shm-mmap", "dcp-optimizer-key", "hf-weights-file", "ptx-version", "no-available-gpus", "expand"])
def test_general_patterns_after_the_v35_batch(log, code):
    assert explain(log).code == code


def test_an_extension_built_for_another_torch_says_rebuild_it():
    log = ("ImportError: /env/lib/python3.11/site-packages/apex/fused_dense_cuda.cpython-311-x86_64-linux-gnu.so: "
           "undefined symbol: _ZN2at4_ops5zeros4callEN3c108ArrayRefINS2_6SymIntEEE")
    assert_read_as(log, "cuda_mismatch", "another PyTorch", "--force-reinstall")


def test_an_undefined_symbol_outside_torch_is_not_claimed():
    log = "ImportError: /usr/lib/libfoo.so.1: undefined symbol: PyUnicode_AsUTF8AndSize_v2"
    assert explain(log).code == "unknown"


def test_a_gpu_tensor_handed_to_numpy_is_a_device_mismatch():
    log = ("  File \"plot.py\", line 9, in <module>\n    plt.plot(losses)\n"
           "TypeError: can't convert mps:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
           "to host memory first.")
    assert_read_as(log, "device_mismatch", "numpy", ".cpu().numpy()")


def test_an_op_without_a_kernel_for_its_dtype_is_a_dtype_mismatch():
    log = "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'"
    assert_read_as(log, "dtype_mismatch", "not available for this dtype", "fp32")


# --- after the w35 batch: each pattern on a text other than the batch's ---

@pytest.mark.parametrize("log, code", [
    ("Notebook: your runtime used all available RAM and was restarted.", "cpu_oom_killed"),
    ("ValueError: Expected parameter concentration (Tensor of shape (16, 3)) of distribution "
     "Dirichlet(concentration: torch.Size([16, 3])) to satisfy the constraint "
     "IndependentConstraint(GreaterThan(lower_bound=0.0), 1), but found invalid values:\n"
     "tensor([[nan, nan, nan]], grad_fn=<SoftplusBackward0>)", "nan_loss"),
    ("RuntimeError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value "
     "store by key '0:1', but store->get('0:1') got error: Timed out after 300 seconds", "nccl_timeout"),
], ids=["ram-restarted", "dirichlet-nan", "store-get-timed-out"])
def test_general_patterns_after_the_w35_batch(log, code):
    assert explain(log).code == code


def test_a_store_timeout_after_a_ranks_own_error_names_that_error():
    log = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.\n"
           "[rank1]: RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via "
           "c10d key-value store by key '0', but store->get('0') got error: Socket Timeout")
    assert explain(log).code == "cuda_oom"
