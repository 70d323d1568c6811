"""`torchrun --nproc-per-node 2 -m gradian index` under gloo equals the single-process index."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradian.cli.app import main
from tests.core.test_index_cli import write_dataset
from tests.core.test_index_resume import REPO, index_files


@pytest.mark.slow
def test_two_gloo_ranks_write_the_single_process_index(tmp_path, tiny_base_dir, tiny_adapter_dir, capsys):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    dataset = write_dataset(tmp_path / "train.jsonl", count=11)
    common = ["--base-model", str(tiny_base_dir), "--adapter", str(tiny_adapter_dir), "--dataset", str(dataset),
              "--set", "grads.shard_size=2", "--set", "grads.batch_size=2", "--set", "grads.projection_dim=96"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    ran = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "gradian", "index",
                          *common, "--out", str(tmp_path / "two-ranks")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.count(" built in ") == 1  # only rank 0 prints
    assert main(["index", *common, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()

    import json

    build = json.loads((tmp_path / "two-ranks" / "manifest.json").read_text())["build"]
    assert build["world_size"] == 2 and build["computed_examples"] == 11
    assert index_files(tmp_path / "two-ranks") == index_files(tmp_path / "one")  # shards, stats, examples, manifest
