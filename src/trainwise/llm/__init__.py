"""Language models from the Hugging Face world, behind one small adapter.

- `optional`  — lazy imports of transformers / peft / tokenizers / bitsandbytes with the install hint;
- `catalogue` — public architecture configs shipped with the package (`llama-3.1-8b`, `gpt2`, ...);
- `hf`        — resolve a catalogue name, config.json or model directory to a config; build the causal LM on
                `meta`, `cpu` or a device with a dtype; load local weights;
- `methods`   — apply `model.method` (full / freeze / lora / qlora), gradient checkpointing, parameter counts;
- `loss`      — chunked cross-entropy, so [tokens x vocab] logits never exist at once.

Nothing here imports transformers at module import time.
"""
