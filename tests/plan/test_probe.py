"""Probes: the CPU allocator's real peak, a few timed steps, the facts of this machine."""
import torch
from torch import nn

from trainwise.plan.memory import trace_step
from trainwise.plan.traced_step import TrainingStep
from trainwise.plan.probe import cpu_peak_bytes, probe_steps, read_machine


def test_cpu_peak_counts_what_was_alive_together():
    def run():
        a = torch.empty(1_000_000)  # 4 MB
        b = torch.empty(500_000)  # 2 MB alongside
        del a, b
        c = torch.empty(250_000)  # 1 MB, after both are gone
        del c

    assert cpu_peak_bytes(run) == 6_000_000


def _step() -> TrainingStep:
    return TrainingStep(build_model=lambda: nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3)),
                        input_shape=(20,), num_classes=3, micro_batch_size=32)


def test_probe_times_real_steps_and_measures_the_peak_the_trace_predicts():
    step = _step()
    result = probe_steps(step, torch.device("cpu"), steps=3, time_limit_s=float("inf"))
    assert result.steps_timed == 3 and result.step_time_s > 0  # how long is a benchmark's question, not a test's
    assert result.peak_bytes == trace_step(step).peak_bytes


class _Clock:
    """A perf_counter that moves `tick` seconds each time it is read: step times known in advance."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def test_the_step_time_is_the_median_and_the_time_limit_ends_the_probe(monkeypatch):
    import trainwise.plan.probe as probe

    monkeypatch.setattr(probe, "time", _Clock(tick=1.0))  # each timed step reads as 1 s; each check adds 1 s
    result = probe_steps(_step(), torch.device("cpu"), steps=50, time_limit_s=7.5)
    assert result.step_time_s == 1.0
    assert result.steps_timed == 3  # the 3rd step's check sees 9 s > 7.5 s: stopped long before 50 steps


def test_machine_facts():
    facts = read_machine()
    assert facts.cpu_cores >= 1 and facts.ram_bytes > facts.ram_available_bytes > 0
    assert facts.disk_free_bytes > 0 and facts.torch_threads >= 1
    assert isinstance(facts.to_dict()["cpu_flags"], (tuple, list))


def test_machine_facts_count_the_cores_as_the_loader_does(monkeypatch):
    import trainwise.data.loader as loader

    monkeypatch.setattr(loader, "usable_cores", lambda: 3)  # e.g. taskset or docker --cpus on a big host
    assert read_machine().cpu_cores == 3
