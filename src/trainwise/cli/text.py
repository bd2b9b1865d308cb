"""CLI commands for language-model runs: `trainwise generate`, `trainwise export`; app.py calls register(app)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console()


def register(app: typer.Typer) -> None:
    app.command("generate")(generate_command)
    app.command("export")(export_command)


def generate_command(
    run_dir: Path = typer.Argument(..., help="A language-model run directory (e.g. from `trainwise train lm-gpt`)."),
    prompt: str = typer.Option(..., "--prompt", help="The text to continue."),
    max_tokens: int = typer.Option(100, "--max-tokens", help="Tokens to generate at most (it stops at end of text)."),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy, the same text every time, as "
                                      "`trainwise eval` writes; higher (e.g. 0.8): sampled, more varied."),
    top_k: Optional[int] = typer.Option(50, "--top-k", help="Sample among the k likeliest tokens only."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]."),
    trust_code: bool = typer.Option(False, "--trust-code", help="Run the factories a run made by someone else names."),
    as_json: bool = typer.Option(False, "--json", help="Print {prompt, text} as JSON."),
    raw: bool = typer.Option(False, "--raw", help="A fine-tuned chat run: continue the prompt as plain text "
                             "instead of answering it through the chat template."),
) -> None:
    """Continue a prompt with a trained language model (KV cache for the built-in gpt). A run fine-tuned on
    instruction data answers the prompt as a user turn, rendered with its chat template as in training."""
    from trainwise.evaluate.finetune import reply
    from trainwise.data.text.chat_templates import saved_template
    from trainwise.text.generate import Sampling, generate_text
    from trainwise.evaluate.run_model import load_run_model
    from trainwise.runtime.device import resolve_device

    target = resolve_device(device)
    loaded = load_run_model(run_dir, device=target, trust_code=trust_code)
    sampling = Sampling(max_tokens=max_tokens, temperature=temperature, top_k=top_k, seed=seed)
    template = None if raw else saved_template(loaded.run.tokenizer_dir(), loaded.tokenizer)
    if template is not None:
        text = reply(loaded.model, loaded.tokenizer, template, [{"role": "user", "content": prompt}], sampling,
                     device=target)
    else:
        text = generate_text(loaded.model, loaded.tokenizer, prompt, sampling, device=target)
    if as_json:
        print(json.dumps({"prompt": prompt, "text": text, "chat_template": template.name if template else None}))
    else:
        console.print(text if template else prompt + text, highlight=False, markup=False, soft_wrap=True)


def export_command(
    run_dir: Path = typer.Argument(..., help="A language-model run directory."),
    to: Path = typer.Option(..., "--to", help="A new (or empty) directory for the Hugging Face model."),
    trust_code: bool = typer.Option(False, "--trust-code", help="Run the factories a run made by someone else names."),
    merge: bool = typer.Option(False, "--merge", help="A LoRA run: fold the adapter into the base model and write "
                               "the merged model (the adapter alone is RUN/adapter/, in peft's format)."),
    merge_in: str = typer.Option("fp32", "--merge-in", help="--merge computes in fp32 (exact) or `base` (the base "
                                 "weights' dtype; less memory, bf16 rounding)."),
    dtype: str = typer.Option(None, "--dtype", help="Save the weights in fp32, bf16 or fp16 (default: the base "
                              "model's dtype; an fp32 base stays fp32)."),
) -> None:
    """Write a run's final language model as a Hugging Face directory (config.json, model.safetensors, tokenizer)."""
    from trainwise.evaluate.export import export_run

    result = export_run(run_dir, to, trust_code=trust_code, merge=merge, merge_in=merge_in, dtype=dtype)
    console.print(f"exported {result['architecture']} to {result['directory']}: weights {result['weights']}; "
                  f"tokenizer: {result['tokenizer']}; {result['special_tokens']}; context {result['context']}.",
                  highlight=False, markup=False, soft_wrap=True)
    for warning in result["warnings"]:
        console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False, soft_wrap=True)
    console.print(f"Load it with: transformers.AutoModelForCausalLM.from_pretrained({str(to)!r})", highlight=False,
                  soft_wrap=True)
