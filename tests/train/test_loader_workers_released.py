"""When fit returns, the loader's persistent worker processes are gone: left to the garbage collector they
stalled a later collection by torch's 5 s join timeout per worker."""
import psutil
import torch

from tests.conftest import tiny_config
from tests.train.test_gpu_terms import SPEC, NoisyDataset
from trainwise import RunDir, Trainer
from trainwise.train.callbacks.base import Callback


def test_fit_stops_its_loader_workers_before_returning(tmp_path):
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    config = tiny_config(train={"max_steps": 6, "batch_size": 16, "log_every": 3, "device": "cpu"},
                         data={"num_workers": 2}, eval={"every_steps": None, "every_epoch": False})
    workers_seen = []

    class CountChildren(Callback):
        def on_step_end(self, trainer):
            workers_seen.append(len(psutil.Process().children(recursive=True)))

    Trainer(model, NoisyDataset(), config=config, run_dir=RunDir.create(tmp_path / "run"), data_spec=SPEC,
            callbacks=[CountChildren()]).fit()
    assert max(workers_seen) >= len(before) + 2  # the two workers ran during training
    alive = {child.pid for child in psutil.Process().children(recursive=True) if child.is_running()
             and child.status() != psutil.STATUS_ZOMBIE}
    assert alive <= before, f"loader workers still running after fit: {sorted(alive - before)}"
