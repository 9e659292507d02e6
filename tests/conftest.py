"""Shared fixtures. End-to-end runs start real vLLM engines (~30-60 s each on 2 cores), so each
configuration runs once per session and every test reads its output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
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


def shared_dir(tmp_path_factory) -> Path:
    """The folder every pytest-xdist worker of this session sees (``-n 2`` in pyproject's
    ``addopts``): the parent of each worker's own base temp, as xdist documents for session
    fixtures run once; without xdist, the base temp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


class PendingRun:
    """A command started in the background (:func:`start_run`: a run of the pipeline), its output
    in ``BASE/stdout.txt`` and ``stderr.txt`` (a pipe left unread would block) and its exit status
    written to ``BASE/rc`` when it ends, so that any worker of the session can wait for it:
    :meth:`wait` returns its :class:`Run` and fails the test if it failed. ``cmd`` None: attach to
    one another worker started in ``base`` (:func:`shared_run`); then :attr:`proc` is None."""

    def __init__(self, name: str, base: Path, cmd: list[str] | None, cpus: set[int] | None = None):
        self.name, self.base, self.proc = name, base, None
        if cmd is None:
            return
        with (base / "stdout.txt").open("w") as out, (base / "stderr.txt").open("w") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=out, stderr=err,
                                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self._recorder = threading.Thread(target=self._record_rc, daemon=True)
        self._recorder.start()

    def _record_rc(self) -> None:
        rc = self.proc.wait()
        (self.base / "rc.part").write_text(str(rc))
        (self.base / "rc.part").replace(self.base / "rc")

    def returncode(self, timeout: float = 900) -> int:
        """The command's exit status, once ``BASE/rc`` says it ended; TimeoutError after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not (self.base / "rc").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not end within {timeout} s ({self.base})")
            time.sleep(0.2)
        return int((self.base / "rc").read_text())

    def wait(self, timeout: float = 900) -> Run:
        rc = self.returncode(timeout)
        out, err = ((self.base / n).read_text() for n in ("stdout.txt", "stderr.txt"))
        assert rc == 0, f"run {self.name} failed:\n{out}\n{err[-4000:]}"
        return Run(rc, out, err, self.base / "run", self.base / "output")

    def end(self) -> None:
        """At the end of the session of the worker that started it: a run no test waited for is
        killed, unless other pytest-xdist workers may still wait for it (it is then waited for)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if os.environ.get("PYTEST_XDIST_WORKER"):
            self.proc.wait(900)
            self._recorder.join(10)
        else:
            self.proc.kill()
            self.proc.wait()


def _pipeline_cmd(base: Path, overrides: tuple[str, ...], input_url: str | None, file_urls: bool) -> list[str]:
    out = base / "output"
    return [sys.executable, "-m", "pipeline", *COMMON, f"run.dir={base / 'run'}", *overrides,
            f"job.input={input_url or SAMPLE}", f"job.output={out.as_uri() if file_urls else out}"]


def start_run(tmp_path_factory, name: str, *overrides: str, input_url: str | None = None,
              file_urls: bool = False, cpus: set[int] | None = None) -> PendingRun:
    """Start a run of the pipeline over ``input_url`` (default the sample) without waiting.

    ``cpus``: the cores the whole run (driver, workers, engines) is confined to. A reference run
    started beside another run gets the last core (:func:`last_core`): a local disaggregated run
    pins its prefill engine to the first core and its decode engine to the last, which sits idle
    while long prompts are prefilled and while engines start."""
    base = tmp_path_factory.mktemp(name)
    return PendingRun(name, base, _pipeline_cmd(base, overrides, input_url, file_urls), cpus)


def shared_run(tmp_path_factory, name: str, *overrides: str, input_url: str | None = None,
               file_urls: bool = False, cpus: set[int] | None = None,
               cmd: list[str] | None = None) -> PendingRun:
    """The session's one run ``name`` (:func:`start_run`'s arguments, or any command ``cmd``
    given a folder ``{base}``), started by whichever pytest-xdist worker asks first, in
    :func:`shared_dir`; a worker asking later attaches to it (a lock file orders them)."""
    from filelock import FileLock

    root = shared_dir(tmp_path_factory)
    base = root / name
    with FileLock(root / f"{name}.lock"):
        if base.exists():
            return PendingRun(name, base, None)
        base.mkdir()
        argv = ([a.format(base=base) for a in cmd] if cmd is not None
                else _pipeline_cmd(base, overrides, input_url, file_urls))
        return PendingRun(name, base, argv, cpus)


def last_core() -> set[int]:
    return {max(os.sched_getaffinity(0))}


def _run(tmp_path_factory, name: str, *overrides: str, input_url: str | None = None,
         file_urls: bool = False) -> Run:
    return start_run(tmp_path_factory, name, *overrides, input_url=input_url, file_urls=file_urls).wait()


@pytest.fixture(scope="session", autouse=True)
def _colocated_started(request, tmp_path_factory):
    """Starts :func:`colocated_run` with the session when a selected test uses it, on the last
    core (once for all pytest-xdist workers: :func:`shared_run`)."""
    if not any("colocated_run" in item.fixturenames for item in request.session.items):
        yield None
        return
    pending = shared_run(tmp_path_factory, "colocated", "pools=colocated", "job.unit_rows=4",
                         input_url=SAMPLE.as_uri(), file_urls=True, cpus=last_core())
    yield pending
    pending.end()


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
    (the colocated run has the last), once for all pytest-xdist workers."""
    if not any("reference" in item.fixturenames for item in request.session.items):
        yield None
        return
    pending = shared_run(tmp_path_factory, "reference", cpus={min(os.sched_getaffinity(0))},
                         cmd=[sys.executable, "-m", "tests.reference", "{base}/reference.json"])
    yield pending
    pending.end()


@pytest.fixture(scope="session")
def reference(_reference_started) -> dict[str, list[dict]]:
    """The independent reference (:mod:`tests.reference`): raw vLLM ``LLM.generate`` in float32
    over the sample, prompts rendered by the tokenizer's own ``apply_chat_template``, ids read
    with pyarrow: ``{shard: [{id, prompt_ids, token_ids}]}`` in file order."""
    pending = _reference_started
    rc = pending.returncode(900)
    log = (pending.base / "stdout.txt").read_text() + (pending.base / "stderr.txt").read_text()
    assert rc == 0, f"the reference (raw vLLM) failed:\n{log[-4000:]}"
    return json.loads((pending.base / "reference.json").read_text())


@pytest.fixture(scope="session")
def installed(tmp_path_factory):
    """This checkout's wheel in a fresh venv, run as ``pd-pipeline`` outside the checkout
    (:class:`tests.wheel.Installed`), built once per session (~15 s)."""
    from tests.wheel import install_wheel

    return install_wheel(tmp_path_factory.mktemp("install"))


@pytest.fixture(scope="session")
def push_run(tmp_path_factory) -> Run:
    """1P:1D, prefill WRITEs KV into decode's blocks (NixlPushConnector); one run for all
    pytest-xdist workers."""
    return shared_run(tmp_path_factory, "push", "pools=disaggregated", "transport=nixl_push").wait()


@pytest.fixture(scope="session")
def pull_run(tmp_path_factory) -> Run:
    """1P:1D, decode READs KV from prefill's blocks (NixlConnector), input given as a glob."""
    return shared_run(tmp_path_factory, "pull", "pools=disaggregated", "transport=nixl_pull",
                      input_url=str(SAMPLE / "part-*.parquet")).wait()


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, pyproject's ``addopts``), how tests are
    shared among workers: each test file is a group, run whole by one worker (its module
    fixtures, end-to-end runs, run once), except that every file with a test on the test Slurm
    joins one group, ``slurm``: one worker drives the one test Slurm (its lost-node and cut-link
    tests would disturb another worker's jobs). Groups are queued longest first, as far as the
    markers tell: the Slurm group, then files with end-to-end runs, then the quick ones, which
    fill the end. Runs before xdist's own hook, which reads the groups."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    on_slurm = {item.path for item in items
                if item.get_closest_marker("slurm") or "slurm_cluster" in item.fixturenames}
    with_e2e = {item.path for item in items if item.get_closest_marker("e2e")}
    first: dict[Path, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
        item.add_marker(pytest.mark.xdist_group("slurm" if item.path in on_slurm else str(item.path.relative_to(ROOT))))

    def rank(item) -> tuple[int, int]:
        kind = 0 if item.path in on_slurm else 1 if item.path in with_e2e else 2
        return kind, 0 if kind == 0 else first[item.path]

    items.sort(key=rank)
