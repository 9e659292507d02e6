"""tools/bench_kv.py moves real bytes: one 1 MiB NIXL WRITE and READ between two processes
(UCX backend, whatever transport UCX picks here), checked by content."""

from __future__ import annotations

from tools.bench_kv import parse_setting, run_pair


def test_nixl_transfer_moves_the_bytes():
    one_mib = 1 << 20
    cells = [("WRITE", "whole", one_mib), ("READ", "whole", one_mib), ("WRITE", "16", one_mib)]
    result = run_pair(parse_setting("default"), cells, repeats=1, timeout=60, digest_before=True)

    assert result["metadata_bytes"] > 0
    assert [c["op"] for c in result["cells"]] == ["WRITE", "READ", "WRITE"]
    for cell in result["cells"]:
        # Source and destination hashed in their own processes, in the initiator's block order.
        assert cell["dst_digest"] == cell["src_digest"]
        # The destination held other bytes (zeros) before the transfer: the check is not vacuous.
        assert cell["dst_digest_before"] != cell["src_digest"]
        assert cell["gbps"] > 0
    whole, blocks = result["cells"][0], result["cells"][2]
    assert whole["bytes"] == one_mib and whole["descriptors"] == 1
    # 16-token blocks of SmolLM2-135M: 16 x 768 B = 12,288 B per (layer, block) descriptor.
    assert blocks["block_bytes"] == 12_288 and blocks["descriptors"] == one_mib // 12_288
