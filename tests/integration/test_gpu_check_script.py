"""scripts/gpu-check.sh: one line and exit 2 without CUDA; every step passes or skips when pointed at the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


# The CPU run's steps get this many times their GPU time limits: on a machine busy with other work they took 2-3x.
CPU_TIME_SCALE = 5


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), **env}
    return subprocess.run([str(SCRIPT)], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=900 * CPU_TIME_SCALE)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: the script would run for real")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "no CUDA device" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_on_the_cpu_every_step_passes_or_skips_and_prints_one_table(tmp_path):
    done = _run(tmp_path, GRADIAN_GPU_CHECK_DEVICE="cpu", GRADIAN_GPU_CHECK_TIME_SCALE=str(CPU_TIME_SCALE))
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| step")}
    assert set(rows) == {"env", "gpu-tests", "random-llama", "attribute-cpu", "demo-cpu", "bf16-vs-fp32",
                         "torchrun-2-ranks", "unsloth"}
    for step in ("env", "gpu-tests", "random-llama", "attribute-cpu", "bf16-vs-fp32"):
        assert rows[step] == "PASS", (step, done.stdout)
    assert rows["demo-cpu"] == "SKIP"
    report = tmp_path / "out" / "bf16_agreement.json"
    assert report.is_file() and '"gradient_cosine_mean"' in report.read_text()
