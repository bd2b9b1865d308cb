"""Probes: the CPU allocator's real peak, a few timed steps, the facts of this machine."""
import torch
from torch import nn

from trainwise.plan.memory import TrainingStep, trace_step
from trainwise.plan.probe import cpu_peak_bytes, probe_steps, read_machine


def test_cpu_peak_counts_what_was_alive_together():
    def run():
        a = torch.empty(1_000_000)  # 4 MB
        b = torch.empty(500_000)  # 2 MB alongside
        del a, b
        c = torch.empty(250_000)  # 1 MB, after both are gone
        del c

    assert cpu_peak_bytes(run) == 6_000_000


def test_probe_times_real_steps_and_measures_the_peak_the_trace_predicts():
    step = TrainingStep(build_model=lambda: nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3)),
                        input_shape=(20,), num_classes=3, micro_batch_size=32)
    result = probe_steps(step, torch.device("cpu"), steps=3)
    assert result.steps_timed == 3 and 0 < result.step_time_s < 5
    assert result.peak_bytes == trace_step(step).peak_bytes


def test_machine_facts():
    facts = read_machine()
    assert facts.cpu_cores >= 1 and facts.ram_bytes > facts.ram_available_bytes > 0
    assert facts.disk_free_bytes > 0 and facts.torch_threads >= 1
    assert isinstance(facts.to_dict()["cpu_flags"], (tuple, list))


def test_machine_facts_count_the_cores_as_the_loader_does(monkeypatch):
    import trainwise.data.loader as loader

    monkeypatch.setattr(loader, "usable_cores", lambda: 3)  # e.g. taskset or docker --cpus on a big host
    assert read_machine().cpu_cores == 3
