"""Language models: the built-in GPT, the builder of the model a run trains (lm_builder.py: the built-in gpt or
a Hugging Face causal LM with its method applied), generation, the checks a language-model run makes before
step 1, and the evaluation of a text split. Text as data (tokenizers, shards, packing, prepare) is data/text/.

Nothing here imports transformers or tokenizers at module level: they are an optional extra
(`pip install 'trainwise[llm]'`), imported inside the functions that need them.
"""
