"""The table rules of the sanity checks (constant features, scale, train/test duplicates, classes missing
from a split, imbalance of item-id labels) do not fire on padded item-id sequences, where they mean nothing;
they still fire on tables. Padded targets (ignore_index -100) are not counted as class 0."""
import torch

from trainwise.check.sanity import split_data
from trainwise.diagnose.sanity_data import SplitData, data_findings, id_sequences
from trainwise.recipes import load_recipe
from trainwise.recipes.factories import build_data

SMALL_SHOP = ["data.args.users=300", "data.args.items=200", "data.args.events=6000", "telemetry.enabled=false"]


def _codes(findings):
    return sorted(f.code for f in findings)


def _shop_findings(recipe):
    bundle = build_data(load_recipe(recipe, SMALL_SHOP))
    splits = [split_data(name, getattr(bundle, name)) for name in ("train", "val", "test")]
    return data_findings(splits, task="classification", num_classes=bundle.spec.num_classes), splits


def test_next_item_sequences_give_only_the_label_distribution():
    findings, splits = _shop_findings("shop-sasrec")
    assert id_sequences(splits)
    assert _codes(findings) == ["label_distribution"]
    counts = findings[0].evidence["counts"]["train"]
    padded = int((splits[0].targets == -100).sum())
    assert padded > 0 and sum(counts.values()) == int((splits[0].targets >= 0).sum())  # padding not counted
    assert len(findings[0].detail) < 2000  # 200 item classes are summarised, not listed one by one


def test_click_sequences_keep_the_click_label_rules_but_not_the_held_out_split_rule():
    findings, splits = _shop_findings("shop-din")
    assert splits[2].targets.unique().tolist() == [1]  # the test split holds the clicked events only
    assert _codes(findings) == ["label_distribution"]


def _padded_histories(rows: int = 64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 500, (rows, 8), generator=generator)
    ids[:, :3] = 0  # short histories: the first positions are padding in every row
    return ids


def test_table_rules_skip_id_sequences_and_still_fire_on_tables():
    histories = _padded_histories()
    labels = torch.randint(0, 2, (64,), generator=torch.Generator().manual_seed(1))
    test = SplitData("test", histories[:10].clone(), torch.ones(10, dtype=torch.long))  # copies of train rows
    as_ids = [SplitData("train", histories, labels), test]
    assert _codes(data_findings(as_ids, num_classes=2)) == ["label_distribution"]
    # the same numbers as a table of float features: constant columns, a scale of hundreds, duplicated rows,
    # a class missing from test
    as_table = [SplitData("train", histories.float(), labels), SplitData("test", test.inputs.float(), test.targets)]
    assert _codes(data_findings(as_table, num_classes=2)) == [
        "classes_missing_from_split", "constant_features", "label_distribution", "train_test_leakage",
        "unnormalised_inputs"]


def test_ignore_index_targets_are_no_class_in_any_data():
    targets = torch.tensor([0, 1, -100, -100, -100, 1, 0, 1])
    [distribution] = data_findings([SplitData("train", torch.randn(8, 3), targets)], num_classes=2)
    assert distribution.evidence["counts"]["train"] == {"0": 2, "1": 3}
