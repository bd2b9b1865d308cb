"""Facts: probes on this machine, NVML probing through a fake pynvml, and the JSON round trip that lets
recorded machines be checked anywhere."""
import json
import os
from pathlib import Path

import pytest
import torch

from tests.doctor.fake_nvml import FakeGpu, install_fake_nvml
from trainwise.doctor.facts import (Facts, collect_facts, facts_from_dict, facts_to_dict, load_facts, probe_host,
                                    probe_nvml, probe_torch, save_facts)
from trainwise.errors import ConfigError

FACTS_DIR = Path(__file__).parent / "facts"
RECORDED = sorted(FACTS_DIR.glob("*.json"))


def test_there_are_recorded_machines():
    names = {p.stem for p in RECORDED}
    assert {"this_machine_cpu", "t4_old_driver", "h200", "two_gpu_hot", "cpu_torch_on_gpu",
            "docker_small_shm"} <= names


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_recorded_facts_load_and_round_trip(path):
    facts = load_facts(path)
    assert isinstance(facts, Facts) and facts.description
    assert facts_to_dict(facts) == json.loads(path.read_text())
    assert facts_from_dict(json.loads(json.dumps(facts_to_dict(facts)))) == facts


def test_this_machine_round_trips_through_a_file(tmp_path):
    facts = collect_facts(tmp_path, pip_check=False, all_reduce=False)
    assert facts.description.startswith("Recorded by trainwise doctor") and facts.recorded_at
    saved = save_facts(facts, tmp_path / "facts.json")
    assert load_facts(saved) == facts


def test_torch_probe_matches_torch():
    t = probe_torch(all_reduce=False)
    assert t.installed and t.version == torch.__version__ and t.cuda == torch.version.cuda
    assert t.cuda_available == torch.cuda.is_available()
    assert t.device_count == (torch.cuda.device_count() if t.cuda_available else 0)


def test_host_probe_reads_this_machine():
    h = probe_host()
    assert 1 <= h.cpu_usable <= h.cpu_logical == os.cpu_count()
    assert 0 < h.ram_available_bytes <= h.ram_total_bytes
    if Path("/dev/shm").is_dir():
        assert h.shm_total_bytes == os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize


def test_nvml_missing_is_a_normal_answer(monkeypatch):
    install_fake_nvml(monkeypatch, [], init_error="NVML Shared Library Not Found")
    n = probe_nvml()
    assert not n.available and "no NVIDIA driver" in n.error and n.gpus == []


def test_nvml_probe_reads_every_field(monkeypatch):
    card = FakeGpu(temperature=83, fan=None, reasons=0x1 | 0x20, processes=[(4242, 3 * 2**30), (os.getpid(), 2**29)])
    fake = install_fake_nvml(monkeypatch, [card, FakeGpu(name="NVIDIA GeForce RTX 4090", cc=(8, 9), ecc=None, fan=40)])
    n = probe_nvml()
    assert n.available and n.driver_version == "570.124.06" and n.cuda_driver_version == "12.8"
    h200, geforce = n.gpus
    assert h200.name == "NVIDIA H200" and h200.compute_capability == [9, 0]
    assert h200.temperature_c == 83 and h200.slowdown_temperature_c == 90 and h200.power_limit_w == 700.0
    assert h200.throttle_reasons == ["gpu_idle", "sw_thermal_slowdown"]
    assert h200.fan_pct is None  # NotSupported on passive cards
    assert [p.pid for p in h200.processes] == [4242]  # doctor's own process is not a tenant
    assert h200.ecc_enabled and h200.ecc_uncorrected_volatile == 0 and h200.row_remap_pending is False
    assert geforce.ecc_enabled is None and geforce.ecc_uncorrected_volatile is None and geforce.fan_pct == 40
    assert fake.state["initialised"] == 0  # NVML shut down again


@pytest.mark.parametrize("content, message", [("{", "not JSON"), ('{"python": {}}', "not a trainwise facts record")])
def test_bad_facts_files_are_user_errors(tmp_path, content, message):
    path = tmp_path / "facts.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_facts(path)


def test_missing_facts_file_is_a_user_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_facts(tmp_path / "nope.json")
