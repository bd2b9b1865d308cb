import pytest
import torch

from trainwise.errors import ConfigError
from trainwise.runtime.device import resolve_device
from trainwise.runtime.precision import autocast, choose_precision, enable_tf32, make_scaler, resolve_precision

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_auto_device_is_the_cpu_without_accelerators():
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_asking_for_cuda_without_one_says_why():
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        resolve_device("cuda")


def test_bad_device_name():
    with pytest.raises(ConfigError, match="not a device"):
        resolve_device("gpu0")


@pytest.mark.parametrize("requested, kind, bf16_native, chosen", [
    ("auto", "cuda", True, "bf16"), ("auto", "cuda", False, "fp16"), ("auto", "cpu", False, "fp32"),
    ("auto", "mps", False, "fp32"), ("fp16", "cuda", True, "fp16"), ("bf16", "cpu", False, "bf16"),
    ("fp32", "cuda", True, "fp32")])
def test_precision_rule_over_device_facts(requested, kind, bf16_native, chosen):
    assert choose_precision(requested, kind, bf16_native=bf16_native) == chosen


def test_bf16_on_a_card_without_it_names_the_card_and_the_fix():
    with pytest.raises(ConfigError, match="Tesla T4 has no native bf16.*train.precision=fp16 or auto"):
        choose_precision("bf16", "cuda", bf16_native=False, device_name="Tesla T4")


def test_auto_precision_on_cpu_is_fp32_and_explicit_bf16_autocasts():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32"
    with autocast(resolve_precision("bf16", cpu), cpu):
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    assert not make_scaler("bf16", cpu).is_enabled()
    assert make_scaler("fp16", cpu).is_enabled()
    assert not enable_tf32(cpu, True)


@pytest.mark.gpu
@cuda
def test_auto_is_bf16_on_ampere_and_newer_and_tf32_turns_on():
    device = torch.device("cuda")
    major = torch.cuda.get_device_capability()[0]
    assert resolve_precision("auto", device) == ("bf16" if major >= 8 else "fp16")
    assert enable_tf32(device, True) == (major >= 8)
    if major >= 8:
        assert torch.backends.cuda.matmul.allow_tf32


@pytest.mark.gpu
@cuda
def test_fp16_scaler_path_on_cuda(tmp_path):
    from tests.conftest import tiny_config
    from trainwise.rundir.layout import RunDir
    from trainwise.launch.runs import build_trainer

    run = RunDir(tmp_path / "run")
    trainer = build_trainer(tiny_config(train={"precision": "fp16", "max_steps": 20}), run)
    run.initialise()
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["precision"] == "fp16"
    assert trainer.scaler.is_enabled() and trainer.scaler.get_scale() > 0
