"""Shared fixtures. End-to-end runs start real vLLM engines (~30-60 s each on 2 cores), so each
configuration runs once per session and every test reads its output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample"
# Greedy equality between runs is checked in float32: in bfloat16 on CPU a different batch
# composition flips near-tied logits now and then (seen: 1 of 8 rows diverged at token 31).
COMMON = ["+job=summarize", "model.dtype=float32", "run.progress=false"]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path
    output: Path

    def table(self, shard: str):
        return pq.read_table(self.output / shard)

    def rows(self, shard: str) -> list[dict]:
        return self.table(shard).to_pylist()

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def engines(self) -> dict[str, dict]:
        """role -> the record of the run's engine of that role (``RUN_DIR/engines/``; one engine
        per role)."""
        return {r["role"]: r for r in (json.loads(p.read_text()) for p in (self.run_dir / "engines").glob("*.json"))}


def run_pipeline(*overrides: str, timeout: float = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env} if env else None)


class PendingRun:
    """A run started in the background (:func:`start_run`); :meth:`wait` returns its :class:`Run`
    and fails the test if it failed. Its output goes to files (a pipe left unread would block)."""

    def __init__(self, name: str, base: Path, args: list[str], cpus: set[int] | None):
        self.name, self.base = name, base
        self.out, self.err = (base / "stdout.txt").open("w+"), (base / "stderr.txt").open("w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=ROOT, text=True,
                                     stdout=self.out, stderr=self.err,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)

    def wait(self, timeout: float = 900) -> Run:
        rc = self.proc.wait(timeout)
        text = []
        for f in (self.out, self.err):
            f.seek(0)
            text.append(f.read())
            f.close()
        run = Run(rc, text[0], text[1], self.base / "run", self.base / "output")
        assert rc == 0, f"run {self.name} failed:\n{text[0]}\n{text[1][-4000:]}"
        return run


def start_run(tmp_path_factory, name: str, *overrides: str, input_url: str | None = None,
              file_urls: bool = False, cpus: set[int] | None = None) -> PendingRun:
    """Start a run of the pipeline over ``input_url`` (default the sample) without waiting.

    ``cpus``: the cores the whole run (driver, workers, engines) is confined to. A reference run
    started beside another run gets the last core (:func:`last_core`): a local disaggregated run
    pins its prefill engine to the first core and its decode engine to the last, which sits idle
    while long prompts are prefilled and while engines start."""
    base = tmp_path_factory.mktemp(name)
    out = base / "output"
    args = [*COMMON, f"run.dir={base / 'run'}", *overrides]
    args.append(f"job.input={input_url or SAMPLE}")
    args.append(f"job.output={out.as_uri() if file_urls else out}")
    return PendingRun(name, base, args, cpus)


def last_core() -> set[int]:
    return {max(os.sched_getaffinity(0))}


def _run(tmp_path_factory, name: str, *overrides: str, input_url: str | None = None,
         file_urls: bool = False) -> Run:
    return start_run(tmp_path_factory, name, *overrides, input_url=input_url, file_urls=file_urls).wait()


@pytest.fixture(scope="session", autouse=True)
def _colocated_started(request, tmp_path_factory):
    """Starts :func:`colocated_run` with the session when a selected test uses it, on the last
    core."""
    if not any("colocated_run" in item.fixturenames for item in request.session.items):
        yield None
        return
    pending = start_run(tmp_path_factory, "colocated", "pools=colocated", "job.unit_rows=4", input_url=SAMPLE.as_uri(),
                        file_urls=True, cpus=last_core())
    yield pending
    if pending.proc.poll() is None:  # the session ended before a test waited for it
        pending.proc.kill()
        pending.proc.wait()


@pytest.fixture(scope="session")
def colocated_run(_colocated_started) -> Run:
    """The baseline: the pipeline colocated (vLLM prefill and decode in one engine), reading and
    writing through file:// URLs, each sample shard served in two parts (``job.unit_rows=4``: its
    two row groups) and assembled (:mod:`pipeline.io.units`), so every test comparing a run with
    it also compares a split shard's output with an unsplit one's, row for row. It is itself
    checked against :func:`reference`, which shares no code with the pipeline."""
    return _colocated_started.wait()


@pytest.fixture(scope="session", autouse=True)
def _reference_started(request, tmp_path_factory):
    """Starts :func:`reference` with the session when a selected test uses it, on the first core
    (the colocated run has the last)."""
    if not any("reference" in item.fixturenames for item in request.session.items):
        yield None
        return
    base = tmp_path_factory.mktemp("reference")
    log = (base / "log.txt").open("w+")
    cpus = {min(os.sched_getaffinity(0))}
    proc = subprocess.Popen([sys.executable, "-m", "tests.reference", str(base / "reference.json")], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    yield proc, base, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def reference(_reference_started) -> dict[str, list[dict]]:
    """The independent reference (:mod:`tests.reference`): raw vLLM ``LLM.generate`` in float32
    over the sample, prompts rendered by the tokenizer's own ``apply_chat_template``, ids read
    with pyarrow: ``{shard: [{id, prompt_ids, token_ids}]}`` in file order."""
    proc, base, log = _reference_started
    rc = proc.wait(900)
    log.seek(0)
    assert rc == 0, f"the reference (raw vLLM) failed:\n{log.read()[-4000:]}"
    return json.loads((base / "reference.json").read_text())


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """This checkout's wheel in a fresh venv, run as ``pd-pipeline`` outside the checkout
    (:class:`tests.wheel.Installed`), built once per session (~15 s)."""
    from tests.wheel import install_wheel

    return install_wheel(tmp_path_factory.mktemp("install"))


@pytest.fixture(scope="session")
def push_run(tmp_path_factory) -> Run:
    """1P:1D, prefill WRITEs KV into decode's blocks (NixlPushConnector)."""
    return _run(tmp_path_factory, "push", "pools=disaggregated", "transport=nixl_push")


@pytest.fixture(scope="session")
def pull_run(tmp_path_factory) -> Run:
    """1P:1D, decode READs KV from prefill's blocks (NixlConnector), input given as a glob."""
    return _run(tmp_path_factory, "pull", "pools=disaggregated", "transport=nixl_pull",
                input_url=str(SAMPLE / "part-*.parquet"))


# Every Slurm test runs on the multi-node test Slurm (slurm/start-test-cluster.sh --nodes 4):
# pd-node1-2 form the `prefill` partition, pd-node3-4 `decode`, each node a network namespace,
# so every Slurm run is a run across hosts. SLURM is what a site sets for that: the cluster and
# the network path of the KV (TCP on each node's eth0, as UCX_TLS / UCX_NET_DEVICES).
SLURM_NODES = 4
PREFILL_NODES = ("pd-node1", "pd-node2")
SLURM = ["cluster=slurm-test-nodes", "transport.ucx_tls=tcp", "transport.ucx_net_devices=eth0"]


@pytest.fixture(scope="session")
def slurm_cluster():
    """The multi-node test Slurm (4 nodes, 1 CPU and feature "ib" each), brought up once."""
    if os.geteuid() != 0:
        pytest.skip("bringing up the test Slurm needs root (apt-get, munge, slurmd, namespaces)")
    p = subprocess.run(["bash", str(ROOT / "slurm" / "start-test-cluster.sh"), "--nodes", str(SLURM_NODES)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"test Slurm did not come up:\n{p.stdout}\n{p.stderr}"


def node_bytes_sent() -> dict[str, int]:
    """Bytes each test node has sent over its link: the receive counter of its port on the
    bridge (``pd-vethK``, this namespace's end of node K's ``eth0``), read from sysfs."""
    out = {}
    for port in Path("/sys/class/net").glob("pd-veth*"):
        out[f"pd-node{port.name.removeprefix('pd-veth')}"] = int((port / "statistics" / "rx_bytes").read_text())
    return out


def assert_across_hosts(run_dir: Path, output: Path, sent_before: dict[str, int]) -> None:
    """Check, from what the workers did, that a disaggregated run on the multi-node test Slurm
    ran across hosts: every row with KV was prefilled on one node and decoded on another; every
    decode endpoint published is that node's own bridge address (198.18.0.K on pd-nodeK, the
    cluster's addressing: never loopback); and the prefill nodes sent at least half the run's
    ``kv_bytes`` over their links since ``sent_before`` (:func:`node_bytes_sent`): the KV went
    over the network, not through shared memory, which namespaces on one host use by default
    (0 bytes on the link, measured). Half, not all: in a pull run with ``n`` > 1 samples the
    links carried 19.4 MB for a counted 24.0 MB (rows' ``kv_bytes`` are tokens x bytes per token,
    not bytes on the wire); push runs carried more than they counted."""
    from pipeline.io.metrics import read_request_metrics

    rows = [r for f in sorted(output.rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    moved = [r for r in rows if r.get("kv_tokens")]
    assert moved, "no row moved KV"
    for r in moved:
        p_host, d_host = r["prefill_worker"].split("@")[1], r["decode_worker"].split("@")[1]
        assert p_host in PREFILL_NODES and d_host.startswith("pd-node") and d_host not in PREFILL_NODES, r
    ranks = sorted((run_dir / "decode").glob("rank-*.json"))
    assert ranks
    for f in ranks:
        rank = json.loads(f.read_text())
        host = rank["worker"].split("@")[1]
        assert rank["endpoint"].startswith(f"tcp://198.18.0.{host.removeprefix('pd-node')}:"), rank
    kv_bytes = sum(read_request_metrics(run_dir).column("kv_bytes").to_pylist())
    after = node_bytes_sent()
    sent = sum(after[n] - sent_before.get(n, 0) for n in PREFILL_NODES)
    assert kv_bytes > 0 and sent >= kv_bytes / 2, \
        f"prefill nodes sent {sent} B over their links, the run's KV is {kv_bytes} B"
