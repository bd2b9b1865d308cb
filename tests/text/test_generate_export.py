"""A text run's afterlife: `trainwise generate` (KV cache) and `trainwise export` to a Hugging Face directory."""
from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import invoke
from tests.text.lm_helpers import tiny_gpt
from tests.data.text.test_prepare_text import make_corpus
from trainwise.data.prepare import PrepareOptions
from trainwise.data.prepare import prepare_corpus as prepare
from trainwise.recipes import load_recipe
from trainwise.evaluate.export import check_export_matches
from trainwise.text.generate import Sampling, generate_ids
from trainwise.launch.runs import train_run

TINY = ["model.args.layers=1", "model.args.width=16", "model.args.heads=2", "train.max_steps=4",
        "train.batch_size=4", "data.seq_len=32", "eval.every_steps=4", "schedule.warmup_steps=1",
        "telemetry.enabled=false", "train.sanity=false", "train.device=cpu", "data.num_workers=0"]


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    prepare(make_corpus(root / "corpus", documents=16), root / "data", PrepareOptions(train_tokenizer=300))
    config = load_recipe("lm-gpt", [*TINY, f"data.path={root / 'data'}"])
    return train_run(config, root / "run").path


def test_kv_cache_generation_equals_recomputing(text_run):
    model = tiny_gpt().eval()
    greedy = Sampling(max_tokens=12, temperature=0)
    cached = generate_ids(model, [1, 2, 3], greedy, eos_id=None, device=torch.device("cpu"))
    ids = [1, 2, 3]
    with torch.no_grad():
        for _ in range(12):  # no cache: the whole sequence again for each token
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert cached == ids[3:]


def test_generate_cli(text_run, capsys):
    result = invoke(capsys, "generate", str(text_run), "--prompt", "Document", "--max-tokens", "20", "--json",
                    "--temperature", "0")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["prompt"] == "Document" and isinstance(answer["text"], str)
    assert invoke(capsys, "generate", str(text_run), "--prompt", "x", "--top-k", "0").returncode == 2


def test_export_gives_the_same_logits_in_transformers(text_run, tmp_path, capsys):
    pytest.importorskip("transformers")
    result = invoke(capsys, "export", str(text_run), "--to", str(tmp_path / "hf"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "hf" / "tokenizer.json").is_file()
    assert check_export_matches(text_run, tmp_path / "hf") < 1e-4
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tokenizer.decode(tokenizer.encode("Document 3.")) == "Document 3."
    again = invoke(capsys, "export", str(text_run), "--to", str(tmp_path / "hf"))
    assert again.returncode == 2 and "not an empty directory" in again.stderr


def test_eval_and_report_of_a_language_model(text_run, capsys):
    assert invoke(capsys, "eval", str(text_run), "--json").returncode == 0
    metrics = json.loads((text_run / "eval" / "metrics.json").read_text())
    assert metrics["task"] == "causal_lm" and "confusion_matrix" not in metrics
    assert metrics["perplexity"] == pytest.approx(torch.tensor(metrics["loss"]).exp().item(), rel=1e-6)
    assert 0 <= metrics["token_accuracy"] <= 1 and metrics["loss_by_position"][0]["positions"] == "0"
    assert len(metrics["generations"]) >= 1 and metrics["top_confusions"]
    assert invoke(capsys, "report", str(text_run), "--format", "md").returncode == 0
    report = (text_run / "report.md").read_text()
    for heading in ("perplexity", "## Language model", "Generations", "tokens seen", "by position"):
        assert heading in report


def test_eval_before_scores_the_untrained_model_on_the_same_split(text_run, capsys):
    table = invoke(capsys, "eval", str(text_run), "--before")
    assert table.returncode == 0, table.stderr
    assert "before (untrained)" in table.stdout and "perplexity" in table.stdout
    result = json.loads((text_run / "eval" / "metrics.json").read_text())
    before, vocab = result["before"], 300
    assert before["task"] == "causal_lm" and before["tokens"] == result["tokens"]  # the same test tokens
    assert vocab / 2 < before["perplexity"] < vocab * 2  # the seeded random start: about a uniform guess
    assert before["perplexity"] > result["perplexity"]


def test_hugging_face_config_run_trains_generates_and_exports(text_run, tmp_path, capsys):
    pytest.importorskip("transformers")
    config_file = tmp_path / "tiny-llama.json"
    config_file.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 2,
                                       "num_key_value_heads": 1, "hidden_size": 16, "intermediate_size": 32,
                                       "max_position_embeddings": 64}))
    data = text_run.parent / "data"
    config = load_recipe("lm-gpt", [*TINY, f"data.path={data}", f"model.hf_config={config_file}"])
    run = train_run(config, tmp_path / "run").path
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert invoke(capsys, "generate", str(run), "--prompt", "Doc", "--max-tokens", "5").returncode == 0
    assert invoke(capsys, "export", str(run), "--to", str(tmp_path / "hf")).returncode == 0
    assert check_export_matches(run, tmp_path / "hf") < 1e-5
