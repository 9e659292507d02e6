"""Control-channel messages round-trip and reject garbage."""

from __future__ import annotations

import msgspec
import pytest

from pipeline.wire.messages import Handoff, Renew, decode, encode


def test_channel_round_trip_and_rejects_garbage():
    h = Handoff(row_key="0:1", request_id="row0:1", prefill_worker="prefill-0@h", attempt=1.0,
                prompt_token_ids=[1, 2], sampling={"max_new_tokens": 4}, kv_transfer_params={"remote_block_ids": [[1]]},
                prefill_done_at=1.5)
    assert decode(encode(h)) == h
    r = Renew(request_ids=["row0:1", "row0:2t1"])
    assert decode(encode(r)) == r
    with pytest.raises(msgspec.DecodeError):
        decode(b"\x93\x01\x02\x03")
