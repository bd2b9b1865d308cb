"""Text as data: raw documents and chat rows read (rows, corpus, chat), the tokenizers that turn them into ids
and the chat templates that say which ids carry loss, token shards on disk, packing into training sequences,
and the text `prepare`. A prepared text dataset is a DataBundle like any other (bundle.py).
Nothing here imports transformers or tokenizers at module level: they are an optional extra
(`pip install 'trainwise[llm]'`), imported inside the functions that need them.
"""
