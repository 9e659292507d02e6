"""NIXL side-channel ports (pipeline.runtime.ports): a taken port fails at once, naming the port,
the host and ``transport.base_port``; a picked free port is held until the engine binds it; a
port taken while the engine starts ends the start within seconds instead of vLLM's 600 s.

Everything here is real sockets and real processes: "another process" is a Python child that
listens, and the engine's bind is vLLM's own NIXL handshake listener run in a child process."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import zmq

from pipeline.config import compose
from pipeline.runtime.ports import PortInUseError, check_ports_free, side_channel, start_on_side_channel

HOST = "127.0.0.1"

# Another process that listens on the ports given (SO_REUSEADDR, as servers do), or on a base
# port P it picks such that P and P+10 are both free; prints the base port, then waits.
_LISTENER = textwrap.dedent("""
    import os, socket, sys
    def listen(port):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        return s
    offsets = [int(a) for a in sys.argv[2:]]
    if sys.argv[1] != "0":
        held = [listen(int(sys.argv[1]) + o) for o in offsets]
        base = int(sys.argv[1])
    else:
        while True:
            first = listen(0)
            base = first.getsockname()[1] - offsets[0]
            try:
                held = [first] + [listen(base + o) for o in offsets[1:]]
                break
            except OSError:
                first.close()
    print(base, os.getpid(), flush=True)
    sys.stdin.read()
""")


class Listener:
    """Another process (not a descendant of this one: started through a parent that exits at
    once) listening on ``base + offset`` for each offset; it ends when :meth:`close` closes its
    stdin."""

    def __init__(self, base: int = 0, offsets: tuple[int, ...] = (0,)):
        start = "import subprocess, sys; subprocess.Popen(sys.argv[1:])"
        self.p = subprocess.Popen([sys.executable, "-c", start, sys.executable, "-c", _LISTENER,
                                   str(base), *map(str, offsets)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.p.wait(30)
        line = self.p.stdout.readline().split()
        assert line, "the listener did not start"
        self.base, self.pid = int(line[0]), int(line[1])
        assert self.pid not in {c.pid for c in psutil.Process().children(recursive=True)}

    def close(self) -> None:
        self.p.stdin.close()
        self.p.stdout.close()
        try:
            psutil.Process(self.pid).wait(10)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            psutil.Process(self.pid).kill()


def _cfg(*overrides: str):
    return compose(["+job=summarize", *overrides])


def _plain_bind_fails(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return True
    return False


def test_taken_fixed_port_fails_at_once_naming_port_host_and_setting():
    # Case 10: another process listens on P and P+10 (decode rank 0's and prefill task 0's ports).
    other = Listener(offsets=(0, 10))
    try:
        p = other.base
        cfg = _cfg(f"transport.base_port={p}")
        for slot, port in ((0, p), (1, p + 10)):
            t = time.monotonic()
            with pytest.raises(PortInUseError) as err:
                with side_channel(cfg, slot, HOST):
                    pytest.fail("the engine must not start on a taken port")
            assert time.monotonic() - t < 2
            msg = str(err.value)
            assert "\n" not in msg
            assert f"port {port} on {HOST}" in msg and f"transport.base_port={p}" in msg
            assert f"pid {other.pid}" in msg  # who holds it
    finally:
        other.close()


def test_check_ports_free_names_the_first_taken_port():
    other = Listener(offsets=(10,))  # only P+10 (prefill task 0 of 1P:1D) is taken
    try:
        p = other.base
        with pytest.raises(ValueError, match=rf"port {p + 10} on 127\.0\.0\.1 .*transport\.base_port={p}"):
            check_ports_free(_cfg(f"transport.base_port={p}"))
        # 2 decode ranks: P+10 is decode rank 1's port, named the same way
        with pytest.raises(ValueError, match=rf"port {p + 10} .*slot 1"):
            check_ports_free(_cfg(f"transport.base_port={p}", "pools.decode=2"))
        # Nothing to check: free ports, another node's ports, engines without a side channel.
        check_ports_free(_cfg("transport.base_port=0"))
        check_ports_free(_cfg(f"transport.base_port={p}", "cluster.launcher=slurm"))
        check_ports_free(_cfg(f"transport.base_port={p}", "pools=colocated"))
        check_ports_free(_cfg(f"transport.base_port={p}", "offload=dram"))
    finally:
        other.close()
    check_ports_free(_cfg(f"transport.base_port={p}"))  # all free now


_ZMQ_BIND = textwrap.dedent("""
    import sys, time, zmq
    s = zmq.Context().socket(zmq.ROUTER)
    s.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
    print("bound", flush=True)
    ident, _, msg = s.recv_multipart()
    s.send_multipart([ident, b"", msg])
    time.sleep(60)
""")


def test_free_port_is_held_until_the_engine_binds_it_and_then_left_alone():
    cfg = _cfg("transport.base_port=0")
    with side_channel(cfg, 0, HOST, watch_interval_s=0.2) as port:
        assert port > 0
        # Held: nothing else can take it (a plain bind fails) ...
        assert _plain_bind_fails(port)
        # ... but the engine's own ZeroMQ bind (SO_REUSEADDR, as vLLM's) succeeds, and answers.
        engine = subprocess.Popen([sys.executable, "-c", _ZMQ_BIND, str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert engine.stdout.readline().strip() == "bound"
            ctx = zmq.Context()
            req = ctx.socket(zmq.REQ)
            req.setsockopt(zmq.RCVTIMEO, 5000)
            req.connect(f"tcp://{HOST}:{port}")
            req.send(b"hello")
            assert req.recv() == b"hello"
            req.close(0)
            ctx.term()
            time.sleep(1.0)  # several watch rounds: our own listener is not "another process"
            assert engine.poll() is None
        finally:
            engine.kill()
            engine.wait()
    assert not _plain_bind_fails(port)  # released


def test_own_listener_is_ours_even_when_listing_our_children_fails(monkeypatch):
    """Seen once in a full suite run: the watch took our own engine core's listener for another
    process's and killed the engine. A walk of our children can miss a process or fail (here:
    every other walk fails); ownership is now read from the listener's own ancestry."""
    listed = psutil.Process.children
    calls = []

    def children(self, recursive=False):  # every other walk fails, as when a child just exited
        calls.append(1)
        if len(calls) % 2:
            raise psutil.NoSuchProcess(4242, "exited while its parent's children were listed")
        return listed(self, recursive=recursive)

    cfg = _cfg("transport.base_port=0")
    with side_channel(cfg, 0, HOST, watch_interval_s=0.2) as port:
        monkeypatch.setattr(psutil.Process, "children", children)
        engine = subprocess.Popen([sys.executable, "-c", _ZMQ_BIND, str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert engine.stdout.readline().strip() == "bound"
            time.sleep(1.0)  # several watch rounds
            assert engine.poll() is None, "the watch killed our own engine"
        finally:
            engine.kill()
            engine.wait()


# vLLM's own NIXL side-channel listener, started as vLLM's engine core does
# (NixlBaseConnectorScheduler.set_xfer_handshake_metadata): a thread binds, the caller waits.
_VLLM_LISTENER = textwrap.dedent("""
    import sys, threading
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_scheduler import NixlBaseConnectorScheduler
    print("imported", flush=True)
    sys.stdin.readline()
    ready, stop = threading.Event(), threading.Event()
    threading.Thread(target=NixlBaseConnectorScheduler._nixl_handshake_listener,
                     args=({}, ready, stop, "127.0.0.1", int(sys.argv[1])), daemon=True).start()
    ready.wait()
    print("bound", flush=True)
    stop.set()
""")


def _vllm_listener(port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _VLLM_LISTENER, str(port)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "imported", p.stderr.read()
    return p


def test_port_taken_while_the_engine_starts_ends_it_within_seconds():
    # Without the guard: vLLM's listener thread dies on the taken port and its caller waits
    # forever (the engine core then hangs until VLLM_ENGINE_READY_TIMEOUT_S, 600 s).
    other = Listener()
    bare = _vllm_listener(other.base)
    try:
        bare.stdin.write("go\n")
        bare.stdin.flush()
        time.sleep(3)
        assert bare.poll() is None, "vLLM's side-channel bind no longer hangs on a taken port"
    finally:
        bare.kill()
        bare.wait()
        other.close()
    assert "Address already in use" in bare.stderr.read()

    # With it: a free port is picked and held, another process starts listening on it (an
    # explicit bind with SO_REUSEADDR gets past the hold), then the engine binds.
    cfg = _cfg("transport.base_port=0")
    with pytest.raises(PortInUseError) as err:
        with side_channel(cfg, 0, HOST, watch_interval_s=0.5) as port:
            engine = _vllm_listener(port)  # the engine core: a process this one started
            thief = Listener(base=port)
            t = time.monotonic()
            engine.stdin.write("go\n")
            engine.stdin.flush()
            try:
                # What vLLM's start-up does: wait for the engine core, failing when it dies.
                if engine.wait(timeout=30) != 0:
                    raise RuntimeError("Engine core initialization failed")
            finally:
                engine.kill()
                thief.close()
    assert time.monotonic() - t < 5
    msg = str(err.value)
    assert f"port {port} on {HOST}" in msg and "transport.base_port=0" in msg
    assert isinstance(err.value.__cause__, RuntimeError)


def test_free_port_lost_while_the_engine_starts_is_picked_again():
    """start_on_side_channel: the first engine start loses its free port to another process
    (as above) and is ended; the second starts on another free port and is kept. A fixed port
    that is taken is not retried."""
    cfg = _cfg("transport.base_port=0")
    ports, thieves = [], []

    def start(port: int) -> subprocess.Popen:
        ports.append(port)
        engine = _vllm_listener(port)
        if len(ports) == 1:
            thieves.append(Listener(base=port))
        engine.stdin.write("go\n")
        engine.stdin.flush()
        if len(ports) == 1:
            try:
                if engine.wait(timeout=30) != 0:  # ended by the watch, as vLLM's start-up sees it
                    raise RuntimeError("Engine core initialization failed")
            finally:
                engine.kill()
        assert engine.stdout.readline().strip() == "bound"
        return engine

    try:
        engine = start_on_side_channel(cfg, 0, HOST, start, watch_interval_s=0.5)
        engine.wait(timeout=30)
    finally:
        for t in thieves:
            t.close()
    assert len(ports) == 2 and ports[0] != ports[1]

    other = Listener()
    try:
        with pytest.raises(PortInUseError):
            start_on_side_channel(_cfg(f"transport.base_port={other.base}"), 0, HOST,
                                  lambda port: pytest.fail("no engine start on a taken fixed port"))
    finally:
        other.close()
