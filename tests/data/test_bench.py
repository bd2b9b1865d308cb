from __future__ import annotations

from trainwise.data.bench import bench_verdict


def test_the_setting_measured_fastest_is_recommended_with_the_numbers():
    # what a user saw: 0 workers at 60k samples/s, auto at 36k, and the bench recommended auto
    verdict = bench_verdict({"auto": 36_000.0, "0": 60_000.0, "2": 41_000.0}, model_rate=3000.0)
    assert not verdict.bottleneck and verdict.workers == "0"
    assert verdict.message == ("num_workers=0 loaded the most, 60,000 samples/s (others: auto: 36,000, 2: 41,000); "
                               "the model consumes 3,000: data will not be the bottleneck; set data.num_workers=0")


def test_rates_within_noise_of_the_best_go_to_the_cheaper_setting_measured_first():
    verdict = bench_verdict({"auto": 9_800.0, "0": 5_000.0, "4": 10_000.0}, model_rate=3000.0)
    assert verdict.workers == "auto"


def test_keeping_up_without_headroom_says_so():
    verdict = bench_verdict({"0": 1000.0, "2": 3100.0}, model_rate=3000.0)
    assert not verdict.bottleneck and verdict.workers == "2" and "little headroom" in verdict.message


def test_a_loader_slower_than_the_model_is_the_bottleneck():
    verdict = bench_verdict({"auto": 400.0, "0": 300.0, "2": 1000.0}, model_rate=4000.0)
    assert verdict.bottleneck and verdict.workers == "2"
    assert "data will be the bottleneck (the GPU waits 75% of the time)" in verdict.message


def test_bench_sets_the_loader_against_the_model_rate_it_is_given(tmp_path, write_csv):
    """Data sits below training: the model's rate comes in as a function of the data's spec and the batch."""
    import torch

    from trainwise.data.bench import bench, default_recipe
    from trainwise.data.prepared import data_spec
    from trainwise.data.shards import read_manifest
    from trainwise.data.prepare import PrepareOptions, prepare
    from trainwise.recipes import load_recipe

    rows = [[i % 7, i % 3, "a" if i % 2 else "b"] for i in range(300)]
    prepare(write_csv(tmp_path / "t.csv", ["x", "label", "kind"], rows), tmp_path / "out", PrepareOptions(),
            workers=1)
    asked = []

    def fast_model(spec, batch):
        inputs, targets = batch  # a real batch of the prepared rows, in the data's shapes
        asked.append((spec.task, len(inputs), tuple(inputs.shape[1:]), targets.dtype))
        return 1e12

    recipe = default_recipe(tmp_path / "out")
    config = load_recipe(recipe, [f"data.path={tmp_path / 'out'}"])
    result = bench(tmp_path / "out", config, fast_model, recipe=recipe, device=torch.device("cpu"), workers=[0],
                   batch_size=16, seconds=0.1)
    shape = tuple(data_spec(read_manifest(tmp_path / "out")).input_shape)
    assert recipe == "table" and asked == [("classification", 16, shape, torch.int64)]
    assert result.model == 1e12 and result.verdict.bottleneck and result.batch_size == 16
