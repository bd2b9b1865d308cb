"""Issue 17 §4, its last test: the SIGKILL/resume test extended to a damaged checkpoint. A run killed mid-way
whose `last.pt` then has 5,000 bytes zeroed resumes from the newest intact step checkpoint, says so, and still
ends with the weights of a run that was never interrupted, its curve logged once per step."""
import json

import pytest
from safetensors.torch import load_file

from tests.conftest import invoke, straight_and_killed

# checkpoints every 6 steps, three kept, so the one before `last` is there to fall back to
ARGS = ["breast-cancer", "train.max_steps=72", "train.log_every=1", "eval.every_steps=12",
        "eval.every_epoch=false", "checkpoint.every_steps=6", "checkpoint.keep_last=3",
        "eval.early_stopping.enabled=false", "telemetry.enabled=false"]


def _checkpointed_step(run_dir) -> int:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("last_checkpoint_step") or 0
    except (FileNotFoundError, ValueError):
        return 0


@pytest.mark.slow
def test_a_killed_run_with_a_zeroed_last_checkpoint_resumes_from_the_one_before_to_the_same_weights(tmp_path, capsys,
                                                                                                 one_thread):
    straight, killed, at = straight_and_killed(capsys, ARGS, tmp_path, _checkpointed_step, range(24, 72))

    last = killed / "checkpoints" / "last.pt"
    raw = bytearray(last.read_bytes())
    raw[1000:6000] = bytes(5000)  # torch would load this without a word; only the checksum tells
    last.write_bytes(bytes(raw))  # in place: `last` and its step file are one file

    resumed = invoke(capsys, "resume", str(killed), show_warnings=True)
    assert resumed.returncode == 0, resumed.stderr
    said = " ".join((resumed.stdout + resumed.stderr).split())
    assert "checkpoints/last.pt is damaged" in said
    assert f"step-{at - 6:08d}.pt (step {at - 6}) instead" in said
    assert f"resuming from step {at - 6} of 72" in said
    assert json.loads((killed / "summary.json").read_text())["status"] == "completed"

    a, b = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equal(b[name]), f"{name} differs after the fallback resume"
    steps = [r["step"] for r in map(json.loads, (killed / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"]
    assert steps == list(range(1, 73))  # the steps after the fallback checkpoint are not logged twice
