from __future__ import annotations

import pytest

from trainwise.data.bench import bench, bench_verdict
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.errors import DataError


def test_the_fewest_workers_that_keep_up_with_headroom_are_recommended():
    verdict = bench_verdict({"auto": 900.0, "0": 1000.0, "1": 5000.0, "3": 9000.0}, model_rate=3000.0)
    assert not verdict.bottleneck and verdict.workers == "1"
    assert verdict.message == ("the loader delivers 5,000 samples/s with num_workers=1, the model consumes 3,000: "
                               "data will not be the bottleneck; set data.num_workers=1")


def test_keeping_up_without_headroom_says_so():
    verdict = bench_verdict({"0": 1000.0, "2": 3100.0}, model_rate=3000.0)
    assert not verdict.bottleneck and verdict.workers == "2" and "little headroom" in verdict.message


def test_a_loader_slower_than_the_model_is_the_bottleneck():
    verdict = bench_verdict({"auto": 400.0, "0": 300.0, "2": 1000.0}, model_rate=4000.0)
    assert verdict.bottleneck and verdict.workers == "2"
    assert "data will be the bottleneck (the GPU waits 75% of the time)" in verdict.message


@pytest.mark.slow  # the optimizer's first import of torch._dynamo alone takes seconds
def test_bench_measures_a_prepared_table_against_its_recipe_model(tmp_path, write_csv):
    rows = [[i % 7, i % 3, "a" if i % 2 else "b"] for i in range(300)]
    source = write_csv(tmp_path / "t.csv", ["x", "label", "kind"], rows)
    prepare(source, tmp_path / "out", PrepareOptions(), workers=1)
    result = bench(tmp_path / "out", workers=["auto", 0], seconds=0.2, batch_size=32, device="cpu")
    assert set(result.loader) == {"auto", "0"} and all(rate > 0 for rate in result.loader.values())
    assert result.model > 0 and result.recipe == "table" and result.batch_size == 32
    assert "samples/s" in result.verdict.message


def test_bench_refuses_what_is_not_a_prepared_dataset(tmp_path):
    with pytest.raises(DataError, match="not a prepared dataset"):
        bench(tmp_path)
