"""Data in and out, below every other layer but config: input shards and their discovery,
rows -> prompts, the output shard's schema, row checkpoints, request/worker metrics files, and
the one atomic-write helper every file of a run goes through (:mod:`pipeline.io.atomic`)."""
