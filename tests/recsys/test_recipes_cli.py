"""The recommender recipes as a shop's engineer runs them: train, evaluate with full ranking, a prepared
real-shaped log through `data.path`, and bad logs refused with exit 2 and a message."""
import json

import pytest

from tests.conftest import invoke

TINY = ["data.args.users=150", "data.args.items=100", "data.args.events=5000", "data.args.categories=5",
        "train.max_steps=20", "train.batch_size=32", "eval.every_steps=10", "train.log_every=10",
        "telemetry.enabled=false"]


def _ok(result):
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return result


@pytest.mark.parametrize("recipe, extra", [("shop-sasrec", []), ("shop-din", []),
                                           ("shop-din", ["model.args.attention=false"]),
                                           ("shop-sasrec", ["model.name=gru4rec", "model.args={}"]),
                                           ("shop-sasrec", ["model.name=popularity", "model.args={}"])],
                         ids=["sasrec", "din", "din-mean", "gru4rec", "popularity"])
def test_recipe_trains_and_evaluates_with_full_ranking(tmp_path, capsys, one_thread, recipe, extra):
    run = tmp_path / "run"  # in this process: the CLI's start-up would cost more than the tiny training
    _ok(invoke(capsys, "train", recipe, "--out", str(run), *TINY, *extra))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["timings"]["wall_s"] > 0
    result = json.loads(_ok(invoke(capsys, "eval", str(run), "--json")).stdout)
    assert result["task"] == "ranking" and "seen items excluded" in result["protocol"]
    assert result["items"] == 100 and result["samples"] == 150  # every user's last event, ranked against all items
    for key in ("ndcg@10", "hr@10", "mrr", "auc", "coverage@10", "popularity_bias@10"):
        assert 0 <= result[key] <= 1, key
    if recipe == "shop-din":  # a click model also gets click AUC and GAUC (per-user AUC) on its impressions
        assert 0 <= result["click_auc"] <= 1 and 0 <= result["gauc"] <= 1 and result["gauc_users"] > 0
    assert (run / "eval" / "predictions.csv").read_text().startswith("query,user,target_item,target_rank,top10")

    if recipe == "shop-sasrec":  # training windows are not queries: said so, exit 2
        refused = invoke(capsys, "eval", str(run), "--split", "train")
        assert refused.returncode == 2 and "--split test" in refused.stderr

    answer = json.loads(_ok(invoke(capsys, "recommend", str(run), "--user", "7", "--k", "5", "--json")).stdout)
    assert answer["known"] and len(answer["recommendations"]) == 5
    assert not {r["item"] for r in answer["recommendations"]} & set(answer["history"])  # seen items excluded
    if extra == [] and recipe == "shop-din":  # DIN says which past behaviours weighed most
        weighed = answer["weighed_most"]["behaviours"]
        assert weighed and all(b["item"] in answer["history"] for b in weighed)
        # and, as a click model, its validation pairs (next item vs sampled items) get a click AUC
        clicks = json.loads(_ok(invoke(capsys, "eval", str(run), "--split", "val", "--json")).stdout)
        assert 0 <= clicks["roc_auc"] <= 1
    unknown = json.loads(_ok(invoke(capsys, "recommend", str(run), "--user", "no-such-user", "--json")).stdout)
    assert not unknown["known"] and "popular" in unknown["note"] and len(unknown["recommendations"]) == 10

    if recipe == "shop-sasrec" and extra == []:  # batch mode: a file of user ids, JSON lines or a table out
        users = tmp_path / "users.txt"
        users.write_text("7\n\nno-such-user\n# a comment\n3\n")
        lines = _ok(invoke(capsys, "recommend", str(run), "--users", str(users), "--k", "5", "--json")).stdout
        answers = [json.loads(line) for line in lines.splitlines()]
        assert [a["user"] for a in answers] == ["7", "no-such-user", "3"]
        assert [a["known"] for a in answers] == [True, False, True]
        assert answers[0]["recommendations"] == answer["recommendations"]  # the same as one at a time
        table = _ok(invoke(capsys, "recommend", str(run), "--users", str(users), "--k", "3")).stdout
        assert "no-such-user" in table and "popular" in table
        (tmp_path / "empty.txt").write_text("\n")
        for bad in (["--users", str(tmp_path / "empty.txt")], ["--users", str(tmp_path / "missing.txt")], []):
            refused = invoke(capsys, "recommend", str(run), *bad)
            assert refused.returncode == 2 and "Traceback" not in refused.stderr, bad


def test_a_prepared_shop_export_trains_through_data_path(tmp_path, capsys, one_thread):
    from trainwise.recsys.generator import generate_shop_log

    log = generate_shop_log(users=120, items=80, events=3000, categories=4, seed=2)
    source = log.write_csv(tmp_path / "events.csv")
    prepared, run = tmp_path / "prepared", tmp_path / "run"
    _ok(invoke(capsys, "prepare", str(source), "--to", str(prepared), "--split", "last-k"))
    _ok(invoke(capsys, "train", "shop-sasrec", "--out", str(run), f"data.path={prepared}", *TINY[4:]))
    result = json.loads(_ok(invoke(capsys, "eval", str(run), "--json")).stdout)
    assert result["items"] == len(set(log.item.tolist())) and result["samples"] == 120
    # raw ids in and out, through the mapping prepare saved
    user = int(log.user[-1])
    answer = json.loads(_ok(invoke(capsys, "recommend", str(run), "--user", str(user), "--json")).stdout)
    assert answer["known"]
    assert answer["history"] == log.item[log.user == user].tolist()[-50:]
    assert {r["item"] for r in answer["recommendations"]} <= set(log.item.tolist())


@pytest.mark.parametrize("header, row, phrase", [
    ("itemid,event,timestamp", "1,view,100", "user"),
    ("visitorid,event,timestamp", "1,view,100", "item"),
    ("visitorid,itemid,event", "1,2,view", "time"),
    ("visitorid,itemid,event,timestamp", "1,2,view,yesterday", "timestamps must be numbers or ISO dates"),
], ids=["no-user", "no-item", "no-time", "text-timestamps"])
def test_bad_logs_are_refused_with_exit_2(tmp_path, capsys, header, row, phrase):
    source = tmp_path / "events.csv"
    source.write_text(f"{header}\n{row}\n{row}\n")
    result = invoke(capsys, "prepare", str(source), "--to", str(tmp_path / "out"), "--kind", "interactions")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert phrase in result.stderr and "Traceback" not in result.stderr


def test_attention_ablation_end_to_end_compares_ndcg_at_10(tmp_path, capsys, one_thread):
    out = tmp_path / "ablation"
    result = invoke(capsys, "ablate", "shop-din", *TINY, "--vary", "model.args.attention=false", "--seeds", "2",
                    "--out", str(out), "--workers", "2")
    _ok(result)
    ablation = json.loads((out / "ablation.json").read_text())
    assert ablation["metric"] == "test/ndcg@10" and ablation["goal"] == "higher is better"
    runs = ablation["runs"]
    assert len(runs) == 4 and all(run["ok"] and 0 <= run["value"] <= 1 for run in runs)
