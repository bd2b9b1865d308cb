"""`diagnose` flags throughput collapsing (6,000 -> 200 samples/s) while the host CPU is at 100% (issue 26)."""
from trainwise.diagnose.throughput import throughput_collapse


def _train(rates, seconds_apart=30.0):
    return [{"split": "train", "step": 10 * (i + 1), "time": 1000.0 + seconds_apart * i, "samples_per_s": r}
            for i, r in enumerate(rates)]


def test_a_collapse_with_a_busy_host_cpu_is_named():
    train = _train([900, 6000, 5800, 6100, 5900, 6000, 230, 210, 200, 220])
    system = [{"time": 1000.0 + 30.0 * t, "cpu_percent": 100.0 if t >= 6 else 40.0} for t in range(10)]
    finding = throughput_collapse(train, system)
    assert finding.code == "throughput_collapse" and finding.step == 70
    assert finding.evidence["samples_per_s_before"] == 6000 and finding.evidence["host_cpu_percent"] == 100
    assert "contended" in finding.detail


def test_a_healthy_run_with_noisy_rates_is_silent():
    assert throughput_collapse(_train([900, 6000, 4500, 6100, 3900, 6000, 4200, 5100, 5000, 4800]), []) is None
    assert throughput_collapse(_train([300, 4000, 4000, 4100, 4000, 3900, 4000, 4000, 1000, 4000]), []) is None


def test_a_slow_spell_of_a_second_is_not_a_collapse():
    """A tiny run on a busy machine: a few fast logs, then a second of slow ones, costs nothing to speak of."""
    assert throughput_collapse(_train([900, 6000, 5800, 6100, 5900, 6000, 230, 210, 200, 220], 0.2), []) is None
