"""The finer partition of a behaviour log: sessions cut by inactivity (`--session-gap`), behaviour types
(view/cart/buy) kept as a feature the models read; MovieLens' own files (`u.data`, `ratings.dat`)."""
import json

import numpy as np
import pytest
import torch

import trainwise.data
from tests.conftest import invoke
from trainwise.data.interactions import parse_duration, session_ids
from trainwise.data.prepare import PrepareOptions, prepare
from trainwise.errors import DataError
from trainwise.recsys.data import prepared_histories, sequence_bundle
from trainwise.recsys.models import DIN, SASRec

MINUTE = 60


def shop_csv(path, users=6, events=8):
    """`visitorid,itemid,event,timestamp`; every user pauses 2 hours after their 4th event."""
    lines = ["visitorid,itemid,event,timestamp"]
    kinds = ["view", "view", "cart", "buy"]
    for u in range(users):
        t = 1_000_000 + u * 10
        for e in range(events):
            t += 2 * 3600 if e == 4 else 5 * MINUTE
            lines.append(f"v{u},sku{(u + e) % 7},{kinds[e % 4]},{t}")
    path.write_text("\n".join(lines[:1] + lines[1:][::-1]) + "\n")  # rows out of order
    return path


def test_session_ids_split_at_pauses_longer_than_the_gap():
    users = np.array([0, 0, 0, 0, 1, 1])
    times = np.array([0, 29, 29 + 31, 29 + 31 + 30, 100, 1000]) * MINUTE
    assert session_ids(users, times, 30 * MINUTE).tolist() == [0, 0, 1, 1, 2, 3]
    assert parse_duration("30m") == 1800 and parse_duration("2h") == 7200 and parse_duration("45") == 45
    for bad in ("soon", "-5m", "0"):
        with pytest.raises(DataError, match="--session-gap"):
            parse_duration(bad)


def test_prepare_keeps_session_ids_and_behaviour_types(tmp_path):
    source = shop_csv(tmp_path / "events.csv")
    result = prepare(source, tmp_path / "out", PrepareOptions(split="last-k", session_gap="30m"))
    manifest = result.manifest
    assert manifest["columns"]["event"] == "event" and manifest["behaviours"] == ["buy", "cart", "view"]
    assert manifest["session_gap_s"] == 1800 and manifest["sessions"] == 12  # 6 users x 2 sessions
    train = trainwise.data.open(tmp_path / "out", "train")
    users, sessions = train.column("inputs")[:, 0], train.column("session")
    for user in np.unique(users):
        assert np.unique(sessions[users == user]).size == 2  # the 2-hour pause splits every user's history
    assert set(train.column("behaviour").tolist()) == {0, 1, 2}
    assert "event" not in manifest["columns"]["extras"]


def test_behaviour_types_reach_the_models(tmp_path):
    source = shop_csv(tmp_path / "events.csv")
    prepare(source, tmp_path / "out", PrepareOptions(split="last-k"))
    histories = prepared_histories(tmp_path / "out")
    assert histories.num_behaviours == 3
    bundle = sequence_bundle(histories, objective="next_item", max_len=5, negatives=1, max_eval_queries=None, seed=0)
    assert bundle.spec.input_shape == (2, 5) and bundle.spec.num_behaviours == 3
    inputs, targets = bundle.train[0]
    assert inputs.shape == (2, 5) and ((inputs[1] > 0) == (inputs[0] > 0)).all()

    torch.manual_seed(0)
    history = torch.tensor([[[0, 3, 4, 5], [0, 1, 1, 1]]])
    as_buys = history.clone()
    as_buys[0, 1, 1:] = 3
    sasrec = SASRec(num_items=8, max_len=4, hidden=16, dropout=0.0, behaviours=3).eval()
    din = DIN(num_items=8, hidden=8, attention_hidden=8, mlp=(8,), behaviours=3).eval()
    with torch.no_grad():
        assert not torch.allclose(sasrec(history), sasrec(as_buys))
        candidate = torch.tensor([[[2], [0]]])
        assert not torch.allclose(din(torch.cat([history, candidate], -1)), din(torch.cat([as_buys, candidate], -1)))
        # padding stays padding: a behaviour code under a padded item changes nothing
        padded = history.clone()
        padded[0, 1, 0] = 2
        assert torch.allclose(sasrec(history), sasrec(padded), atol=1e-6)


def test_click_samples_carry_behaviours_and_train(tmp_path, capsys):
    source = shop_csv(tmp_path / "events.csv", users=30, events=10)
    assert invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "out"), "--split", "last-k",
                  "--session-gap", "30m").returncode == 0
    run = tmp_path / "run"
    result = invoke(capsys, "train", "shop-din", "--out", str(run), f"data.path={tmp_path / 'out'}",
                    "train.max_steps=4", "train.batch_size=16", "eval.every_steps=2", "telemetry.enabled=false",
                    "train.sanity=false")
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = invoke(capsys, "eval", str(run), "--json")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result = json.loads(evaluated.stdout)
    # a click model's test split: full ranking, and beside it click AUC and GAUC over each user's impressions
    assert 0 <= result["ndcg@5"] <= 1 and 0 <= result["click_auc"] <= 1 and 0 <= result["gauc"] <= 1
    assert result["gauc_users"] == 30


def test_a_bad_session_gap_is_refused_with_exit_2(tmp_path, capsys):
    source = shop_csv(tmp_path / "events.csv")
    result = invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "out"), "--session-gap", "later")
    assert result.returncode == 2 and "--session-gap" in result.stderr and "30m" in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("name, separator", [("u.data", "\t"), ("ratings.dat", "::")])
def test_movielens_files_prepare(tmp_path, name, separator):
    rows = [(u, i, 4, 1000 * u + t) for u in range(1, 5) for t, i in enumerate([10, 20, 30, 40 + u])]
    source = tmp_path / name
    source.write_text("".join(separator.join(map(str, row)) + "\n" for row in rows))
    manifest = prepare(source, tmp_path / "out", PrepareOptions(split="last-k")).manifest
    assert manifest["kind"] == "interactions" and manifest["num_users"] == 4 and manifest["num_items"] == 7
    assert {s: v["count"] for s, v in manifest["splits"].items()} == {"train": 8, "val": 4, "test": 4}


def test_movielens_file_with_a_header_is_refused(tmp_path):
    source = tmp_path / "u.data"
    source.write_text("user\titem\trating\ttimestamp\n1\t2\t3\t4\n")
    with pytest.raises(DataError, match="not a number"):
        prepare(source, tmp_path / "out", PrepareOptions(split="last-k"))


def test_behaviours_switch(tmp_path):
    from trainwise.recsys.data import shop

    size = dict(seed=0, val_fraction=0.1, test_fraction=0.1, users=40, items=30, events=800, categories=3)
    assert shop(**size).spec.input_shape == (50,)  # the synthetic log: items only unless asked
    with_kinds = shop(**size, behaviours=True, max_len=8)
    assert with_kinds.spec.input_shape == (2, 8) and with_kinds.spec.num_behaviours == 3
    prepare(shop_csv(tmp_path / "events.csv"), tmp_path / "out", PrepareOptions(split="last-k"))
    assert shop(**size, path=str(tmp_path / "out"), behaviours=False).spec.num_behaviours == 0
    source = tmp_path / "u.data"
    source.write_text("".join(f"{u}\t{i}\t4\t{10 * u + i}\n" for u in range(1, 4) for i in range(1, 6)))
    prepare(source, tmp_path / "ml", PrepareOptions(split="last-k"))
    with pytest.raises(DataError, match="no behaviour types"):
        shop(**size, path=str(tmp_path / "ml"), behaviours=True)
