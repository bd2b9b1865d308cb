"""The all-reduce smoke test runs for real (gloo on CPU processes) and always comes back."""
import pytest

from trainwise.doctor.smoke import run_all_reduce


@pytest.mark.slow
def test_two_process_all_reduce_works():
    result = run_all_reduce(world_size=2, backend="gloo", timeout_s=120)
    assert result.ok, result.error
    assert result.world_size == 2 and result.seconds > 0


def test_a_hung_all_reduce_comes_back_as_a_failure():
    result = run_all_reduce(world_size=2, backend="gloo", timeout_s=0.01)
    assert not result.ok and "hung" in result.error
