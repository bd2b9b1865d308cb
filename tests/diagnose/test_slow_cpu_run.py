"""`trainwise train` says before step 1 when a CPU run is planned to take over ~30 minutes, with the levers."""
from tests.conftest import tiny_config
from trainwise.check.sanity import slow_cpu_run
from trainwise.findings import Finding
from trainwise.rundir.layout import RunDir
from trainwise.train.callbacks.live_diagnosis import SanityFindings
from trainwise.launch.runs import build_trainer


def _probe(seconds):
    return Finding("overfit_probe", "info", "overfits one batch", "", {"steps": 40, "rows": 64, "seconds": seconds})


def test_a_long_cpu_run_is_said_with_its_levers():
    # 40 probe steps of 64 rows in 8 s on one thread: 0.2 s a 128-sample step on 2 threads, 875 x 15 steps
    finding = slow_cpu_run([_probe(8.0)], batch_size=128, max_steps=875 * 15, threads=2, full_softmax=True)
    assert finding.code == "slow_on_cpu" and "44 min" in finding.title
    assert "model.args.loss=sampled" in finding.title and "GPU" in finding.title
    assert slow_cpu_run([_probe(8.0)], batch_size=128, max_steps=500, threads=2) is None
    assert slow_cpu_run([], batch_size=128, max_steps=10**9, threads=2) is None  # no probe: nothing to say


def test_train_warns_before_the_first_step(tmp_path):
    trainer = build_trainer(tiny_config(train={"max_steps": 50_000_000, "device": "cpu"}), RunDir(tmp_path / "r"))
    said = next(c for c in trainer.callbacks.callbacks if isinstance(c, SanityFindings))
    assert [f.code for f in said.findings if f.code == "slow_on_cpu"] == ["slow_on_cpu"]
