"""A build killed with SIGKILL resumes from its finished shards and ends byte-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradian.cli.app import main
from tests.core.test_index_cli import write_dataset

REPO = Path(__file__).resolve().parents[2]


def index_argv(base, adapter, dataset, out, *extra: str) -> list[str]:
    # batch 1 and 2-example shards: many shards, so the kill lands between the first and the last.
    return ["index", "--base-model", str(base), "--adapter", str(adapter), "--dataset", str(dataset), "--out", str(out),
            "--set", "grads.shard_size=2", "--set", "grads.batch_size=1", "--set", "grads.storage_dtype=bfloat16", *extra]


def index_files(directory: Path) -> dict[str, bytes]:
    """Every file of an index; the manifest without its build section (timestamps and timings)."""
    files = {p.name: p.read_bytes() for p in sorted(directory.iterdir())}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("build")
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


def stopped_mid_build(argv: list[str], partial: Path, signum: int, wait: float) -> tuple[int, str]:
    """(exit code, stderr) of `gradian` run with ``argv`` in a subprocess, sent ``signum`` once its build finished a shard
    (waiting at most ``wait`` seconds for it to end)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-m", "gradian", *argv],
                             cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not (partial / "shard-00000.json").exists():
            assert child.poll() is None, child.stderr.read().decode()
            assert time.monotonic() < deadline, "the build never finished a shard"
            time.sleep(0.01)
        child.send_signal(signum)
        return child.wait(timeout=wait), child.stderr.read().decode()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("--set", "grads.projection_dim=96")], ids=["exact", "projected"])
def test_sigkill_then_resume_is_byte_identical(tmp_path, tiny_base_dir, tiny_adapter_dir, capsys, extra):
    """A projected build also keeps the scales it measured before its first shard: resumed shards use the same."""
    dataset = write_dataset(tmp_path / "train.jsonl", count=80)
    killed = tmp_path / "killed"
    partial = tmp_path / ".killed.partial"
    argv = index_argv(tiny_base_dir, tiny_adapter_dir, dataset, killed, *extra)
    assert stopped_mid_build(argv, partial, signal.SIGKILL, wait=30)[0] == -signal.SIGKILL
    finished = sorted(p.name for p in partial.glob("shard-*.json"))
    assert 1 <= len(finished) < 40, finished  # killed mid-build
    assert not killed.exists()  # the index appears only when it is complete
    scales = (partial / "whitening.safetensors").read_bytes() if extra else None

    assert main(index_argv(tiny_base_dir, tiny_adapter_dir, dataset, killed, *extra)) == 0
    assert main(index_argv(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "whole", *extra)) == 0
    capsys.readouterr()
    resumed = json.loads((killed / "manifest.json").read_text())["build"]
    assert resumed["computed_examples"] <= 80 - 2 * len(finished)  # finished shards were not recomputed
    assert not partial.exists()
    assert index_files(killed) == index_files(tmp_path / "whole")
    if extra:
        assert (killed / "whitening.safetensors").read_bytes() == scales


@pytest.mark.slow
def test_sigterm_ends_in_one_line_and_the_build_resumes(tmp_path, tiny_base_dir, tiny_adapter_dir, capsys):
    """SIGTERM (timeout, kill, a batch scheduler) stops a command as Ctrl-C does: one line, 128 + 15, work kept."""
    dataset = write_dataset(tmp_path / "train.jsonl", count=80)
    out = tmp_path / "stopped"
    partial = tmp_path / ".stopped.partial"
    code, stderr = stopped_mid_build(index_argv(tiny_base_dir, tiny_adapter_dir, dataset, out), partial, signal.SIGTERM,
                                     wait=60)
    assert code == 128 + signal.SIGTERM
    assert stderr.strip().splitlines()[-1] == "gradian: error: interrupted; finished work is kept and the next run resumes from it"
    assert "Traceback" not in stderr
    kept = sorted(p.name for p in partial.glob("shard-*.json"))
    assert 1 <= len(kept) < 40 and not out.exists()
    assert main(index_argv(tiny_base_dir, tiny_adapter_dir, dataset, out)) == 0
    capsys.readouterr()
    assert json.loads((out / "manifest.json").read_text())["build"]["computed_examples"] <= 80 - 2 * len(kept)
