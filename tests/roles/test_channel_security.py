"""The control channel accepts only peers holding the run's secret: a real decode worker (real
vLLM engine) answers a signed hand-off and ignores unsigned or wrongly signed ones, so a client
without the secret can neither inject a request nor read a result."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest
import zmq

from tests.helpers import ROOT, SAMPLE
from pipeline.config import compose
from pipeline.io.shards import list_shards
from pipeline.runtime.rundir import RunDir
from pipeline.wire.auth import sign
from pipeline.wire.messages import Handoff, Received, Result, decode, encode

pytestmark = pytest.mark.e2e


def _handoff(key: str) -> bytes:
    # No kv_transfer_params: the decode worker computes the prompt itself, so an accepted
    # request answers quickly.
    return encode(Handoff(row_key=key, request_id=f"row{key}", prefill_worker="test", attempt=1.0,
                          prompt_token_ids=[1, 9690, 198, 28120], sampling={"max_new_tokens": 4}, kv_transfer_params={},
                          prefill_done_at=time.time()))


def _ask(endpoint: str, message: bytes, wait_s: float) -> list[bytes] | None:
    """The answers to ``message``: its acknowledgment and its result (None: no answer within
    ``wait_s`` seconds)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send(message)
        if not s.poll(int(wait_s * 1000)):
            return None
        ack = s.recv()
        return [ack, s.recv()] if s.poll(int(wait_s * 1000)) else [ack]
    finally:
        s.close()
        ctx.term()


def test_only_holders_of_the_run_secret_are_served(tmp_path):
    cfg = compose(["+job=summarize", f"job.input={SAMPLE}"])
    run = RunDir(tmp_path / "run")
    run.create(cfg, list_shards(str(SAMPLE)), str(tmp_path / "out"))
    assert stat.S_IMODE(os.stat(run.path / "secret").st_mode) == 0o600
    code = f"from pipeline.roles.decode import decode_main; decode_main({str(run.path)!r}, 0, None)"
    worker = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not run.decode_endpoints():
            assert worker.poll() is None and time.monotonic() < deadline, "decode worker did not come up"
            time.sleep(0.5)
        endpoint = run.decode_endpoints()[0]["endpoint"]
        assert endpoint.startswith("tcp://127.0.0.1:")

        assert _ask(endpoint, _handoff("0:0"), wait_s=10) is None  # unsigned
        assert _ask(endpoint, sign(os.urandom(32), _handoff("0:1")), wait_s=10) is None  # wrong secret
        assert _ask(endpoint, b"\x00" * 64, wait_s=2) is None  # garbage

        answer = _ask(endpoint, sign(run.secret(), _handoff("0:2")), wait_s=120)
        assert answer is not None, "a signed hand-off got no answer"
        # The answer is itself signed: without the secret a client cannot even verify it.
        from pipeline.wire.auth import verify

        ack, result = (decode(verify(run.secret(), a)) for a in answer)
        assert ack == Received(request_id="row0:2")
        assert isinstance(result, Result) and result.row_key == "0:2" and result.error is None
        assert len(result.token_ids) == 4
    finally:
        run.request_stop()
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
