"""KV hand-offs across hosts on a shaped link, against a plain TCP stream on that same link, and
the planner's prediction of them (issue #26, section 3).

Needs root: it brings up the multi-node test Slurm (``slurm/start-test-cluster.sh --nodes 4``,
one network namespace per node) if it is not up, and shapes links with ``slurm/netfault.sh``.
In one invocation:

1. **Run A** (calibration): 1P:1D NIXL push on ``cluster=slurm-test-nodes`` (prefill on
   pd-node1 or 2, decode on pd-node3 or 4), KV over TCP on the nodes' ``eth0``
   (``transport.ucx_tls=tcp transport.ucx_net_devices=eth0``), links unshaped.
2. The decode nodes' links are shaped to ``--mbit`` (``netfault.sh pd-node3 rate MBIT``, the same
   for pd-node4: tbf on both ends of each link).
3. **Run B**: the same job on the shaped links.
   While it runs, a thread samples the byte counters of the decode nodes' links every 2 ms
   (``/sys/class/net/pd-vethK/statistics/tx_bytes``: this side's end of the link, so what the
   node received).
4. **TCP on the same link**, right after run B with the shaping unchanged: ``iperf3 -t 5`` from
   run B's prefill node to its decode node (one TCP stream), Mbit/s received.
5. Shaping cleared.

Figures (run B unless said):

- **KV rate on the wire**, per burst: the link's samples are cut into bursts (bytes arriving,
  no gap of 20 ms or more); a burst of at least 1 MiB is KV (the control messages are
  kilobytes), and its rate is its bytes over its own duration. Median over bursts; its ratio to
  the iperf3 stream's rate is the figure the issue targets (>= 0.8x).
- **KV rate as vLLM sees it** = bytes / seconds from post to completion, from the prefill
  worker's own NIXL telemetry (``kv_transfer_bytes``, ``kv_transfer_s`` in its step metrics).
  Completion is seen when the engine next checks its transfers (once per engine step), so on
  these CPUs, where a prefill step takes seconds, this is a bound on the step, not the link.
- **Hand-off p50** measured = median over rows of first token - prefill end
  (``pipeline.report``'s ``kv_handoff_s``).
- **Planner**: :func:`pipeline.plan.calibrate.calibrate` on run A, its link rate replaced by
  ``--mbit`` (what ``python -m pipeline.plan --calibrate RUN_A --link-gbit G`` does); predicted
  hand-off of each row of B = its KV bytes / link rate + the calibrated hand-off latency
  (:class:`pipeline.plan.predict.PrefillSide`'s ``handoff_s``); p50 over B's rows, and its ratio
  to the measured p50 (target: within 25%). The same from a calibration on run B itself (its
  link rate and latency fitted from its own hand-offs: a check of the model's form, not a
  prediction).

Run from the repository root (about 8 minutes on 2 cores: two runs of two engines each)::

    .venv/bin/python tools/bench_link.py [--mbit 1000] [--input data/sample] [--json out.json]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.benchlib import REPO  # noqa: E402
from tools.benchlib.cli import parser  # noqa: E402
from tools.benchlib.machine import machine_text  # noqa: E402
from tools.benchlib.procs import run_pipeline  # noqa: E402
from tools.benchlib.results import write_json  # noqa: E402
from tools.benchlib.stats import ratio  # noqa: E402

NODES = 4
DECODE_NODES = ("pd-node3", "pd-node4")
ACROSS_HOSTS = ["cluster=slurm-test-nodes", "transport.ucx_tls=tcp", "transport.ucx_net_devices=eth0"]


def _sh(*cmd: str, timeout: float = 600) -> str:
    p = subprocess.run(list(cmd), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


def _netfault(node: str, *args: str) -> None:
    _sh("bash", "slurm/netfault.sh", node, *args)


def _run(name: str, base: Path, input_path: str) -> Path:
    run_dir = base / name
    run_pipeline(["+job=summarize", *ACROSS_HOSTS, "transport=nixl_push", "pools.prefill=1", "pools.decode=1",
                  "model.dtype=float32", "run.progress=false", "run.wait=true", f"job.input={input_path}",
                  f"run.dir={run_dir}", f"job.output={run_dir / 'output'}"], f"run {name}")
    return run_dir


def _hosts(run_dir: Path) -> tuple[str, str]:
    """(prefill node, decode node) of a 1P:1D run, from its rows."""
    from pipeline.io.metrics import read_request_metrics

    rows = read_request_metrics(run_dir).to_pylist()
    pairs = {(r["prefill_worker"].split("@")[1], r["decode_worker"].split("@")[1]) for r in rows if r["decode_worker"]}
    if len(pairs) != 1:
        raise SystemExit(f"{run_dir}: expected one prefill and one decode node, got {sorted(pairs)}")
    return pairs.pop()


def _transfer_rates(run_dir: Path) -> list[float]:
    """Bytes/s of each KV transfer the prefill worker posted: bytes / seconds post to completion."""
    from pipeline.io.metrics import read_worker_metrics

    out = []
    for r in read_worker_metrics(run_dir).to_pylist():
        if r["role"] == "prefill" and r["kv_transfer_bytes"]:
            out += [b / s for b, s in zip(r["kv_transfer_bytes"], r["kv_transfer_s"]) if s and b]
    return out


def _handoffs(run_dir: Path) -> list[tuple[int, float]]:
    """(prompt tokens, hand-off seconds = first token - prefill end) of each row with KV moved."""
    from pipeline.io.metrics import read_request_metrics

    return [(r["prompt_tokens"], r["token_times"][0] - r["prefill_end"])
            for r in read_request_metrics(run_dir).to_pylist()
            if r["kv_tokens"] and r["token_times"] and r["prefill_end"] is not None]


class LinkSampler:
    """Samples the received-byte counters of nodes' links every ``interval_s`` seconds in a thread
    (``with LinkSampler(nodes) as s: ...``; then ``s.samples[node]`` is ``[(t, bytes), ...]``)."""

    def __init__(self, nodes: tuple[str, ...], interval_s: float = 0.002):
        self.files = {n: Path(f"/sys/class/net/pd-veth{n.removeprefix('pd-node')}/statistics/tx_bytes") for n in nodes}
        self.samples: dict[str, list[tuple[float, int]]] = {n: [] for n in nodes}
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            for n, f in self.files.items():
                self.samples[n].append((t, int(f.read_text())))
            time.sleep(self.interval_s)

    def __enter__(self) -> "LinkSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def burst_rates(samples: list[tuple[float, int]], gap_s: float = 0.02, min_bytes: int = 2**20) -> list[float]:
    """Bytes/s of each burst of at least ``min_bytes`` in counter ``samples`` ``[(t, bytes)]``: a
    burst is a run of growing samples with no gap of ``gap_s`` seconds or more without growth
    inside; its rate is the growth from its first grown sample to its last over the time between
    them (the bytes of the first interval are left out with that interval, whose start within
    the burst is unknown)."""
    rates, start, last, first_bytes, last_bytes = [], None, None, 0, 0
    for (t0, b0), (t1, b1) in zip(samples, samples[1:]):
        if b1 == b0:
            continue
        if start is not None and t0 - last >= gap_s:
            if last_bytes - first_bytes >= min_bytes and last > start:
                rates.append((last_bytes - first_bytes) / (last - start))
            start = None
        if start is None:
            start, first_bytes = t1, b1
        last, last_bytes = t1, b1
    if start is not None and last_bytes - first_bytes >= min_bytes and last > start:
        rates.append((last_bytes - first_bytes) / (last - start))
    return rates


def _iperf_mbit(client: str, server: str) -> float:
    """Mbit/s one 5-second iperf3 TCP stream from node ``client`` to node ``server`` delivered."""
    addr = f"198.18.0.{server.removeprefix('pd-node')}"
    srv = subprocess.Popen(["ip", "netns", "exec", server, "iperf3", "-s", "-1", "-p", "5202"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            p = subprocess.run(["ip", "netns", "exec", client, "iperf3", "-c", addr, "-p", "5202", "-t", "5", "-J"],
                               capture_output=True, text=True, timeout=60)
            if p.returncode == 0:
                return json.loads(p.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6
            time.sleep(0.2)  # the server was not listening yet
        raise SystemExit(f"iperf3 {client} -> {server} failed: {p.stdout[-1000:]}")
    finally:
        srv.kill()
        srv.wait()


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--mbit", type=float, default=1000.0, help="rate of the decode nodes' links, Mbit/s")
    ap.add_argument("--input", default=str(REPO / "data" / "sample"), help="job input (default: the sample)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)

    from pipeline.plan.calibrate import calibrate, model_of_run

    _sh("bash", "slurm/start-test-cluster.sh", "--nodes", str(NODES))
    base = Path(tempfile.mkdtemp(prefix="bench-link-"))
    for node in DECODE_NODES:
        _netfault(node, "clear")
    run_a = _run("a-unshaped", base, args.input)
    try:
        for node in DECODE_NODES:
            _netfault(node, "rate", f"{args.mbit:g}")
        with LinkSampler(DECODE_NODES) as sampler:
            run_b = _run("b-shaped", base, args.input)
        prefill_node, decode_node = _hosts(run_b)
        tcp_mbit = _iperf_mbit(prefill_node, decode_node)
    finally:
        for node in DECODE_NODES:
            _netfault(node, "clear")

    bursts = burst_rates(sampler.samples[decode_node])
    wire_mbit = statistics.median(bursts) * 8 / 1e6 if bursts else None
    rates_b, rates_a = _transfer_rates(run_b), _transfer_rates(run_a)
    seen_mbit = statistics.median(rates_b) * 8 / 1e6 if rates_b else None
    measured = _handoffs(run_b)
    hand_p50 = statistics.median(h for _, h in measured)
    model = model_of_run(run_a)
    link = args.mbit * 1e6 / 8
    planner = {}
    for name, calibrated in (("a", calibrate(run_a, model)), ("b", calibrate(run_b, model))):
        use_link = link if name == "a" else calibrated.link_bw
        pred_p50 = statistics.median(p * model.kv_bytes_per_token / use_link + calibrated.handoff_s for p, _ in measured)
        planner[name] = {"calibrated_on": f"run {name}", "link_bytes_per_s": use_link,
                         "calibrated_link_bytes_per_s": calibrated.link_bw, "handoff_latency_s": calibrated.handoff_s,
                         "predicted_handoff_p50_s": pred_p50, "predicted_over_measured": ratio(hand_p50, pred_p50)}
    out = {
        "mbit": args.mbit, "input": args.input, "runs": {"a": str(run_a), "b": str(run_b)},
        "nodes": {"prefill": prefill_node, "decode": decode_node},
        "tcp_stream_mbit": tcp_mbit,
        "kv_wire_mbit_p50": wire_mbit, "kv_bursts": len(bursts), "kv_wire_over_tcp": ratio(tcp_mbit, wire_mbit),
        "kv_seen_mbit_p50": seen_mbit, "kv_transfers": len(rates_b),
        "kv_seen_mbit_p50_unshaped": statistics.median(rates_a) * 8 / 1e6 if rates_a else None,
        "handoff_p50_s": hand_p50, "handoffs": len(measured), "planner": planner,
        "machine": machine_text(),
    }
    print(f"link {args.mbit:g} Mbit/s (tbf, both ways) between {prefill_node} and {decode_node}")
    print(f"TCP stream (iperf3, 5 s): {tcp_mbit:.0f} Mbit/s")
    print(f"KV on the wire, p50 over {len(bursts)} bursts: {wire_mbit or 0:.0f} Mbit/s = "
          f"{out['kv_wire_over_tcp'] or 0:.2f}x the TCP stream")
    print(f"KV as vLLM sees it (post to completion), p50 over {len(rates_b)} transfers: {seen_mbit or 0:.0f} Mbit/s "
          f"(unshaped, run A: {out['kv_seen_mbit_p50_unshaped'] or 0:.0f} Mbit/s)")
    for name, p in planner.items():
        print(f"hand-off p50 over {len(measured)} rows: measured {hand_p50 * 1e3:.0f} ms, planner calibrated on "
              f"run {name} (link {p['link_bytes_per_s'] * 8 / 1e6:.0f} Mbit/s, latency {p['handoff_latency_s'] * 1e3:.0f} ms) "
              f"{p['predicted_handoff_p50_s'] * 1e3:.0f} ms = {p['predicted_over_measured']:.2f}x")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
