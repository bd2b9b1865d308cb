"""Text for language models: tokenizers, token shards, packing, the text `prepare` and the built-in GPT.

Nothing here imports transformers or tokenizers at module level: they are an optional extra
(`pip install 'trainwise[llm]'`), imported inside the functions that need them.
"""
