"""The multi-node test Slurm (slurm/start-test-cluster.sh --nodes 4: munged, slurmctld, one
slurmd per node namespace) and its faults on demand (slurm/netfault.sh).

Its daemons start with the caller's open files closed: a pipe held open around the start script
reaches EOF once the script returns, i.e. no daemon kept its write end. The script does nothing
while the cluster is healthy, so when the cluster is already up (the session fixture
tests.conftest.slurm_cluster, or an earlier run) that test restarts it (stop script, then start
script) and leaves it up; when it was down, it stops it again afterwards."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, SLURM_NODES

pytestmark = pytest.mark.slurm

START, STOP = ROOT / "slurm" / "start-test-cluster.sh", ROOT / "slurm" / "stop-test-cluster.sh"
NODES = [f"pd-node{k}" for k in range(1, SLURM_NODES + 1)]
STATE = Path(os.environ.get("PD_SLURM_STATE", "/var/tmp/pd-slurm"))
CORES = sorted(os.sched_getaffinity(0))
PID_FILES = {"munged": Path("/run/munge/munged.pid"), "slurmctld": STATE / "slurmctld.pid",
             **{f"slurmd {n}": STATE / f"slurmd-{n}.pid" for n in NODES}}


def _daemons() -> dict[str, int]:
    """The running daemons of the test cluster, by name -> pid (from their pid files)."""
    out = {}
    for name, f in PID_FILES.items():
        try:
            pid = int(f.read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            continue
        out[name] = pid
    return out


def _holders(target: str) -> list[str]:
    """Other processes with an open file descriptor on ``target`` (``pipe:[inode]``), as "pid name"."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (proc / "fd").iterdir()):
                found.append(f"{proc.name} {(proc / 'comm').read_text().strip()}")
        except OSError:
            continue
    return found


def test_daemons_start_with_the_callers_open_files_closed():
    if os.geteuid() != 0:
        pytest.skip("the test Slurm needs root (apt-get, munge, slurmd)")
    was_up = len(_daemons()) == len(PID_FILES)
    if was_up:  # make the start script start every daemon while our pipe is open
        subprocess.run(["bash", str(STOP)], stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    r, w = os.pipe()
    target = f"pipe:[{os.fstat(w).st_ino}]"
    try:
        try:
            p = subprocess.run(["bash", str(START), "--nodes", str(SLURM_NODES)], pass_fds=(w,), stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=600)
        finally:
            os.close(w)
        assert p.returncode == 0, f"test Slurm did not come up:\n{p.stdout}\n{p.stderr}"
        daemons = _daemons()
        assert set(daemons) == set(PID_FILES), f"not running after the start script: {set(PID_FILES) - set(daemons)}"
        holders = _holders(target)
        ready, _, _ = select.select([r], [], [], 5)
        assert ready and os.read(r, 1) == b"", f"the caller's pipe is still held open by: {holders}"
        assert not holders
    finally:
        os.close(r)
        if not was_up:
            subprocess.run(["bash", str(STOP)], stdin=subprocess.DEVNULL, capture_output=True, timeout=120)


def test_a_cold_start_keeps_no_job_of_the_last_cluster(slurm_cluster):
    """A cluster whose daemons died with a job running (kill -9, as when the machine went away,
    so no scancel reached it) comes back with no job and every node idle: slurmctld's saved
    state would otherwise requeue the job and give it the nodes (CI of stop 59 found all four
    "allocated" to an earlier run's jobs). Leaves the cluster up."""
    p = subprocess.run(["sbatch", "--parsable", "-N", str(SLURM_NODES), "-o", "/dev/null", "--wrap", "sleep 900"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    for _ in range(30):
        if subprocess.run(["squeue", "-h", "-j", p.stdout.strip(), "-o", "%T"], capture_output=True, text=True,
                          timeout=30).stdout.strip() == "RUNNING":
            break
        time.sleep(1)
    os.kill(_daemons()["slurmctld"], 9)
    subprocess.run(["bash", str(STOP)], stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    start = subprocess.run(["bash", str(START), "--nodes", str(SLURM_NODES)], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=600)
    assert start.returncode == 0, start.stdout + start.stderr
    jobs = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=30)
    assert jobs.returncode == 0 and jobs.stdout.strip() == "", jobs.stdout + jobs.stderr
    states = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %T"], capture_output=True, text=True,
                            timeout=30).stdout.split("\n")
    assert sorted(line for line in states if line) == [f"{n} idle" for n in NODES]


NETFAULT = ROOT / "slurm" / "netfault.sh"


def _netfault(*args: str) -> subprocess.CompletedProcess:
    p = subprocess.run(["bash", str(NETFAULT), *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"netfault.sh {' '.join(args)}: {p.stderr}"
    return p


def _in(node: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", node, *cmd], capture_output=True, text=True, timeout=timeout)


def _reaches(node: str, addr: str, port: int) -> bool:
    """Whether a TCP connection from ``node`` to ``addr:port`` is made within 2 s."""
    probe = (f"import socket\ntry:\n    socket.create_connection(({addr!r}, {port}), timeout=2).close()\n"
             f"except OSError:\n    raise SystemExit(1)")
    return _in(node, sys.executable, "-c", probe).returncode == 0


def _iperf_mbit(client: str, server_addr: str) -> float:
    """Mbit/s a 2-second iperf3 TCP stream from ``client`` to ``server_addr`` delivered."""
    p = _in(client, "iperf3", "-c", server_addr, "-t", "2", "-J")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    return json.loads(p.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6


def test_nodes_are_hosts_and_netfault_shapes_cuts_and_loses_them(slurm_cluster):
    """Each node is a host of its own (its name, its address, its slurmd, no route out of the
    bridge), and each fault of slurm/netfault.sh does what it says, measured from the nodes
    (iperf3, TCP connects, Slurm): rate, clear, cut for a time, cut and heal, lost and back."""
    for k, node in enumerate(NODES, 1):
        slurmd = PID_FILES[f"slurmd {node}"].read_text().split()[0]
        assert slurmd in _pids(node)
        assert subprocess.run(["nsenter", "--uts", "-t", slurmd, "hostname"], capture_output=True,
                              text=True).stdout.strip() == node
        # Its own core (this machine's in turn), which its jobs inherit (TaskPlugin=task/none).
        assert os.sched_getaffinity(int(slurmd)) == {CORES[(k - 1) % len(CORES)]}
        assert f"inet 198.18.0.{k}/24" in _in(node, "ip", "-4", "addr", "show", "eth0").stdout
        route = f"198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.{k}"
        assert _in(node, "ip", "route").stdout.strip() == route  # no route out of the bridge

    a, b, b_addr = "pd-node1", "pd-node2", "198.18.0.2"
    server = subprocess.Popen(["ip", "netns", "exec", b, "iperf3", "-s", "-p", "5201"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            if _reaches(a, b_addr, 5201):
                break
            time.sleep(0.1)
        _netfault(b, "rate", "100")
        shaped = _iperf_mbit(a, b_addr)
        assert 60 < shaped <= 105, shaped
        _netfault(b, "clear")
        assert _iperf_mbit(a, b_addr) > 2 * shaped

        _netfault(a, "cut", b, "8")
        t0 = time.monotonic()
        assert not _reaches(a, b_addr, 5201) and not _reaches(b, "198.18.0.1", 6818)  # both ways
        assert _reaches(a, "198.18.0.3", 6818)  # only that pair
        time.sleep(max(0.0, 8.5 - (time.monotonic() - t0)))
        assert _reaches(a, b_addr, 5201), "the timed cut did not heal"
        _netfault(b, "cut", a)
        assert not _reaches(a, b_addr, 5201)
        _netfault(a, "heal")
        assert _reaches(a, b_addr, 5201)
    finally:
        server.kill()
        server.wait()
        subprocess.run(["bash", str(NETFAULT), b, "clear"], capture_output=True, timeout=60)

    lost = NODES[-1]
    started = _slurmd_start_time(lost)
    _netfault(lost, "lost")
    assert _pids(lost) == []
    assert "state DOWN" in subprocess.run(["ip", "link", "show", f"pd-veth{SLURM_NODES}"], capture_output=True,
                                          text=True).stdout
    time.sleep(1)  # Slurm's start times are whole seconds
    _netfault(lost, "back")
    deadline = time.monotonic() + 60
    while _slurmd_start_time(lost) == started:  # a fresh slurmd registered with the controller
        assert time.monotonic() < deadline, "the node did not come back"
        time.sleep(1)
    back = PID_FILES[f"slurmd {lost}"].read_text().split()[0]
    assert back in _pids(lost)
    assert os.sched_getaffinity(int(back)) == {CORES[(SLURM_NODES - 1) % len(CORES)]}


def _pids(node: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True).stdout.split()


def _slurmd_start_time(node: str) -> str:
    out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True).stdout
    return out.split("SlurmdStartTime=")[1].split()[0]


def _on_node(node: str, code: str) -> subprocess.CompletedProcess:
    """Python ``code`` run on ``node`` as its workers run there (its namespace, host name, hosts
    file), from the repository root."""
    return subprocess.run(["bash", "-c", f'. slurm/testnet.sh && in_node {node} "$0" -c "$1"', sys.executable, code],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_node_whose_name_resolves_to_loopback_advertises_its_link(slurm_cluster):
    """Each node's /etc/hosts is Debian's (its own name on 127.0.1.1): a worker there advertises
    its link's address, or, with two candidate interfaces, refuses with a message naming them."""
    code = "from pipeline.runtime.addresses import node_address; print(node_address())"
    p = _on_node("pd-node1", "import socket; print(socket.gethostbyname(socket.gethostname())); " + code)
    assert p.stdout.split() == ["127.0.1.1", "198.18.0.1"], p.stderr
    assert "resolves to 127.0.1.1" in p.stderr
    subprocess.run(["ip", "-n", "pd-node1", "link", "add", "pdx0", "type", "veth", "peer", "name", "pdx1"], check=True)
    try:
        for dev, addr in (("pdx0", "198.19.0.1/24"), ("pdx1", "198.19.0.2/24")):
            subprocess.run(["ip", "-n", "pd-node1", "addr", "add", addr, "dev", dev], check=True)
            subprocess.run(["ip", "-n", "pd-node1", "link", "set", dev, "up"], check=True)
        p = _on_node("pd-node1", code)
        assert p.returncode != 0
        assert "set transport.interface" in p.stderr and "eth0 198.18.0.1" in p.stderr and "pdx0 198.19.0.1" in p.stderr
    finally:
        subprocess.run(["ip", "-n", "pd-node1", "link", "del", "pdx0"], capture_output=True)


BUSY = ("import time\nt0, c0 = time.monotonic(), time.process_time()\n"
        "while time.monotonic() - t0 < 3:\n    pass\n"
        "print((time.process_time() - c0) / (time.monotonic() - t0))")


def _cpu_share(node: str) -> float:
    """CPU seconds per second of wall time that one busy thread got in a 3 s job on ``node``
    (its own process CPU time, counted by the kernel, not by the cap's cgroup)."""
    p = subprocess.run(["srun", "-w", node, "-t", "1", sys.executable, "-c", BUSY],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return float(p.stdout.split()[-1])


def test_node_cpus_caps_each_nodes_processes_and_goes_with_the_cluster(slurm_cluster):
    """start-test-cluster.sh --node-cpus 0.5: each node's slurmd, and so every job it starts,
    runs in a CPU cgroup of its own capped at half a core: one busy thread in a job gets at most
    ~0.5 CPU seconds per second, where uncapped it gets its core (nothing else runs on it during
    the suite). The stop script removes the cgroups. The cluster is left up uncapped, as the
    suite's other Slurm tests expect."""
    def start(*extra: str) -> None:
        p = subprocess.run(["bash", str(START), "--nodes", str(SLURM_NODES), *extra], capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr

    # Where the start script puts a node's cgroup (testnet.sh's node_cgroup_dir: cgroup v1 or v2).
    where = subprocess.run(["bash", "-c", f". {ROOT / 'slurm' / 'testnet.sh'} && node_cgroup_dir pd-probe"],
                           capture_output=True, text=True)
    if where.returncode != 0:
        pytest.skip(f"no cgroup cpu controller here ({where.stderr.strip()}): --node-cpus needs one")
    probe = Path(where.stdout.strip())
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        pytest.skip(f"no CPU cgroup can be made here ({e}): --node-cpus needs one")
    try:
        start("--node-cpus", "0.5")
        assert (STATE / "node-cpus").read_text().strip() == "0.5"
        pid = int((STATE / "slurmd-pd-node2.pid").read_text().split()[0])
        assert "/pd-node2" in Path(f"/proc/{pid}/cgroup").read_text()
        capped = _cpu_share("pd-node2")
        assert 0.3 < capped < 0.6, capped
    finally:
        start()  # not healthy for an uncapped start: stopped (cgroups removed), started uncapped
    assert not (STATE / "node-cpus").exists()
    assert not list(probe.parent.glob("pd-node*"))
    assert _cpu_share("pd-node2") > 0.8
    bad = subprocess.run(["bash", str(START), "--nodes", "1", "--node-cpus", "0.5"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--node-cpus needs --nodes 2" in bad.stderr
