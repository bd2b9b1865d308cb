"""The doctor's software checks, run on recorded machines and on facts changed one field at a time."""
import dataclasses
import re
from pathlib import Path

import pytest

from trainwise.doctor.checks import has_kernels, run_checks
from trainwise.doctor.facts import load_facts
from trainwise.doctor.smoke import AllReduceFacts
from trainwise.findings import worst
from trainwise.doctor.install import driver_install_steps, pick_torch_wheel

FACTS = Path(__file__).parent / "facts"


def machine(name):
    return load_facts(FACTS / f"{name}.json")


def findings(facts):
    return {f.title: f for f in run_checks(facts)}


def change(facts, part, **fields):
    return dataclasses.replace(facts, **{part: dataclasses.replace(getattr(facts, part), **fields)})


def test_every_finding_is_complete():
    for path in FACTS.glob("*.json"):
        found = run_checks(load_facts(path))
        # the product's one record: a stable code per check (per card for the GPU checks), for scripts
        keys = [(f.code, f.evidence.get("gpu")) for f in found if f.code != "gpu_kernels"]
        assert len(keys) == len(set(keys)) and all(re.fullmatch(r"[a-z0-9_]+", f.code) for f in found)
        for f in found:
            assert f.severity in ("info", "warn", "error") and f.title and f.detail and "\n" not in f.detail
            assert isinstance(f.evidence, dict)
            if f.severity != "info":
                assert f.fixes, f"{path.stem}: {f.title} has no fix"


def test_this_machine_is_a_healthy_cpu_box():
    found = findings(machine("this_machine_cpu"))
    assert found["GPU visibility"].severity == "info" and "CPU" in found["GPU visibility"].detail
    assert found["PyTorch build"].detail.startswith("CPU build")
    assert worst(list(found.values())) != "error"


def test_t4_with_old_driver_fails_with_the_upgrade_path():
    found = findings(machine("t4_old_driver"))
    driver = found["Driver vs CUDA"]
    assert driver.severity == "error" and "driver too old" in driver.detail
    assert "560.28.03" in driver.fixes[0] and "ubuntu2004" in driver.fixes[0] and "cuda-keyring" in driver.fixes[0]
    assert "whl/cu118" in driver.fixes[0]  # or keep the driver: a torch built for CUDA 11
    assert found["GPU visibility"].severity == "error" and "driver too old" in found["GPU visibility"].detail
    assert found["Precision"].evidence["bf16"] is False and "fp16" in found["Precision"].detail


def test_h200_box_is_ready():
    found = findings(machine("h200"))
    for title in ("PyTorch build", "GPU visibility", "Driver vs CUDA", "GPU kernels", "Install guidance",
                  "GPU 0 temperature", "GPU 0 clocks", "GPU 0 memory errors", "GPU 0 in use"):
        assert found[title].severity == "info", (title, found[title].detail)
    assert found["Precision"].evidence["bf16"] and found["Precision"].evidence["tf32"]
    assert "cudnn" in found["PyTorch build"].evidence and "9.7.1" in found["PyTorch build"].detail


def test_cpu_torch_on_a_gpu_machine_names_the_wheel():
    found = findings(machine("cpu_torch_on_gpu"))
    visibility = found["GPU visibility"]
    assert visibility.severity == "error" and "Torch not compiled with CUDA" in visibility.detail
    assert "pip uninstall -y torch" in visibility.fixes[0] and "download.pytorch.org/whl/cu126" in visibility.fixes[0]
    assert found["Python environment"].severity == "warn" and "python3 -m venv" in found["Python environment"].fixes[0]


def test_blackwell_card_with_an_old_wheel_has_no_kernels():
    kernels = findings(machine("rtx5090_old_wheel"))["GPU kernels"]
    assert kernels.severity == "error" and "no kernel image is available" in kernels.detail
    assert kernels.fixes[0].endswith("whl/cu128")


def test_two_gpus_without_p2p_warn_and_a_failed_all_reduce_fails():
    facts = machine("two_gpu_hot")
    found = findings(facts)
    assert found["Peer access"].severity == "warn" and "0↔1" in found["Peer access"].detail
    assert found["All-reduce"].severity == "info"
    broken = change(facts, "torch", all_reduce=AllReduceFacts("nccl", 2, ok=False, seconds=60.0, error="hung"))
    failed = findings(broken)["All-reduce"]
    assert failed.severity == "error" and "NCCL_DEBUG=INFO" in failed.fixes[0]
    linked = change(facts, "torch", peer_access=[[True, True], [True, True]])
    assert findings(linked)["Peer access"].severity == "info"


@pytest.mark.parametrize("cvd", ["", "-1"])
def test_cuda_visible_devices_that_hides_every_gpu(cvd):
    facts = machine("h200")
    hidden = change(change(facts, "host", cuda_visible_devices=cvd), "torch", device_count=0, devices=[],
                    cuda_available=False, arch_list=[])
    found = findings(hidden)["GPU visibility"]
    assert found.severity == "error" and "hides every GPU" in found.detail
    assert "unset CUDA_VISIBLE_DEVICES" in found.fixes[0]


def test_fewer_gpus_in_torch_than_nvml():
    facts = machine("two_gpu_hot")
    one = change(facts, "torch", device_count=1, devices=facts.torch.devices[:1], peer_access=None, all_reduce=None)
    assert findings(one)["GPU visibility"].severity == "warn"
    explained = change(one, "host", cuda_visible_devices="0")
    assert findings(explained)["GPU visibility"].severity == "info"


def test_torch_sees_no_gpu_for_another_reason_quotes_torch():
    facts = change(machine("h200"), "torch", device_count=0, devices=[], cuda_available=False, arch_list=[],
                   cuda_error="CUDA unknown error - this may be due to an incorrectly set up environment")
    found = findings(facts)["GPU visibility"]
    assert found.severity == "error" and "CUDA unknown error" in found.detail


def test_gpu_on_the_bus_without_a_driver():
    facts = change(machine("this_machine_cpu"), "host", nvidia_pci_devices=1)
    found = findings(facts)
    assert found["GPU visibility"].severity == "error" and "debian12" in found["GPU visibility"].fixes[0]
    assert found["Install guidance"].severity == "warn" and "cuda-drivers" in found["Install guidance"].fixes[0]


def test_driver_one_minor_behind_runs_by_minor_version_compatibility():
    facts = change(machine("h200"), "nvml", cuda_driver_version="12.4", driver_version="550.54.14")
    found = findings(facts)["Driver vs CUDA"]
    assert found.severity == "warn" and "minor-version compatibility" in found.detail and "570.26" in found.fixes[0]


@pytest.mark.parametrize("python, numpy, torch, status", [
    ("3.11.9", "2.1.3", "2.13.0", "info"), ("3.9.18", "1.26.4", "2.13.0", "error"),
    ("3.11.9", "2.1.3", "2.2.2", "error"),
    ("3.11.9", "1.26.4", "2.2.2", "info")])
def test_versions(python, numpy, torch, status):
    facts = change(change(machine("h200"), "python", version=python, numpy_version=numpy), "torch", version=torch)
    assert findings(facts)["Versions"].severity == status


def test_conda_env_is_fine():
    facts = change(machine("cpu_torch_on_gpu"), "python", conda_prefix="/opt/conda/envs/train")
    assert findings(facts)["Python environment"].severity == "info"


def test_pip_conflicts_become_one_install_command():
    facts = change(machine("h200"), "python", pip_conflicts=[
        "torchvision 0.20.0 has requirement torch==2.5.0, but you have torch 2.13.0.",
        "litdata 0.2.76 requires torchvision, which is not installed."])
    found = findings(facts)["Package conflicts"]
    assert found.severity == "warn" and found.fixes[0] == 'pip install "torch==2.5.0" "torchvision"'
    assert "Package conflicts" not in findings(change(facts, "python", pip_check_ran=False))


def test_cuda_build_missing_pieces_warn():
    facts = machine("two_gpu_hot")
    assert findings(change(facts, "torch", cudnn_version=None))["PyTorch build"].severity == "warn"
    no_nccl = findings(change(facts, "torch", nccl_available=False, nccl_version=None))["PyTorch build"]
    assert no_nccl.severity == "warn" and "gloo" in no_nccl.detail


def test_tf32_enabled_is_reported():
    found = findings(change(machine("h200"), "torch", float32_matmul_precision="high"))["Precision"]
    assert "TF32 enabled" in found.detail and found.fixes == ()


@pytest.mark.parametrize("cc, arch, ok", [
    ((8, 6), ["sm_80"], True), ((8, 0), ["sm_86"], False), ((9, 0), ["sm_80", "compute_80"], True),
    ((12, 0), ["sm_90", "sm_90a"], False), ((7, 5), ["sm_75"], True), ((3, 7), ["sm_50", "sm_90"], False),
    ((10, 0), ["sm_100a"], True)])
def test_has_kernels(cc, arch, ok):
    assert has_kernels(cc, arch) is ok


@pytest.mark.parametrize("driver, cards, wheel", [
    ((12, 8), [(9, 0)], "cu128"), ((12, 4), [(8, 9)], "cu126"), ((11, 4), [(7, 5)], "cu118"),
    ((13, 0), [(9, 0)], "cu130"), ((13, 0), [(7, 0)], "cu128"), ((12, 8), [(3, 5)], None)])
def test_torch_wheel_for_driver_and_cards(driver, cards, wheel):
    assert pick_torch_wheel(driver, cards) == wheel


def test_driver_steps_per_os():
    assert "repos/ubuntu2404/sbsa/cuda-keyring" in driver_install_steps("ubuntu", "24.04", "aarch64")
    assert "rhel9/x86_64/cuda-rhel9.repo" in driver_install_steps("rocky", "9.4", "x86_64")
    assert "driver-installation-guide" in driver_install_steps("arch", None, "x86_64")
