"""`trainwise data bench` on a prepared interaction log: the loader of the windows shop-sasrec trains on,
against SASRec's own step timed on a real batch of them (item ids, not random floats)."""
import json

import torch

from tests.conftest import invoke
from trainwise.data.bench import default_recipe, sample_batch
from trainwise.recipes import load_recipe
from trainwise.recipes.factories import build_data


def _prepared_log(tmp_path, capsys):
    source = tmp_path / "u.data"
    source.write_text("".join(f"{u}\t{(u * 7 + k) % 40 + 1}\t4\t{1000 * u + k}\n"
                              for u in range(1, 61) for k in range(12)))
    assert invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "log"), "--split", "last-k").returncode == 0
    return tmp_path / "log"


def test_data_bench_times_sasrec_on_its_windows(tmp_path, capsys):
    log = _prepared_log(tmp_path, capsys)
    assert default_recipe(log) == "shop-sasrec"
    bundle = build_data(load_recipe("shop-sasrec", [f"data.path={log}"]))
    inputs, targets = sample_batch(bundle.train, 8)
    assert inputs.dtype == torch.int64 and inputs.shape == (8, 50) and 0 <= int(inputs.min())
    assert int(inputs.max()) <= bundle.spec.num_items and targets.shape == (8, 50)

    done = invoke(capsys, "data", "bench", str(log), "--workers", "auto,0", "--seconds", "0.2", "--batch-size",
                  "16", "--device", "cpu", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["recipe"] == "shop-sasrec" and result["batch_size"] == 16
    assert set(result["loader_samples_per_s"]) == {"auto", "0"} and result["model_samples_per_s"] > 0
    assert result["recommended_num_workers"] in ("auto", "0") and "samples/s" in result["message"]
