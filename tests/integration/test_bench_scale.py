"""bench/scale.py and bench/scoring_scale.py in their tiny modes: they run and write the rows their reports promise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _run(script: str, *args: str) -> None:
    # One thread: a tiny model's many small ops run several times faster so on a shared machine.
    result = subprocess.run([sys.executable, str(BENCH / script), "--tiny", "--threads", "1", *args],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
def test_scale_measures_the_tiny_grid_and_projects_it(tmp_path):
    out = tmp_path / "scale"
    _run("scale.py", "--out", str(out))
    report = json.loads(out.with_suffix(".json").read_text())
    measured = report["measured"]
    # projected at the smallest batch only (it differs from exact in the per-example products alone)
    assert {(m["batch"], m["mode"]) for m in measured if not m["full_is_measured"]} == {
        (1, "projected"), (1, "exact"), (2, "exact")}
    for m in measured:
        assert m["capture_seconds"] > 0 and m["seconds_per_example_full"] > 0 and m["peak_rss_gb_full"] > 0
        for dtype, size in (("float32", 4), ("float16", 2)):
            assert m["itemsize"][dtype] == size
            assert m["bytes_per_example_measured"][dtype] == m["dim_measured"] * size  # what capture returned, encoded
            assert m["bytes_per_example_full"][dtype] == m["dim_full"] * size
    widths = report["models"]["tiny"]["widths_full"]
    # 2 layers x r=16 x (d_in + d_out) of q, o (256, 256), k, v (256, 128), gate, up, down (256, 512)
    assert widths["exact"] == 2 * 16 * (2 * (256 + 256) + 2 * (256 + 128) + 3 * (256 + 512))
    assert widths["projected 64"] == 64
    exact = next(m for m in measured if m["mode"] == "exact")
    assert exact["dim_full"] == widths["exact"]
    check = report["full_depth_check"]  # the 2-layer run in the same process as the 1-layer one
    assert check["layers_full"] == 2 and check["measured_s"] > 0 and check["extrapolated_s"] > 0
    for row in report["rows_projection"]:
        for n in ("10000", "100000", "1000000"):
            cell = row["rows"][n]
            assert cell["gpu1_seconds"] > 0 and cell["cpu_seconds"] > 0
            assert cell["disk_bytes"] == row["bytes_per_example"] * int(n)
    assert "PROJECTIONS, not measurements" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".md").read_text().startswith("Command: `.venv/bin/python bench/scale.py --tiny")


@pytest.mark.slow
def test_scoring_scale_streams_and_searches_a_tiny_index(tmp_path):
    out, scratch = tmp_path / "scoring", tmp_path / "scratch"
    _run("scoring_scale.py", "--out", str(out), "--scratch", str(scratch))
    report = json.loads(out.with_suffix(".json").read_text())
    setup, results = report["setup"], report["results"]
    assert (setup["rows"], setup["dim"], setup["queries"], setup["k"]) == (2000, 64, 64, 100)
    index = results["index"]
    assert index["bytes_per_row"] > setup["dim"] * 2  # float16 rows plus each npy file's header
    assert index["shard_bytes"] - setup["rows"] * setup["dim"] * 2 < index["shards"] * 256
    for name in ("stream_cold_verified", "stream_cold", "stream_warm"):
        assert results[name]["seconds"] > 0 and results[name]["rows_per_s"] > 0 and results[name]["gb_per_s"] > 0
    assert results["library_default"]["passes"] >= 1 and results["library_one_pass"]["passes"] == 1
    assert results["faiss_flat"]["recall"] > 0.99  # exact search finds the streamed top k
    indexes = results["faiss_ivf"]["indexes"]
    assert set(indexes) == {"IVF16,SQ8", "IVF16,SQ4"}
    for entry in indexes.values():
        assert entry["memory_bytes"] > 0
        assert all(0.0 <= search["recall"] <= 1.0 for search in entry["searches"])
        assert 0.0 < entry["rerank"]["recall"] <= 1.0
    assert not scratch.exists()  # the scratch index is deleted
    assert "## Which to use when" in out.with_suffix(".md").read_text()
