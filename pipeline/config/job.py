"""Typed configuration of the job group (``+job=NAME``): what is read, how prompts are made and
sampled, and the RAG retrieval; the other groups are in :mod:`pipeline.config.schema`, which
registers them all with Hydra. ``__post_init__`` checks what a type cannot express."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


@dataclass
class SamplingConfig:
    """Sampling for every row (a row's ``job.sampling_column`` struct overrides any field for
    that row). Names and meanings are vLLM's ``SamplingParams`` (``max_new_tokens`` is its
    ``max_tokens``). ``temperature=0`` is greedy decoding. ``seed``: per request, so a row's
    sampled output does not depend on its batch. ``logprobs``: the top-k log-probabilities
    recorded per generated token. Structured output (vLLM's structured outputs, at most one):
    ``json_schema`` (a JSON Schema as JSON text), ``regex``, ``choice``. ``n``: samples per
    prompt (the prompt is prefilled and its KV moved once; sample i has seed ``seed + i``, as
    vLLM's own ``n``); with ``n > 1`` the generation columns hold one list entry per sample."""

    temperature: float = 0.0  # randomness of sampling (higher: flatter); 0: greedy, the most likely token
    n: int = 1  # samples per prompt
    top_p: float = 1.0  # nucleus sampling's probability mass; 1: all
    max_new_tokens: int = 64  # most tokens generated per row and sample (vLLM's max_tokens)
    seed: Optional[int] = None  # per-request seed; null: the engine's random state (model.seed)
    top_k: int = 0  # sample from the k most likely tokens only; 0 (or -1): all tokens
    min_p: float = 0.0  # tokens below min_p x the top token's probability are dropped
    repetition_penalty: float = 1.0  # 1: none; > 1 discourages repeated tokens
    presence_penalty: float = 0.0  # in [-2, 2]; > 0 discourages tokens already present
    frequency_penalty: float = 0.0  # in [-2, 2]; > 0 discourages tokens by their count
    stop: list[str] = field(default_factory=list)  # strings that end the generation (not output)
    stop_token_ids: list[int] = field(default_factory=list)  # token ids that end the generation
    ignore_eos: bool = False  # go on past the end-of-sequence token (to max_new_tokens)
    min_tokens: int = 0  # tokens generated before EOS or a stop may end it
    logprobs: Optional[int] = None  # top-k log-probabilities per generated token
    json_schema: Optional[str] = None  # structured output: a JSON Schema as JSON text
    regex: Optional[str] = None  # structured output: a regular expression
    choice: Optional[list[str]] = None  # structured output: one of these strings

    def __post_init__(self) -> None:
        key = "job.sampling."
        _check(self.temperature >= 0, key + "temperature", f"must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, key + "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(self.n >= 1, key + "n", f"must be >= 1, got {self.n}")
        _check(self.max_new_tokens >= 1, key + "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        _check(self.top_k == -1 or self.top_k >= 0, key + "top_k", f"must be >= 0 (or -1: all), got {self.top_k}")
        _check(0 <= self.min_p <= 1, key + "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(self.repetition_penalty > 0, key + "repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            _check(-2 <= getattr(self, name) <= 2, key + name, f"must be in [-2, 2], got {getattr(self, name)}")
        _check(0 <= self.min_tokens <= self.max_new_tokens, key + "min_tokens",
               f"must be in [0, max_new_tokens={self.max_new_tokens}], got {self.min_tokens}")
        _check(self.logprobs is None or self.logprobs >= 0, key + "logprobs", f"must be >= 0 or null, got {self.logprobs}")
        _check(all(isinstance(s, str) and s for s in self.stop), key + "stop", "must be non-empty strings")
        structured = [n for n in ("json_schema", "regex", "choice") if getattr(self, n) is not None]
        _check(len(structured) <= 1, key + structured[-1] if structured else key, f"set at most one of {', '.join(structured)}")
        if self.json_schema is not None:
            import json

            try:
                json.loads(self.json_schema)
            except ValueError as exc:
                raise ValueError(f"{key}json_schema: not valid JSON: {exc}") from None
        _check(self.choice is None or len(self.choice) >= 1, key + "choice", "must list at least one choice")


@dataclass
class RagConfig:
    """Retrieval for a RAG job (``+job=rag``): each row's text is a question; its ``top_k`` best
    passages from ``corpus`` (Parquet with ``id``, ``text`` and optionally ``title`` columns;
    chunked into passages of ``chunk_size`` words overlapping by ``overlap`` words) are embedded
    with ``embedding_model`` and put into ``template`` (``{passages}``, ``{question}``), which
    becomes the prompt's text. ``index_dir``: where corpus indexes are kept (default
    ``~/.cache/pd-pipeline/rag``; a shared file system on a cluster). ``retrieve_batch``: questions
    retrieved at a time (prefill starts on the first batch while later ones are retrieved).
    ``prefix_routing``: rows whose prompts share their best passage (with the instructions, a long
    common prefix) are prefilled one after another and handed to the same decode worker, so
    vLLM's prefix cache hits on both sides."""

    corpus: str = MISSING  # Parquet passages: id, text, optional title
    embedding_model: str = "all-MiniLM-L6-v2"  # sentence-transformers model that embeds questions and passages
    chunk_size: int = 128  # words per passage the corpus documents are cut into
    overlap: int = 32  # words two neighbouring passages of a document share
    top_k: int = 3  # passages per question
    # the prompt's text, from {passages} and {question}; null: the built-in one (pipeline.rag.retrieve.DEFAULT_TEMPLATE)
    template: Optional[str] = None
    index_dir: Optional[str] = None  # where corpus indexes are kept; null: ~/.cache/pd-pipeline/rag
    retrieve_batch: int = 8  # questions retrieved at a time
    prefix_routing: bool = True  # rows sharing their best passage go one after another, to one decode worker

    def __post_init__(self) -> None:
        _check(self.top_k >= 1, "job.rag.top_k", f"must be >= 1, got {self.top_k}")
        _check(self.chunk_size >= 1 and 0 <= self.overlap < self.chunk_size, "job.rag.overlap",
               f"needs chunk_size >= 1 and 0 <= overlap < chunk_size, got {self.chunk_size}/{self.overlap}")
        _check(self.retrieve_batch >= 1, "job.rag.retrieve_batch", f"must be >= 1, got {self.retrieve_batch}")
        # template: checked at start by pipeline.preflight (string.Formatter: {passages}, {question})


@dataclass
class JobConfig:
    """What to generate: input shards, prompt, sampling and output location.

    ``input`` is a directory, a glob or a single file of shards (Parquet, JSON Lines, CSV or an
    OpenAI batch file, each by its extension) reachable through fsspec (local path, ``file://``,
    ``s3://``, ``gs://`` ...). ``output`` defaults to ``RUN_DIR/output``.
    ``prompt_template`` is a Python format string with ``{text}`` (as often as wanted; literal
    braces are ``{{`` and ``}}``); it becomes the user turn of the model's chat template (after
    ``system_prompt`` when set, which takes no placeholder).
    """

    name: str = MISSING  # the job's name (set by its config): run directories go under run.root/NAME/
    input: str = MISSING  # input shards: a folder, glob or file, local or any fsspec URL
    output: Optional[str] = None  # where output shards go; null: RUN_DIR/output
    text_column: str = "text"  # the column holding each row's text (it fills {text} in prompt_template)
    id_column: str = "id"  # the column naming each row (absent: ids from shard and row number)
    system_prompt: Optional[str] = None  # the chat template's system turn; null: none
    prompt_template: str = "{text}"  # the user turn: a format string with {text}
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # sampling for every row (the group below)
    batch_rows: int = 16  # rows a prefill/colocated worker keeps in flight
    checkpoint_rows: int = 4  # finished rows saved together so a restarted owner resumes mid-shard
    checkpoint_interval_s: float = 2.0  # at most one save per this many seconds (rows finished since wait for it); 0: every checkpoint_rows rows
    unit_rows: Optional[int] = 50000  # a bigger Parquet shard is served in parts of its row groups (~this many rows); null: never
    too_long: str = "error"  # a prompt longer than the context: "error" row, or "truncate" the text
    # A column of OpenAI chat messages (a list of {role, content} structs) to render with the
    # model's chat template instead of text_column + prompt_template; null: plain text rows.
    messages_column: Optional[str] = None
    # A struct column whose non-null fields override job.sampling for their row (Ray Data LLM's
    # name); unknown fields or out-of-range values make that row an error row.
    sampling_column: str = "sampling_params"
    # A string column naming each row's LoRA adapter (a key of model.lora); null or empty: the
    # base model; another name: that row's error. Absent from a shard: every row on the base model.
    lora_column: str = "lora"
    # Input columns named like an output column (a second pass over a run's output) are kept
    # under this prefix ("input_": input_generation, ...); null: such a clash is refused at start.
    input_column_prefix: Optional[str] = None
    rag: Optional[RagConfig] = None  # set: rows are questions answered from retrieved passages

    @property
    def prompt_column(self) -> str:
        """The column each row's prompt comes from: ``messages_column`` when set, else
        ``text_column``."""
        return self.messages_column or self.text_column

    def __post_init__(self) -> None:
        # prompt_template / system_prompt: checked at start by pipeline.preflight (string.Formatter)
        _check(self.batch_rows >= 1, "job.batch_rows", f"must be >= 1, got {self.batch_rows}")
        _check(self.too_long in ("error", "truncate"), "job.too_long", f"must be error or truncate, got {self.too_long!r}")
        _check(self.checkpoint_rows >= 1, "job.checkpoint_rows", f"must be >= 1, got {self.checkpoint_rows}")
        _check(self.checkpoint_interval_s >= 0, "job.checkpoint_interval_s",
               f"must be >= 0 seconds, got {self.checkpoint_interval_s}")
        _check(self.unit_rows is None or self.unit_rows >= 1, "job.unit_rows", f"must be >= 1 or null, got {self.unit_rows}")
        _check(not (self.rag is not None and self.messages_column), "job.messages_column",
               "the RAG job reads each question from job.text_column and builds its prompt from the "
               "retrieved passages; chat messages are not supported there, set job.messages_column=null")
