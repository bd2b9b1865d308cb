"""The patterns added for issue 35's fresh held-out batches (u35, v35, w35 in benchmarks/explain.py) and
from the libraries' own messages, each checked on texts other than the batches': the category named, and
where a pattern brought its own reading, the title and the fix that go with it. Lines that only look like a
known failure stay unrecognised."""
from __future__ import annotations

import pytest

from trainwise.diagnose import explain

CATEGORY = [
    # after the u35 batch: host-memory kills as schedulers and shells report them
    pytest.param("srun: error: gn-17: task 3: Out Of Memory\n"
                 "slurmstepd: error: Detected 2 oom-kill event(s) in StepId=99120.0. Some of your processes may "
                 "have been killed by the cgroup out-of-memory handler.", "cpu_oom_killed", id="slurm-oom-kill"),
    pytest.param("NAME          READY   STATUS      RESTARTS   AGE\n"
                 "trainer-0     0/1     OOMKilled   3          41m", "cpu_oom_killed", id="kubernetes-oomkilled"),
    pytest.param("Epoch 4: 12%|█▏ | 120/1000\n"
                 "run.sh: line 7: 118204 Killed                  torchrun --nproc-per-node 8 fit.py",
                 "cpu_oom_killed", id="shell-job-report"),
    pytest.param("2026-10-02 10:00:01 step 900 loss 1.02\nJob finished: container exited with code 137",
                 "cpu_oom_killed", id="exit-code-137"),
    pytest.param("step 137 loss 0.52\nValueError: bad value in row 1370", "unknown", id="137-as-a-step"),
    pytest.param("Killed 3 zombie workers before starting\nKeyError: 'label'", "unknown", id="killed-as-a-word"),
    # after the u35 batch: the rendezvous, and what it is not
    pytest.param("torch.distributed.DistNetworkError: The server socket has failed to bind to [::]:29500 "
                 "(errno: 98 - Address already in use).", "unknown", id="port-in-use"),
    pytest.param("[W socket.cpp:700] [c10d] The client socket has failed to connect to [node-a]:12355 "
                 "(errno: 111 - Connection refused).\ntorch.distributed.DistStoreError: Timed out after 901 "
                 "seconds waiting for clients. 2/8 clients joined.", "nccl_timeout", id="retried-connect"),
    # after the v35 batch
    pytest.param("RuntimeError: unable to mmap 1048576 bytes from file </torch_33_1044_0>: Cannot allocate memory "
                 "(12)", "shm_too_small", id="shm-mmap"),
    pytest.param("RuntimeError: Missing key in checkpoint state_dict: optim.state.lm_head.weight.exp_avg.",
                 "checkpoint_load", id="dcp-optimizer-key"),
    pytest.param("OSError: Unable to load weights from pytorch checkpoint file for 'ckpt/model.bin' at "
                 "'ckpt/model.bin'.", "checkpoint_load", id="hf-weights-file"),
    pytest.param("RuntimeError: Triton Error [CUDA]: CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "driver_too_old",
                 id="ptx-version"),
    pytest.param("RuntimeError: No available GPUs found on this machine", "no_gpu_visible", id="no-available-gpus"),
    pytest.param("RuntimeError: The expanded size of the tensor (77) must match the existing size (64) at "
                 "non-singleton dimension 0.  Target sizes: [77].  Tensor sizes: [64]", "shape_mismatch",
                 id="expand"),
    pytest.param("ImportError: /usr/lib/libfoo.so.1: undefined symbol: PyUnicode_AsUTF8AndSize_v2", "unknown",
                 id="undefined-symbol-outside-torch"),
    # after the w35 batch
    pytest.param("Notebook: your runtime used all available RAM and was restarted.", "cpu_oom_killed",
                 id="ram-restarted"),
    pytest.param("ValueError: Expected parameter concentration (Tensor of shape (16, 3)) of distribution "
                 "Dirichlet(concentration: torch.Size([16, 3])) to satisfy the constraint "
                 "IndependentConstraint(GreaterThan(lower_bound=0.0), 1), but found invalid values:\n"
                 "tensor([[nan, nan, nan]], grad_fn=<SoftplusBackward0>)", "nan_loss", id="dirichlet-nan"),
    pytest.param("RuntimeError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d "
                 "key-value store by key '0:1', but store->get('0:1') got error: Timed out after 300 seconds",
                 "nccl_timeout", id="store-get-timed-out"),
    pytest.param("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.\n"
                 "[rank1]: RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] "
                 "via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout",
                 "cuda_oom", id="store-timeout-after-oom"),
    # before the x35 batch, from the libraries' own messages
    pytest.param("OSError: [Errno 12] Cannot allocate memory", "cpu_oom_killed", id="errno-12"),
    pytest.param("RuntimeError: HIP out of memory. Tried to allocate 2.00 GiB (GPU 0; 63.98 GiB total capacity)",
                 "cuda_oom", id="hip-oom"),
    pytest.param("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", "no_gpu_visible",
                 id="device-busy"),
    pytest.param("nvrtc: error: invalid value for --gpu-architecture (-arch)", "cuda_mismatch", id="nvrtc-arch"),
    pytest.param("RuntimeError: Input and hidden tensors are not at the same device, found input tensor at cuda:0 "
                 "and hidden tensor at cpu", "device_mismatch", id="rnn-hidden-device"),
    pytest.param("RuntimeError: Expected tensor for argument #1 'indices' to have one of the following scalar "
                 "types: Long, Int; but got torch.cuda.FloatTensor instead (while checking arguments for "
                 "embedding)", "dtype_mismatch", id="embedding-float-indices"),
    pytest.param("RuntimeError: Input type (c10::Half) and bias type (float) should be the same", "dtype_mismatch",
                 id="half-input-float-bias"),
    pytest.param("ValueError: Expected target size (32, 50257), got torch.Size([32, 128])", "shape_mismatch",
                 id="target-size"),
    pytest.param("RuntimeError: Given input size: (256x2x2). Calculated output size: (256x0x0). Output size is "
                 "too small", "shape_mismatch", id="pool-too-small"),
    pytest.param("RuntimeError: only batches of spatial targets supported (3D tensors) but got targets of "
                 "dimension: 4", "shape_mismatch", id="spatial-targets"),
]

READING = [   # (log, category, words of the title, words of one fix)
    pytest.param("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d "
                 "store has failed. See inner exception for details.",
                 "nccl_error", "rendezvous", "MASTER_ADDR", id="rendezvous-connection"),
    pytest.param("[rank2]: torch.distributed.DistNetworkError: Failed to connect to 10.1.0.4:23456: No route to host",
                 "nccl_error", "rendezvous", "MASTER_ADDR", id="no-route"),
    pytest.param("torch.distributed.DistNetworkError: The client socket has failed to connect to any network "
                 "address of (head-node, 29500). getaddrinfo: Name or service not known",
                 "nccl_error", "rendezvous", "MASTER_ADDR", id="unknown-host"),
    pytest.param("  File \"eval.py\", line 12, in <module>\n    sd = torch.load('ckpt/epoch_9.pth')\n"
                 "RuntimeError: Attempting to deserialize object on CUDA device 1 but torch.cuda.device_count() is "
                 "1. Please use torch.load with map_location to map your storages to an existing device.",
                 "no_gpu_visible", "no GPU", "map_location='cpu'", id="gpu-checkpoint-without-gpu"),
    pytest.param("RuntimeError: Caught RuntimeError in DataLoader worker process 1.\n"
                 "RuntimeError: stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and "
                 "[3, 224, 180] at entry 2", "shape_mismatch", "different lengths", "pad", id="collate-images"),
    pytest.param(">>> torch.tensor([[1, 2, 3], [4, 5]])\nValueError: expected sequence of length 3 at dim 1 (got 2)",
                 "shape_mismatch", "different lengths", "pad", id="ragged-list"),
    pytest.param("ValueError: Unable to create tensor, you should probably activate truncation and/or padding with "
                 "'padding=True' 'truncation=True' to have batched tensors with the same length.",
                 "shape_mismatch", "different lengths", "pad", id="tokenizer"),
    pytest.param("ImportError: /env/lib/python3.11/site-packages/apex/fused_dense_cuda.cpython-311-x86_64-linux-gnu"
                 ".so: undefined symbol: _ZN2at4_ops5zeros4callEN3c108ArrayRefINS2_6SymIntEEE",
                 "cuda_mismatch", "another PyTorch", "--force-reinstall", id="extension-for-another-torch"),
    pytest.param("  File \"plot.py\", line 9, in <module>\n    plt.plot(losses)\n"
                 "TypeError: can't convert mps:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                 "to host memory first.", "device_mismatch", "numpy", ".cpu().numpy()", id="gpu-tensor-to-numpy"),
    pytest.param("RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'",
                 "dtype_mismatch", "not available for this dtype", "fp32", id="no-kernel-for-dtype"),
    pytest.param("Could not load library libcudnn_cnn_infer.so.8. Error: libcudnn_cnn_infer.so.8: cannot open "
                 "shared object file: No such file or directory\nAborted (core dumped)",
                 "cudnn_error", "could not be loaded", "--force-reinstall torch", id="cudnn-library"),
]


@pytest.mark.parametrize("log, code", CATEGORY)
def test_general_patterns_name_the_category(log, code):
    assert explain(log).code == code


@pytest.mark.parametrize("log, code, title_words, fix_words", READING)
def test_readings_bring_their_title_and_fix(log, code, title_words, fix_words):
    finding = explain(log)
    assert finding.code == code and title_words in finding.title, (finding.code, finding.title)
    assert any(fix_words in fix for fix in finding.fixes), finding.fixes
