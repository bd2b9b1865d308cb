from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

import trainwise.data
from trainwise.data.bundle import check_labels
from trainwise.data.loader import LoaderSettings, build_loader, choose_loader_settings
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.data.prepared import prepared_bundle
from trainwise.errors import DataError


@pytest.fixture
def prepared(image_folder, tmp_path):
    out = tmp_path / "prepared"
    prepare(image_folder, out, PrepareOptions(size="8", shard_size=4, val_fraction=0.2, test_fraction=0.2),
            workers=1)
    return out


@pytest.mark.parametrize("targets_in_memory", [True, False], ids=["targets-column", "targets-per-shard"])
def test_batched_access_across_shards_matches_one_by_one(prepared, monkeypatch, targets_in_memory):
    import trainwise.data.prepared as module

    monkeypatch.setattr(module, "TARGETS_IN_MEMORY_BYTES", 2**30 if targets_in_memory else 0)
    dataset = trainwise.data.open(prepared, "train")
    assert dataset._targets_in_memory is targets_in_memory
    assert len(dataset.shards) > 3, "the batch below spans several shards"
    indices = [len(dataset) - 1, 0, 5, 4, 6, 7, 1, -1, 2, 3]  # across shards, a repeat, a run in one shard
    inputs, targets = dataset.__getitems__(indices)
    assert inputs.shape == (10, 3, 8, 8) and inputs.dtype == torch.float32 and targets.dtype == torch.int64
    for row, index in enumerate(indices):
        x, y = dataset[index]
        assert torch.equal(inputs[row], x) and int(targets[row]) == int(y)
    stored = {field: np.concatenate([np.load(prepared / shard["files"][field]["file"]) for shard in dataset.shards])
              for field in ("inputs", "targets")}  # the shard files read whole, the plain way
    raw = dataset.gather(indices)
    assert np.array_equal(raw["inputs"], stored["inputs"][indices])
    assert np.array_equal(targets.numpy(), stored["targets"][indices])
    with pytest.raises(IndexError):
        dataset.__getitems__([len(dataset)])


def test_shards_are_memory_mapped_not_loaded(prepared):
    dataset = trainwise.data.open(prepared, "train")
    dataset.__getitems__([0])
    for shard in dataset._open():
        base = shard["inputs"]
        while not isinstance(base, mmap.mmap):  # a view of a view ... of the file's map, never a copy
            assert base is not None, "a shard was read into memory"
            base = base.base


def test_worker_processes_deliver_the_same_batches(prepared):
    dataset = trainwise.data.open(prepared, "train")
    sampler = BatchSampler(SequentialSampler(dataset), 5, drop_last=False)
    in_process = list(build_loader(dataset, sampler, LoaderSettings(0, False, False, None)))
    with_workers = list(build_loader(dataset, sampler, LoaderSettings(2, False, False, 2)))
    assert len(in_process) == len(with_workers) == -(-len(dataset) // 5)
    for (a, ya), (b, yb) in zip(in_process, with_workers):
        assert torch.equal(a, b) and torch.equal(ya, yb)


def test_prepared_bundle_gives_the_trainer_its_spec(prepared):
    bundle = prepared_bundle(prepared, augment=True)
    spec = bundle.spec
    assert spec.input_shape == (3, 8, 8) and spec.num_classes == 3
    assert spec.class_names == ("cat", "dog", "fish") and spec.task == "classification"
    assert spec.num_train == len(bundle.train) and len(bundle.val) and len(bundle.test)
    assert bundle.train.batched and bundle.augment is not None
    check_labels(bundle)  # reads `.targets`, no per-sample pass
    batch, _ = bundle.train.__getitems__([0, 1])
    assert bundle.augment(batch).shape == batch.shape


def test_open_names_what_is_missing(prepared, tmp_path):
    with pytest.raises(DataError, match="no 'holdout' split"):
        trainwise.data.open(prepared, "holdout")
    with pytest.raises(DataError, match="not a prepared dataset"):
        trainwise.data.open(tmp_path, "train")


def test_loader_settings_follow_cores_and_device(monkeypatch):
    import trainwise.data.loader as loader

    monkeypatch.setattr(loader.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(loader, "cgroup_cpu_quota", lambda: None)
    monkeypatch.setattr(loader, "_free_memory", lambda: (64 * 2**30, 32 * 2**30))
    gpu = choose_loader_settings(torch.device("cuda"))
    assert gpu.num_workers == 8 and gpu.pin_memory and gpu.persistent_workers and gpu.prefetch_factor
    cpu = choose_loader_settings(torch.device("cpu"), 0)
    assert cpu == LoaderSettings(0, False, False, None)


def test_shuffled_loader_covers_every_sample_once_per_epoch(prepared):
    dataset = trainwise.data.open(prepared, "train")
    sampler = BatchSampler(RandomSampler(dataset, generator=torch.Generator().manual_seed(0)), 3, False)
    seen = torch.cat([y for _, y in build_loader(dataset, sampler, choose_loader_settings(torch.device("cpu"), 0))])
    assert torch.equal(seen.sort().values, dataset.targets.sort().values)


def test_auto_workers_read_prepared_data_on_threads_in_order(prepared):
    from trainwise.data.loader import PrefetchingLoader

    dataset = trainwise.data.open(prepared, "train")
    sampler = BatchSampler(SequentialSampler(dataset), 4, drop_last=False)
    loader = build_loader(dataset, sampler, choose_loader_settings(torch.device("cpu"), "auto"))
    assert isinstance(loader, PrefetchingLoader) and len(loader) == len(sampler)
    expected = list(build_loader(dataset, sampler, LoaderSettings(0, False, False, None)))
    got = list(loader)
    assert len(got) == len(expected)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected))
    for _ in zip(range(2), loader):  # abandoning an epoch midway must not hang or leak threads
        pass
    assert not any(t.name.startswith("trainwise-loader") and t.is_alive()
                   for t in __import__("threading").enumerate())


def test_a_read_error_on_a_loader_thread_reaches_the_training_loop(prepared):
    dataset = trainwise.data.open(prepared, "train")
    loader = build_loader(dataset, [[0, 1], [10_000]], choose_loader_settings(torch.device("cpu"), "auto"))
    with pytest.raises(IndexError):
        list(loader)


def test_unknown_data_args_are_named(prepared):
    from trainwise.errors import ConfigError

    with pytest.raises(ConfigError, match="not size"):
        prepared_bundle(prepared, size=32)
