"""The process environment a worker's engine starts with (vLLM's CPU backend and NIXL/UCX read
it at start-up) and the CPU pinning of the engine's processes."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

from pipeline.config import Config


def engine_env(cfg: Config, *, cpus: str | None, side_channel: tuple[str, int] | None,
               tp: int = 1) -> dict[str, str]:
    """Environment variables for one worker's engine of TP size ``tp``.

    ``cpus`` is the worker's core list (``"0"``, ``"0,1"``), split between its ``tp`` ranks for
    ``VLLM_CPU_OMP_THREADS_BIND`` (:func:`omp_bind`), or None for vLLM's own choice.
    ``side_channel`` is this worker's NIXL handshake (host, port).
    """
    env = {
        "VLLM_CPU_KVCACHE_SPACE": f"{cfg.model.kv_cache_gib:g}",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(cpus, tp)
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    if side_channel is not None:
        # The address peers reach this worker at (pipeline.runtime.addresses.worker_host). vLLM's own
        # guess (VLLM_HOST_IP unset) is the source address of a route to a public address, which
        # a node without a default route does not have: it warns and takes 0.0.0.0.
        env["VLLM_HOST_IP"] = side_channel[0]
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_channel[0]
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel[1])
    if cfg.transport.ucx_tls:
        env["UCX_TLS"] = cfg.transport.ucx_tls
    if cfg.transport.ucx_net_devices:
        env["UCX_NET_DEVICES"] = cfg.transport.ucx_net_devices
    return env


def deal_cores(cores: list[int], n: int) -> list[str]:
    """``cores`` dealt out to ``n`` takers as core lists (``"0"``, ``"2,3"``): contiguous slices,
    the first ones a core larger when they do not divide evenly; with no more cores than takers,
    one core each, shared round-robin (``deal_cores([0, 1], 3)`` -> ``["0", "1", "0"]``)."""
    if n >= len(cores):
        return [str(cores[i % len(cores)]) for i in range(n)]
    per, extra = divmod(len(cores), n)
    out, start = [], 0
    for i in range(n):
        size = per + (1 if i < extra else 0)
        out.append(",".join(map(str, cores[start:start + size])))
        start += size
    return out


def omp_bind(cpus: str, tp: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for an engine of TP size ``tp`` on the cores ``cpus``: one
    core list per TP rank (:func:`deal_cores`), joined by ``|`` (vLLM's CPU worker takes the list
    of its local rank and asserts there is one per rank): ``omp_bind("0,1", 3)`` -> ``"0|1|0"``.
    """
    return cpus if tp <= 1 else "|".join(deal_cores(sorted(parse_cpus(cpus)), tp))


def worker_cpus(spec: str | None, i: int) -> str | None:
    """Worker ``i``'s core list from ``cluster.prefill_cpus`` / ``decode_cpus``: the list itself
    (``"0"``, ``"0,1"``), or, where ``spec`` holds one list per worker separated by ``;``, the
    ``i``-th, cycled (``worker_cpus("0;1", 2)`` -> ``"0"``); None stays None."""
    if spec is None:
        return None
    lists = spec.split(";")
    return lists[i % len(lists)]


def parse_cpus(cpus: str) -> set[int]:
    """``"0,2-3"`` -> ``{0, 2, 3}``."""
    out: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pin_descendants(cpus: set[int]) -> None:
    """Confine every thread of this process's descendants (the engine core and its workers) that
    runs outside ``cpus`` to ``cpus``.

    vLLM's NIXL connector on the CPU platform moves the model worker's main thread, which is also
    its OpenMP master thread, to the last core of each NUMA node to "reserve" it for KV
    transfers (``NixlConnectorWorker.__init__``, vLLM 0.32). On one machine every engine then
    computes on that same core and the others idle: measured here, both engines' workers ended
    on core 1 with the prefill engine bound to core 0. Threads created later inherit this mask.
    """
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            for thread in child.threads():
                # Threads already inside the slice keep their own (per-OpenMP-thread) binding.
                if not os.sched_getaffinity(thread.id) <= cpus:
                    os.sched_setaffinity(thread.id, cpus)
        except (psutil.Error, OSError):
            continue


def worker_pin(cfg: Config, role: str, cpus: str | None) -> set[int] | None:
    """The cores a worker process itself (its event loop, tokenizer, heartbeat) is confined to:
    its engine's ``cpus``, where they come from a core list of the config
    (``cluster.decode_cpus`` for decode, ``cluster.prefill_cpus`` otherwise); None where they are
    the local launcher's slices or vLLM's choice, and the worker keeps the cores it started on.

    A worker started on other cores than its engine's (a Slurm node's, here the test Slurm's
    slurmd pinned to one core) computed on a core where its own engine did not run: measured on
    the 4-node test Slurm, a decode rank's process stood runnable for 30-60 s with no CPU while
    its engine ran on the other core (the kernel splits a session's CPU share across the cores
    by the session's load on each), and its heartbeat stood still: the rank was taken for lost."""
    explicit = cfg.cluster.decode_cpus if role == "decode" else cfg.cluster.prefill_cpus
    return parse_cpus(cpus) if cpus is not None and explicit is not None else None


def pin_worker(cpus: set[int]) -> None:
    """Confine every thread of this process to ``cpus`` (threads it starts later inherit it).

    Raises:
        OSError: a core this process may not use (outside its Slurm allocation or cpuset),
            naming the cores and the settings that gave them.
    """
    import psutil

    for thread in psutil.Process().threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as exc:
            raise OSError(exc.errno, f"cannot run this worker on cores {sorted(cpus)} (cluster.prefill_cpus / "
                                     f"decode_cpus): {exc.strerror}; this process may use "
                                     f"{sorted(os.sched_getaffinity(0))}") from exc


# Seconds between two passes of :func:`pinned_descendants` while an engine starts.
PIN_EVERY_S = 0.5


@contextlib.contextmanager
def pinned_descendants(cpus: set[int], every_s: float = PIN_EVERY_S,
                       each_pass: Callable[[], None] | None = None) -> Iterator[None]:
    """Run :func:`pin_descendants` every ``every_s`` seconds while the block runs (an engine's
    start-up), and once more when it ends; ``each_pass`` (if given) is called after each.

    An engine's start (loading weights, warm-up, torch.compile: 30-120 s on 2 CPU cores) runs in
    its model-worker process, whose main thread vLLM's NIXL connector moves to the last core as
    soon as the connector is built, well before ``AsyncLLM.from_engine_args`` returns. Pinning
    only after the return let a prefill engine restarted beside a busy decode engine do its whole
    start on the decode engine's core: measured in the chaos soak (``tools/soak.py``), a restart
    took minutes and the decode rank's rows waited behind it.
    """
    stop = threading.Event()

    def one_pass() -> None:
        pin_descendants(cpus)
        if each_pass is not None:
            each_pass()

    def loop() -> None:
        while not stop.wait(every_s):
            one_pass()

    thread = threading.Thread(target=loop, name="pin-engine-cores", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        one_pass()
