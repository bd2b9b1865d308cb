import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models on a shared CPU: threads only fight over the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
