"""A sample of an input's prompts as the workers will render them, for the estimates made before
a run starts (``--dry-run``'s prompt tokens, ``pools=auto``)."""

from __future__ import annotations

import math
from typing import Any

from pipeline.config import Config


def sample_prompt_lengths(cfg: Config, shards: list, tokenizer: Any, rows: int) -> tuple[list[int], int]:
    """Prompt lengths (tokens) of up to ``rows`` rows of ``shards``, an equal share from the
    start of each shard in order until ``rows`` are read, in every input format (Parquet, JSON
    Lines, CSV, OpenAI batch requests), rendered and tokenized as the workers do (job template,
    chat template); rows that would be error rows are left out. Also the number of rows read.

    Raises:
        OSError, ValueError: a shard cannot be read.
    """
    from pipeline.io.openai_batch import is_request_batch, request_prompts
    from pipeline.io.prompts import make_prompts
    from pipeline.io.shards import iter_batches, text_values

    job = cfg.job
    share = max(1, math.ceil(rows / max(1, len(shards))))
    lengths: list[int] = []
    read = 0
    for shard in shards:
        if read >= rows:
            break
        for first, batch in iter_batches(shard, share):
            n = min(batch.num_rows, share)
            batch = batch.slice(0, n)
            read += n
            keys = [f"{shard.index}:{first + i}" for i in range(n)]
            if is_request_batch(batch.schema):
                prompts = request_prompts(batch, keys, job, tokenizer, cfg.model.max_model_len, first, {}, None)
            elif job.prompt_column in batch.schema.names:
                texts = text_values(batch, job.prompt_column)
                prompts = make_prompts(texts, keys, job, tokenizer, cfg.model.max_model_len, first_row=first)
            else:
                prompts = []
            lengths += [len(p.token_ids) for p in prompts if p.token_ids]
            break
    return lengths, read
