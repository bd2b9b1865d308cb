from __future__ import annotations

import numpy as np
import pytest

import trainwise.data
from trainwise.data import table_files, tables
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.errors import DataError


def churn_rows(n: int = 200, seed: int = 0) -> list[list]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        plan = ("basic", "pro", "team", "")[i % 4]  # "" = missing category
        age = int(rng.integers(18, 80))
        spend = "" if i % 13 == 0 else round(float(rng.normal(50, 10)), 2)  # missing number
        label = "" if i % 25 == 0 else ("churned" if age > 50 else "stayed")  # missing label
        rows.append([age, plan, spend, label])
    return rows


def test_categorical_columns_are_one_hot_and_rows_without_label_are_skipped(tmp_path, write_csv):
    source = write_csv(tmp_path / "churn.csv", ["age", "plan", "spend", "label"], churn_rows())
    result = prepare(source, tmp_path / "out", PrepareOptions(), workers=1)
    manifest = result.manifest
    assert manifest["kind"] == "table" and manifest["task"] == "classification"
    assert manifest["class_names"] == ["churned", "stayed"]
    assert manifest["features"][:2] == ["age", "spend"]
    assert set(manifest["features"][2:]) == {"plan=basic", "plan=pro", "plan=team", "plan=<other>"}
    assert manifest["skipped"]["count"] == 8 and manifest["skipped"]["rows"][:2] == [1, 26]
    assert sum(s["count"] for s in manifest["splits"].values()) == 192
    features = trainwise.data.open(tmp_path / "out", "train", normalize=False)
    raw, _ = features.__getitems__(list(range(len(features))))
    one_hot = raw[:, 2:]
    assert raw.dtype.is_floating_point and not raw.isnan().any()  # blanks were filled
    assert bool((one_hot.sum(1) == 1).all()), "each row has exactly one category (blank → <other>)"


def test_normalisation_statistics_come_from_the_training_split_only(tmp_path, write_csv):
    rows = [[float(i), "a" if i % 2 else "b", i % 2] for i in range(300)]
    source = write_csv(tmp_path / "t.csv", ["x", "kind", "target"], rows)
    out = tmp_path / "out"
    manifest = prepare(source, out, PrepareOptions(val_fraction=0.2, test_fraction=0.2), workers=1).manifest
    train_x = trainwise.data.open(out, "train", normalize=False).column("inputs")[:, 0]
    all_x = np.arange(300.0)
    assert manifest["normalization"]["mean"][0] == pytest.approx(train_x.mean())
    assert abs(train_x.mean() - all_x.mean()) > 1e-6  # so the check above tells train-only from all rows
    normalised = trainwise.data.open(out, "train").column("inputs")  # raw column, stats applied in batches
    inputs, _ = trainwise.data.open(out, "train").__getitems__(list(range(len(normalised))))
    assert float(inputs[:, 0].mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(inputs[:, 0].std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)


def test_unseen_category_in_val_goes_to_other(tmp_path):
    encoder = tables.TableEncoder.fit({"city": np.array(["oslo", "rome", "oslo", None], dtype=object)},
                                      np.array([0, 1, 2]))
    encoded = encoder.transform({"city": np.array(["rome", "lima", None], dtype=object)})
    assert encoder.feature_names == ["city=oslo", "city=rome", "city=<other>"]
    np.testing.assert_array_equal(encoded, [[0, 1, 0], [0, 0, 1], [0, 0, 1]])


def test_a_numeric_label_with_many_values_is_regression(tmp_path, write_csv):
    rng = np.random.default_rng(1)
    rows = [[float(x), float(3 * x + rng.normal())] for x in rng.normal(size=200)]
    source = write_csv(tmp_path / "r.csv", ["x", "y"], rows)
    manifest = prepare(source, tmp_path / "out", PrepareOptions(), workers=1).manifest
    assert manifest["task"] == "regression" and manifest["class_names"] is None
    assert manifest["schema"]["targets"]["dtype"] == "float32"
    bundle = trainwise.data.prepared.prepared_bundle(tmp_path / "out")
    assert bundle.spec.task == "regression" and bundle.spec.num_classes is None


def test_parquet_and_the_csv_module_fallback_read_the_same_table(tmp_path, monkeypatch, write_csv):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = churn_rows(60)
    source = write_csv(tmp_path / "churn.csv", ["age", "plan", "spend", "label"], rows)
    with_arrow = table_files.read_columns(source)
    pq.write_table(pa.table({"age": [r[0] for r in rows], "plan": [r[1] or None for r in rows],
                             "spend": [r[2] if r[2] != "" else None for r in rows],
                             "label": [r[3] or None for r in rows]}), tmp_path / "churn.parquet")
    from_parquet = table_files.read_columns(tmp_path / "churn.parquet")
    fallback = dict(zip(*table_files._read_csv_module(source, ",", None)))
    for name in ("age", "spend"):
        np.testing.assert_array_equal(with_arrow[name], fallback[name])
        np.testing.assert_array_equal(with_arrow[name], from_parquet[name])
    assert list(with_arrow["plan"]) == list(fallback["plan"]) == list(from_parquet["plan"])


def test_a_missing_label_column_is_named_with_the_columns(tmp_path, write_csv):
    source = write_csv(tmp_path / "t.csv", ["a", "b"], [[1, 2], [3, 4]])
    with pytest.raises(DataError, match=r"--label NAME \(columns: a, b\)"):
        prepare(source, tmp_path / "out", PrepareOptions(kind="table"))
    with pytest.raises(DataError, match="no label column 'c'"):
        prepare(source, tmp_path / "out", PrepareOptions(kind="table", label="c"))
