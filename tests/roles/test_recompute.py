"""Did the KV move (pipeline/roles/recompute.py): the prompt tokens decode computed per row, a
run's counts of them, and what a decode worker does with a row whose KV did not arrive under
``transport.on_recompute``; every expected value is worked out by hand in the comments. The
end-to-end check (a decode worker that really recomputes a row's prompt) is
tests/roles/test_faults.py::test_kv_transfer_that_fails_is_retried."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest

from pipeline.config.schema import TransportConfig
from pipeline.roles.decode import DecodeServer
from pipeline.roles.recompute import add_counts, computed_on_decode, kv_counts, recompute_error
from pipeline.runtime import failpoints
from pipeline.wire.messages import Handoff

FAIL_50 = "decode recomputed 50 of 60 prompt tokens (the KV did not arrive); transport.on_recompute=fail"

# (decode_worker, error, prompt_tokens, kv_tokens, handed_off)
ROWS = [
    ("decode-0@h", None, 100, 99, True),  # KV arrived: decode computed the last token (1)
    ("decode-0@h", None, 120, 120, True),  # KV arrived, and a prefix-cache hit on decode: 0
    ("decode-1@h", None, 80, 0, True),  # recomputed: 80
    ("decode-1@h", FAIL_50, 60, 10, False),  # on_recompute=fail's error row: 60 - 10 = 50
    ("decode-0@h", None, 20, 0, False),  # prefilled on decode on purpose: 20 tokens apart
    (None, None, 30, 0, False),  # colocated: not counted
    ("decode-0@h", "KV transfer did not complete: ... (after 3 tries)", 40, 0, True),  # an error: not counted
    (None, "text is null", None, 0, False),  # refused before any engine: not counted
]


def test_computed_tokens_and_the_error():
    assert computed_on_decode(100, 99) == 1 and computed_on_decode(120, 120) == 0
    assert computed_on_decode(10, 12) == 0  # never negative
    assert recompute_error(100, 99, "fail") is None  # the last token is normal
    assert recompute_error(100, 98, "warn") is None  # 2 computed: warn serves it
    assert recompute_error(60, 10, "fail") == FAIL_50


def test_counts_by_hand():
    c = kv_counts(ROWS)
    assert c == {
        "rows": 4,  # handed off with their KV, served by decode (rows 1-4)
        "kv_loaded_rows": 2,  # rows 1, 2
        "recomputed_rows": 2,  # rows 3, 4
        "prompt_tokens": 100 + 120 + 80 + 60,  # 360
        "computed_tokens": 1 + 0 + 80 + 50,  # 131
        "recomputed_tokens": 80 + 50,  # 130
        "local_rows": 1, "local_tokens": 20,
    }
    assert kv_counts([]) == add_counts(None, None) == dict.fromkeys(c, 0)
    # Summing two shards' counts, and a done marker written before them (no counts).
    assert add_counts(c, kv_counts(ROWS[:1])) == {**c, "rows": 5, "kv_loaded_rows": 3, "prompt_tokens": 460,
                                                 "computed_tokens": 132}
    assert add_counts(c, None) == c


def test_on_recompute_is_checked():
    assert TransportConfig(name="t").on_recompute == "warn"
    assert TransportConfig(name="t", on_recompute="fail").on_recompute == "fail"
    with pytest.raises(ValueError, match=re.escape("transport.on_recompute: must be warn or fail, got 'error'")):
        TransportConfig(name="t", on_recompute="error")


def _handoff(n: int) -> Handoff:
    return Handoff(row_key="s:0", request_id="r0", prefill_worker="prefill-0@h", attempt=0.0,
                   prompt_token_ids=list(range(n)), sampling={}, kv_transfer_params={"do_remote_prefill": True},
                   prefill_done_at=0.0)


@pytest.mark.parametrize("policy", ["warn", "fail"])
def test_decode_worker_names_a_recompute(policy, caplog):
    # DecodeServer._recomputed without a server (it reads only the config): 60 prompt tokens, 10
    # arrived as KV, so 50 computed.
    server = SimpleNamespace(cfg=SimpleNamespace(transport=TransportConfig(name="t", on_recompute=policy)))
    with caplog.at_level(logging.WARNING, logger="pipeline.roles.decode"):
        assert DecodeServer._recomputed(server, _handoff(60), 59) is None  # the last token: silent
        assert not caplog.records
        got = DecodeServer._recomputed(server, _handoff(60), 10)
    assert got == (FAIL_50 if policy == "fail" else None)
    assert [r.getMessage() for r in caplog.records] == [
        f"request r0: this decode worker recomputed 50 of its 60 prompt tokens, no KV having been loaded for "
        f"them (transport.on_recompute={policy})"]


def test_kv_skips_failpoint_serves_the_next_hand_offs_without_their_kv(monkeypatch):
    for bad in ("soon", "-1"):
        monkeypatch.setenv(failpoints.KV_SKIPS, bad)
        with pytest.raises(ValueError, match=re.escape(f"{failpoints.KV_SKIPS}={bad!r}")):
            failpoints.kv_skips()
    monkeypatch.delenv(failpoints.KV_SKIPS)
    assert failpoints.kv_skips() == 0
    # One hand-off broken (kv_faults), then one served without its KV (kv_skips), then as sent.
    server = SimpleNamespace(kv_faults=1, kv_skips=1,
                             cfg=SimpleNamespace(transport=TransportConfig(name="t", connector="NixlPushConnector")))
    h = _handoff(3)
    assert DecodeServer._nixl_params(server, h) == ("r0stalled", {"do_remote_prefill": True})
    assert DecodeServer._nixl_params(server, h) == ("r0", {"do_remote_prefill": False})
    assert DecodeServer._nixl_params(server, h) == ("r0", {"do_remote_prefill": True})
    assert h.kv_transfer_params == {"do_remote_prefill": True}  # the hand-off itself is left as it came
