"""Killed and missing workers against the real pipeline (real vLLM, real NIXL): after each, the
output holds every row exactly once and equals an undisturbed run. A decode worker missing at
start and a KV READ that hangs are one scenario (:func:`late_decode_then_hung_read`): the rerun
after the failed start is the run whose READ hangs."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import psutil
import pyarrow.parquet as pq
import pytest

from tests.helpers import COMMON, ROOT, SAMPLE, run_pipeline
from pipeline.runtime.claims import holders
from pipeline.runtime.rundir import RunDir
from pipeline.roles.errors import DecodeUnavailable
from pipeline.roles.handoff import wait_for_decode


def test_prefill_waits_for_decode_then_fails_clearly(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "decode").mkdir()
    t0 = time.monotonic()
    with pytest.raises(DecodeUnavailable, match="0 of 2 decode workers came up within 1 s"):
        asyncio.run(wait_for_decode(run, 2, timeout_s=1.0))
    assert 1.0 <= time.monotonic() - t0 < 5
    run.publish_decode(0, "tcp://127.0.0.1:1", "decode-0@x")
    run.publish_decode(1, "tcp://127.0.0.1:2", "decode-1@x")
    assert sorted(asyncio.run(wait_for_decode(run, 2, timeout_s=1.0))) == [0, 1]


def _popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until(check, what: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert proc.poll() is None and time.monotonic() < deadline, f"{what} did not happen before the run ended"
        time.sleep(0.2)


@pytest.mark.e2e
def test_a_killed_worker_is_started_again_and_a_joined_worker_claims(tmp_path, colocated_run):
    """1P:2D over two shards (one unit each). Once prefill-0 holds the first, a second launch
    adds a worker to the running run (``pools.prefill=+1``), which claims the other; once
    prefill-0 has checkpointed rows, it and decode rank 0 are SIGKILLed (each with its engine),
    as a node's processes would be. The launcher starts prefill-0 again (not the decode rank:
    its rows go to rank 1), it resumes its claim from the checkpoint, the launcher waits for
    the joined worker before stopping decode, and the run ends with every row once, equal to
    an undisturbed run, and a summary naming the lost decode rank."""
    shards = ["part-00001.parquet", "part-00002.parquet"]
    (tmp_path / "in").mkdir()
    for s in shards:
        (tmp_path / "in" / s).write_bytes((SAMPLE / s).read_bytes())
    run_dir = tmp_path / "run"
    args = [*COMMON, f"job.input={tmp_path / 'in'}", "job.batch_rows=2", "job.checkpoint_rows=2",
            "pools.decode=2", "transport.decode_dead_after_s=5", f"run.dir={run_dir}", f"job.output={tmp_path / 'out'}"]
    first = _popen(*args)
    _until(lambda: 0 in holders(run_dir), "prefill-0's first claim", first)
    joiner = _popen(*COMMON, f"run.dir={run_dir}", "pools.prefill=+1")
    parts = run_dir / "checkpoints" / shards[0]
    _until(lambda: list(parts.glob("part-*.parquet")), "a checkpoint of the first shard", first)
    # A local job's id is its process id; kill prefill-0 and decode rank 0, the worker processes
    # only: their engines' processes (vLLM's, which do not watch the worker) must end with them
    # (pipeline.engine.reaper), as the operating system's process table says.
    jobs = json.loads((run_dir / "jobs.json").read_text())
    engines = []
    for job in (jobs["array_tasks"][0], jobs["decode"][0]):
        victim = psutil.Process(int(job))
        (worker,) = [p for p in (victim, *victim.children(recursive=True)) if "submitit.core._submit" in p.cmdline()]
        engines += [p for p in worker.children(recursive=True) if p.name().startswith("VLLM::")]
        worker.send_signal(signal.SIGKILL)
    assert len(engines) >= 4, engines  # an engine core and a model worker each
    try:
        gone, alive = psutil.wait_procs(engines, timeout=30)
        assert not alive, f"engine processes outlived their killed worker by 30 s: {alive}"
    finally:
        for p in engines:
            try:
                p.kill()
            except psutil.Error:
                pass
    saved = sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*.parquet"))
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert "ended without a result (killed?)" in err and "array task 0 started again as job" in err, err[-3000:]
    assert "(2/2 shards)" in out and "rows 16: 16 generated, 0 errors" in out, out
    assert "; its rows go to the other decode workers" in err, err[-3000:]
    assert "decode rank 0 (decode-0@" in out and "was lost during the run; the other decode ranks served its rows" in out
    j_out, j_err = joiner.communicate(timeout=300)
    assert joiner.returncode == 0, j_err[-3000:]
    assert f"joined {run_dir}: array tasks 1 (job " in j_out, j_out
    # The restarted task resumed its own claim, from the checkpoint; the joined task (index 1)
    # claimed the other shard and served it whole, before the launcher stopped decode.
    held = holders(run_dir)
    assert sorted(held) == [0, 1] and all(generation == 0 for generation, _ in held.values()), held
    assert held[0][1] == "prefill-0" and held[1][1] == "prefill-1", held  # claims name the task
    done = json.loads((run_dir / "done" / f"{shards[0]}.json").read_text())
    assert done["resumed_rows"] >= saved > 0
    for s, worker in zip(shards, ("prefill-0", "prefill-1")):
        got, want = pq.read_table(tmp_path / "out" / s), colocated_run.table(s)
        assert got.column("error").null_count == got.num_rows
        assert got.column("id").to_pylist() == want.column("id").to_pylist()
        assert got.column("generation_token_ids").to_pylist() == want.column("generation_token_ids").to_pylist()
        assert {w.split("@")[0] for w in got.column("prefill_worker").to_pylist()} == {worker}
    # Rows served after the kill went to rank 1.
    assert "decode-1" in {w.split("@")[0] for s in shards
                          for w in pq.read_table(tmp_path / "out" / s).column("decode_worker").to_pylist()}


@pytest.mark.e2e
@pytest.mark.parametrize("transport,symptom,on_recompute", [("nixl_push", "its KV did not arrive", "warn"),
                                                            ("nixl_pull", "its KV could not be loaded", "fail")])
def test_kv_transfer_that_fails_is_retried(tmp_path, colocated_run, transport, symptom, on_recompute):
    # The decode worker breaks the first two hand-offs' transfers for real, not with a mock
    # (PD_PIPELINE_INJECT_KV_FAULTS): with push it registers them under request ids the prefill
    # engine does not know, so vLLM's NIXL push never happens and they wait for KV until
    # transport.kv_timeout_s; with pull it names a prefill engine that does not exist, so vLLM's
    # NIXL handshake fails and the request ends with finish_reason "error" and no tokens (which
    # was once written down as an empty generation without an error). Both are served again.
    # The next hand-off it serves without loading its KV (PD_PIPELINE_INJECT_KV_SKIPS): vLLM
    # computes that row's prompt on decode, and the run says so, in counts worked out here from
    # the output columns (issue #41): transport.on_recompute=warn serves the row, fail makes it
    # an error row naming it.
    # The push hand-offs given up on hold decode blocks that no prefill engine will ever WRITE:
    # vLLM alone keeps them for the engine's life (vLLM issue #46283), stepping ~600 times a
    # second; taken back 2 s after (transport.abort_reclaim_s), the decode engine ends holding
    # no KV, as vLLM's own block count (kv_cache_usage of its last step) says.
    shard = "part-00000.parquet"
    run = tmp_path / "run"
    args = [*COMMON, f"transport={transport}", "transport.kv_timeout_s=8", "transport.abort_reclaim_s=2", "job.batch_rows=4",
            f"transport.on_recompute={on_recompute}", f"job.input={SAMPLE / shard}", f"run.dir={run}",
            f"job.output={tmp_path / 'out'}"]
    p = run_pipeline(*args, env={"PD_PIPELINE_INJECT_KV_FAULTS": "2", "PD_PIPELINE_INJECT_KV_SKIPS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    logs = "".join(f.read_text(errors="replace") for f in (run / "logs").rglob("*_log.err"))
    assert logs.count(symptom) == 2 and logs.count("serving it again") == 2, logs[-3000:]
    assert logs.count("this decode worker recomputed") == 1, logs[-3000:]
    got = pq.read_table(tmp_path / "out" / shard)
    want = colocated_run.table(shard)
    assert got.column("id").to_pylist() == want.column("id").to_pylist()
    # By hand: decode computed prompt_tokens - kv_tokens of each row's prompt; 1 (the last
    # token) or 0 (a prefix-cache hit) when the KV arrived.
    prompt, kv = got.column("prompt_tokens").to_pylist(), got.column("kv_tokens").to_pylist()
    computed = [a - b for a, b in zip(prompt, kv)]
    (i,) = [j for j, c in enumerate(computed) if c > 1]
    assert all(c in (0, 1) for j, c in enumerate(computed) if j != i), computed
    errors, n = got.column("error").to_pylist(), got.num_rows
    if on_recompute == "fail":
        assert errors[i] == (f"decode recomputed {computed[i]} of {prompt[i]} prompt tokens (the KV did not "
                             f"arrive); transport.on_recompute=fail")
        assert got.column("generation").to_pylist()[i] is None
    served = [j for j in range(n) if on_recompute == "warn" or j != i]
    assert [errors[j] for j in served] == [None] * len(served)
    ids, want_ids = got.column("generation_token_ids").to_pylist(), want.column("generation_token_ids").to_pylist()
    assert [ids[j] for j in served] == [want_ids[j] for j in served]
    counts = {"rows": n, "kv_loaded_rows": n - 1, "recomputed_rows": 1, "prompt_tokens": sum(prompt),
              "computed_tokens": sum(computed), "recomputed_tokens": computed[i], "local_rows": 0, "local_tokens": 0}
    assert json.loads((run / "summary.json").read_text())["decode_kv"] == counts
    assert json.loads((run / "report" / "report.json").read_text())["decode_kv"] == counts
    assert (f"KV: decode loaded the KV of {n - 1} of {n} rows handed off, and computed {sum(computed)} of their "
            f"{sum(prompt)} prompt tokens (at most 1 a row when its KV arrived) | warning: decode recomputed the "
            f"prompt of 1 of {n} rows ({computed[i]} prompt tokens): their KV did not arrive (transport.on_recompute)"
            ) in p.stdout.splitlines(), p.stdout
    # The two rows were prefilled twice; their second KV arrived whole.
    from pipeline.io.metrics import read_request_metrics

    m = read_request_metrics(run).to_pylist()
    assert sorted(r["tries"] for r in m) == [1] * (got.num_rows - 2) + [2, 2]
    assert sum(r["kv_tokens"] >= r["prompt_tokens"] - 1 for r in m) == n - 1
    import pyarrow as pa

    steps = pa.concat_tables([pq.read_table(f) for f in (run / "metrics" / "workers").glob("decode-0@*")]).sort_by("t")
    assert steps.column("kv_cache_usage")[-1].as_py() == 0.0, steps.column("kv_cache_usage")[-5:]


# A late decode worker, then a hung KV READ: one scenario in one run dir, so that the rerun after
# the failed start is also the run whose READ hangs (one run of engines fewer than two scenarios).
# The input is the first 3 rows of a sample shard: with job.batch_rows=1 the rows are served one
# after another, the second one's READ hangs, and the third follows the retry; more rows would
# only be served the same way, one at a time.
LATE_ROWS = 3


@pytest.fixture(scope="module")
def late_decode_then_hung_read(tmp_path_factory):
    """The first run: the decode worker starts 900 s late (PD_PIPELINE_INJECT_DECODE_START_DELAY_S);
    prefill waits transport.connect_timeout_s=5 for it, then the run fails saying why, writing
    nothing, and stops the late decode worker instead of waiting for it. The second run, in the
    same run dir with the decode worker back, the rerun of the first: the decode engine READs a
    hand-off's KV inside a step (transport.sync_kv_load), so a READ that never completes would
    hold every row on that decode worker. Here one hangs for real: after its second prefill the
    prefill worker's engine processes are stopped for 9 s (SIGSTOP,
    PD_PIPELINE_INJECT_PREFILL_FREEZE_S) and UCX moves KV over TCP, where a READ needs the
    prefill side (shared-memory CMA would read a stopped process's memory anyway). The decode
    step gives up after transport.kv_timeout_s=3 s; the row is prefilled again once the engine
    runs again. 9 s is three times that timeout: the READ started 0.4 s into the freeze at the
    last measure and was given up 3.4 s in (when it had lasted 15 s); a longer freeze is only
    a longer wait. Returns (base dir, shard name, first run, what it left, rerun)."""
    base = tmp_path_factory.mktemp("late-decode-hung-read")
    shard = "part-00000.parquet"
    (base / "in").mkdir()
    pq.write_table(pq.read_table(SAMPLE / shard).slice(0, LATE_ROWS), base / "in" / shard)
    args = [*COMMON, "transport=nixl_pull", "transport.ucx_tls='tcp,self'", "transport.kv_timeout_s=3",
            "job.batch_rows=1", f"job.input={base / 'in'}", f"run.dir={base / 'run'}", f"job.output={base / 'out'}"]
    first = run_pipeline(*args, "transport.connect_timeout_s=5", timeout=600,
                         env={"PD_PIPELINE_INJECT_DECODE_START_DELAY_S": "900"})
    # What the first run left, before the rerun writes: no decode endpoint, no output.
    left = (list((base / "run" / "decode").glob("rank-*.json")), (base / "out" / shard).exists())
    again = run_pipeline(*args, env={"PD_PIPELINE_INJECT_PREFILL_FREEZE_S": "9"})
    return base, shard, first, left, again


@pytest.mark.e2e
def test_kv_read_that_hangs_fails_in_time_and_is_retried(late_decode_then_hung_read, colocated_run):
    # The rerun of late_decode_then_hung_read: one READ hangs; the decode step gives up on it
    # after 3 s, the row is served again, and the output equals colocated.
    base, shard, _, _, p = late_decode_then_hung_read
    assert p.returncode == 0, p.stderr[-3000:]
    logs = "".join(f.read_text(errors="replace") for f in (base / "run" / "logs").rglob("*_log.err"))
    assert logs.count("did not complete within 3 s") == 1 and logs.count("serving it again") == 1, logs[-3000:]
    got = pq.read_table(base / "out" / shard)
    want = colocated_run.table(shard).slice(0, LATE_ROWS)
    assert got.column("error").null_count == got.num_rows
    assert got.column("generation_token_ids").to_pylist() == want.column("generation_token_ids").to_pylist()
    from pipeline.io.metrics import read_request_metrics

    m = read_request_metrics(base / "run").to_pylist()
    assert sorted(r["tries"] for r in m) == [1] * (got.num_rows - 1) + [2]


@pytest.mark.e2e
def test_no_decode_worker_at_start_fails_clearly_then_reruns(late_decode_then_hung_read, colocated_run):
    # The first run of late_decode_then_hung_read fails in one clear line, leaving nothing; the
    # rerun in the same run dir serves every row exactly once, as colocated.
    base, shard, p, (ranks, wrote), again = late_decode_then_hung_read
    assert p.returncode == 1, p.stderr[-3000:]
    assert "0 of 1 decode workers came up within 5 s" in p.stderr, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]  # one clear line, no worker's traceback
    assert not ranks
    assert not wrote
    assert again.returncode == 0, again.stderr[-3000:]
    got = pq.read_table(base / "out" / shard)
    want = colocated_run.table(shard).slice(0, LATE_ROWS)
    assert got.num_rows == LATE_ROWS
    assert got.column("id").to_pylist() == want.column("id").to_pylist()
    assert got.column("generation_token_ids").to_pylist() == want.column("generation_token_ids").to_pylist()
