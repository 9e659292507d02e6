"""The OpenAI batch output format (what ``vllm run-batch`` writes): one line per request of an
output shard, in input order (:func:`output_line`, :func:`write_batch_output`)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pyarrow.parquet as pq

from pipeline.io.atomic import atomic_write, url_to_fs
from pipeline.io.openai_batch import CHAT


def _hex() -> str:
    return uuid.uuid4().hex


def _logprobs(steps: list | None, token_ids: list[int] | None, top: int, chat: bool, tokenizer: Any) -> Any:
    """The output's ``logprobs`` (per token, its top-k ``{token_id, logprob}``, the chosen
    token included) in OpenAI's chat or completions form."""
    if steps is None or token_ids is None:
        return None
    text = (lambda t: tokenizer.decode([t])) if tokenizer is not None else (lambda t: f"token_id:{t}")
    chosen, best = [], []
    for token, step in zip(token_ids, steps):
        step = sorted(step or [], key=lambda c: -c["logprob"])
        chosen.append((text(token), next((c["logprob"] for c in step if c["token_id"] == token), None)))
        best.append([(text(c["token_id"]), c["logprob"]) for c in step[:top]])
    if chat:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                             "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())} for s, v in b]}
                            for (t, lp), b in zip(chosen, best)]}
    offsets, at = [], 0
    for t, _ in chosen:
        offsets.append(at)
        at += len(t)
    return {"tokens": [t for t, _ in chosen], "token_logprobs": [lp for _, lp in chosen],
            "top_logprobs": [dict(b) for b in best], "text_offset": offsets}


SAMPLE_COLUMNS = ("generation", "finish_reason", "stop_reason", "generation_token_ids", "logprobs")


def _samples(row: dict) -> list[dict]:
    """A row's samples: its generation, or each of its list of generations (``n`` > 1, where
    the other sample columns hold one entry per sample)."""
    if not isinstance(row.get("generation"), list):
        return [{k: row.get(k) for k in SAMPLE_COLUMNS}]
    n = len(row["generation"])
    per = {k: v if isinstance(v := row.get(k), list) and len(v) == n else [v] * n for k in SAMPLE_COLUMNS}
    return [{k: per[k][i] for k in SAMPLE_COLUMNS} for i in range(n)]


def _choices(row: dict, chat: bool, tokenizer: Any) -> list[dict]:
    top = (row.get("sampling_params") or {}).get("logprobs") or 0
    out = []
    for i, s in enumerate(_samples(row)):
        content = {"message": {"role": "assistant", "content": s["generation"]}} if chat else {"text": s["generation"]}
        out.append({"index": i, **content,
                    "logprobs": _logprobs(s["logprobs"], s["generation_token_ids"], top, chat, tokenizer),
                    "finish_reason": s["finish_reason"], "stop_reason": s["stop_reason"]})
    return out


def output_line(row: dict, created: int, tokenizer: Any = None) -> dict:
    """One request's line of the OpenAI batch output from its output-shard row: a response
    (status 200, the completion body) or, for an error row, ``error`` {code, message} with
    status 400 (``invalid_request``: the request or its prompt was refused, never served) or
    500 (``server_error``: serving it failed)."""
    line = {"id": f"batch_req_{_hex()}", "custom_id": row.get("id")}
    if row.get("error") is not None:
        invalid = row.get("queue_s") is None
        line["response"] = {"status_code": 400 if invalid else 500, "request_id": f"req_{_hex()}", "body": None}
        line["error"] = {"code": "invalid_request" if invalid else "server_error", "message": row["error"]}
        return line
    chat = row.get("url") == CHAT
    prompt, completion = row.get("prompt_tokens") or 0, row.get("output_tokens") or 0
    body = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{_hex()}", "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": row.get("model"), "choices": _choices(row, chat, tokenizer),
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
    line["response"] = {"status_code": 200, "request_id": f"req_{_hex()}", "body": body}
    line["error"] = None
    return line


COLUMNS = ("id", "url", "model", "sampling_params", "generation", "generation_token_ids", "finish_reason",
           "stop_reason", "logprobs", "prompt_tokens", "output_tokens", "error", "queue_s")


def write_batch_output(shard_url: str, jsonl_url: str, tokenizer: Any = None, rows: int = 1024) -> int:
    """Write the OpenAI batch output of an output shard (Parquet at ``shard_url``) to
    ``jsonl_url``, atomically: one line per row, in order (:func:`output_line`), read
    ``rows`` at a time. Returns the lines written."""
    fs, path = url_to_fs(shard_url)
    created, written = int(time.time()), 0
    with fs.open(path, "rb") as f, atomic_write(jsonl_url, "w") as out:
        shard = pq.ParquetFile(f)
        columns = [c for c in COLUMNS if c in shard.schema_arrow.names]
        for batch in shard.iter_batches(batch_size=rows, columns=columns):
            for row in batch.to_pylist():
                out.write(json.dumps(output_line(row, created, tokenizer), ensure_ascii=False) + "\n")
                written += 1
    return written
