"""bench/accuracy.py on a tiny model: the harness trains, scores every method and writes the table."""

from __future__ import annotations

import json

import pytest

from tests.support.bench import bench_module


@pytest.mark.slow
def test_the_harness_runs_on_a_tiny_model_and_writes_the_table(tiny_base_dir, tmp_path):
    bench = bench_module("accuracy")
    out = tmp_path / "results" / "accuracy"
    assert bench.main(["--base-model", str(tiny_base_dir), "--kinds", "fact", "--seeds", "0", "--no-gate",
                       "--workdir", str(tmp_path / "work"), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    case = data["cases"][0]
    assert case["status"] == "scored"
    methods = case["methods"]
    for name in ("gradian: classic, diagonal", "grad dot (TracIn, final adapter)", "DataInf", "BM25",
                 "hidden-state cosine"):
        assert 0.0 <= methods[name]["recall_at_k"] <= 1.0, name
        assert 1 <= methods[name]["cluster_rank"] <= len(set(json.loads(line)["source"] for line in
                                                            (tmp_path / "work" / "fact-0" / "scenario" / "train.jsonl")
                                                            .read_text().splitlines()))
    verify = case["verify"]  # seed 0 is verified by default: the accused cluster and a random one, both retrained
    assert verify["dropped_set"] and verify["dropped"] > 0
    assert (tmp_path / "work" / "fact-0" / "verify" / "verify.json").is_file()
    table = out.with_suffix(".md").read_text()
    assert "| BM25 |" in table and "## fact" in table
    assert not (tmp_path / "work" / "fact-0" / "index").exists()  # dropped unless --keep-index

    # a second run resumes: the finished case is read back, nothing is trained or scored again
    (tmp_path / "work" / "fact-0" / "train").rename(tmp_path / "work" / "fact-0" / "train-moved")
    again = tmp_path / "results" / "again"
    assert bench.main(["--base-model", str(tiny_base_dir), "--kinds", "fact", "--seeds", "0", "--no-gate",
                       "--workdir", str(tmp_path / "work"), "--out", str(again)]) == 0
    assert json.loads(again.with_suffix(".json").read_text())["cases"] == data["cases"]
    # --collect gathers finished cases only: seed 1 was never run, so it is left out rather than trained
    collected = tmp_path / "results" / "collected"
    assert bench.main(["--base-model", str(tiny_base_dir), "--kinds", "fact", "--seeds", "0,1", "--collect",
                       "--workdir", str(tmp_path / "work"), "--out", str(collected)]) == 0
    assert [c["seed"] for c in json.loads(collected.with_suffix(".json").read_text())["cases"]] == [0]
