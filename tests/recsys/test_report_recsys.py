"""The report's recommender section on a small trained run: metrics beside the popularity baseline, by user
activity, and one user's history with the attention weights."""
import pytest
import torch

from tests.conftest import invoke
from trainwise.evaluate.report_recsys import BUCKETS, recsys_section
from trainwise.recsys.models import SASRec
from trainwise.rundir.layout import RunDir

TINY = ["data.args.users=150", "data.args.items=100", "data.args.events=6000", "data.args.categories=5",
        "train.max_steps=12", "train.batch_size=32", "eval.every_steps=6", "telemetry.enabled=false",
        "train.sanity=false"]


@pytest.mark.parametrize("recipe", ["shop-sasrec", "shop-din"])
def test_the_section_compares_with_popularity_by_activity_with_attention(tmp_path, capsys, one_thread, recipe):
    run = tmp_path / "run"
    assert invoke(capsys, "train", recipe, "--out", str(run), *TINY).returncode == 0
    section = recsys_section(RunDir.open(run))
    assert section["queries"] == 150
    for side in ("model", "popularity"):
        assert 0 <= section["overall"][side]["ndcg@10"] <= 1
    buckets = section["buckets"]
    assert [b["bucket"] for b in buckets] == [name for name, _, _ in BUCKETS]
    assert sum(b["users"] for b in buckets) == 150  # every test query in exactly one bucket
    example = section["example"]
    weights = [e["weight"] for e in example["events"]]
    assert example["events"] and all(w is not None for w in weights)
    assert ("DIN" if recipe == "shop-din" else "SASRec") in example["weights"]
    page = section.__html__()
    assert 'id="recommender"' in page and "popularity" in page and "heavy" in page
    assert any(line.startswith("| all |") for line in section.markdown())
    if recipe == "shop-din":  # `trainwise report` shows it in the page and in Markdown
        assert invoke(capsys, "report", str(run)).returncode == 0
        assert 'id="recommender"' in (run / "report.html").read_text()
        assert invoke(capsys, "report", str(run), "--format", "md").returncode == 0
        assert "## Recommender" in (run / "report.md").read_text()


def test_sasrec_attention_weights_are_what_its_last_block_attends_with():
    torch.manual_seed(0)
    model = SASRec(num_items=30, max_len=6, hidden=8, layers=2, heads=1, dropout=0.0).eval()
    history = torch.tensor([[0, 0, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])
    weights = model.attention_weights(history)
    assert torch.allclose(weights.sum(1), torch.ones(2)) and (weights[0, :2] == 0).all()
    captured = {}
    last = model.blocks[-1]
    handle = last.register_forward_pre_hook(lambda module, args: captured.update(x=args[0]))
    with torch.no_grad():
        model.encode(history)
    handle.remove()
    _, _, v = last.qkv(last.attention_norm(captured["x"])).chunk(3, dim=-1)
    expected = last.out(torch.einsum("bl,bld->bd", weights, v))  # the attention output at the last position
    x = captured["x"]
    with torch.no_grad():
        attended = last.out(torch.nn.functional.scaled_dot_product_attention(
            *(t.unsqueeze(1) for t in last.qkv(last.attention_norm(x)).chunk(3, dim=-1)),
            attn_mask=(torch.ones(6, 6, dtype=torch.bool).tril() & (history > 0)[:, None, :]
                       | torch.eye(6, dtype=torch.bool)).unsqueeze(1)).squeeze(1))
    assert torch.allclose(expected, attended[:, -1], atol=1e-5)
