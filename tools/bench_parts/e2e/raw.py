"""The raw vLLM child of ``tools/bench.py`` (``--_raw SPEC OUT``): the pipeline's config and
prompts, one ``LLM.generate()`` call, timed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def raw_main(spec_path: str, out_path: str) -> None:
    """The raw vLLM child: compose the pipeline's config, render its prompts, time generate()."""
    spec = json.loads(Path(spec_path).read_text())
    from pipeline.config import compose
    from pipeline.engine.env import engine_env, parse_cpus, pin_descendants
    from pipeline.engine.model import load_tokenizer, model_path
    from pipeline.io.output import row_ids
    from pipeline.io.prompts import make_prompts
    from pipeline.io.shards import list_shards, read_shard

    cfg = compose(spec["overrides"])
    os.environ.update(engine_env(cfg, cpus=spec["cpus"], side_channel=None))
    tok = load_tokenizer(cfg)
    prompts, ids = [], []
    for shard in list_shards(cfg.job.input):
        table = read_shard(shard)
        rid = row_ids(table, cfg.job.id_column, shard.name).to_pylist()
        keys = [f"{shard.index}:{i}" for i in range(table.num_rows)]
        for p, i in zip(make_prompts(table.column(cfg.job.text_column).to_pylist(), keys, cfg.job, tok,
                                     cfg.model.max_model_len, ids=rid), rid):
            if p.token_ids is not None:
                prompts.append(p.token_ids)
                ids.append(str(i))
    from vllm import LLM, SamplingParams
    from pipeline.engine.build import enforce_eager, memory_utilization  # the values the pipeline's engines get
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    kw = {"block_size": cfg.model.block_size} if cfg.model.block_size else {}
    common = dict(model=model_path(cfg), dtype=cfg.model.dtype, max_model_len=cfg.model.max_model_len,
                  tensor_parallel_size=cfg.model.prefill_tp, gpu_memory_utilization=memory_utilization(cfg),
                  enforce_eager=enforce_eager(cfg), seed=0, disable_log_stats=True, **kw)
    # vLLM picks scheduler limits by usage context: the pipeline's AsyncLLM (ENGINE_CONTEXT) gets
    # max_num_batched_tokens 2048 / max_num_seqs 128 on CPU, LLM (LLM_CLASS) 4096 / 256. Give the
    # raw engine the pipeline's, as the pipeline's engine arguments resolve them.
    sched = AsyncEngineArgs(**common).create_engine_config(UsageContext.ENGINE_CONTEXT).scheduler_config
    ts = time.time()
    llm = LLM(max_num_batched_tokens=sched.max_num_batched_tokens, max_num_seqs=sched.max_num_seqs, **common)
    pin_descendants(parse_cpus(spec["cpus"]))
    s = cfg.job.sampling
    params = SamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=s.seed)
    t0 = time.time()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    t1 = time.time()
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    Path(out_path).write_text(json.dumps({
        "t0": t0, "t1": t1, "startup_s": t0 - ts, "wall_s": t1 - t0, "output_tokens": n,
        "prompt_tokens": sum(len(p) for p in prompts), "requests": len(prompts),
        "output_tokens_per_s": n / (t1 - t0), "cpus": spec["cpus"],
        "max_num_batched_tokens": sched.max_num_batched_tokens, "max_num_seqs": sched.max_num_seqs,
        "tokens_by_row": {i: [len(p), list(o.outputs[0].token_ids)] for i, p, o in zip(ids, prompts, outs)},
    }))
    try:
        llm.llm_engine.engine_core.shutdown()  # ends the engine core process and its workers
    finally:
        os._exit(0)  # skip the interpreter-exit teardown
