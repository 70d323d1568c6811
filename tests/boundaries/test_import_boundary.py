"""The core never imports trl, unsloth, bitsandbytes or xformers, even with every plugin loaded."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_dist import write_distribution

PROBE = Path(__file__).with_name("boundary_probe.py")
ROOT = Path(__file__).resolve().parents[2]


def run_probe(*args: str, extra_path: Path | None = None) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if k != "GRADIAN_DISABLE_PLUGIN_AUTOLOAD"}
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def test_trl_is_installed_here_so_the_boundary_test_means_something():
    assert importlib.util.find_spec("trl") is not None


@pytest.mark.parametrize("args", [(), ("--block",)], ids=["installed", "blocked"])
def test_all_plugins_loaded_and_listed_without_forbidden_imports(args):
    code, report = run_probe(*args)
    assert code == 0, report
    assert report["leaked"] == [] and report["failures"] == []
    assert {"core", "checks", "trainer-hf", "trainer-trl", "trainer-unsloth"} <= set(report["plugins"])
    assert {"hf", "trl", "unsloth"} <= set(report["records"]["trainers"])


@pytest.fixture
def forbidden_plugin(tmp_path):
    source = "import trl  # a plugin that breaks the boundary at import time\nimport gradian\n"
    return write_distribution(tmp_path, "gradian-leaky", {"leaky": "leaky_plugin"}, {"leaky_plugin": source})


def test_a_plugin_importing_trl_at_top_level_fails_the_check(forbidden_plugin):
    code, report = run_probe(extra_path=forbidden_plugin)
    assert code == 1
    assert "trl" in report["leaked"]


def test_a_plugin_importing_trl_fails_the_blocked_check_too(forbidden_plugin):
    code, report = run_probe("--block", extra_path=forbidden_plugin)
    assert code == 1
    assert "trl" in report["blocked_attempts"]
    assert any("leaky" in failure for failure in report["failures"])


def test_help_does_not_import_torch():
    code = (
        "import sys; from gradian.cli.app import main; rc = main(['--help']);"
        "heavy = sorted(m for m in ('torch', 'transformers', 'peft', 'numpy') if m in sys.modules);"
        "print(rc, ','.join(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    rc, _, heavy = proc.stdout.strip().splitlines()[-1].partition(" ")
    assert (rc, heavy) == ("0", ""), proc.stdout + proc.stderr


def test_import_linter_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    if not lint_imports.exists():
        pytest.skip("import-linter is not installed in this environment")
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken" in proc.stdout
