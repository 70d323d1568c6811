"""Gradian leaves the process as it found it: importing it sets no environment variable (a later Hub load in the
same notebook still works), and its own training job goes off-line only while it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

IMPORT_EVERYTHING = r"""
import importlib, json, os, pkgutil, sys
import numpy, torch, transformers, peft  # third-party imports first: only Gradian's own effect is measured
before = dict(os.environ)
imported = []
for package in ("gradian", "gradian_checks", "gradian_trainer_hf", "gradian_trainer_trl", "gradian_trainer_unsloth"):
    root = importlib.import_module(package)
    imported.append(package)
    for module in pkgutil.walk_packages(root.__path__, package + "."):
        if module.name.endswith("__main__"):
            continue  # runs the CLI
        try:
            importlib.import_module(module.name)
        except ImportError:
            continue  # an optional extra (matplotlib, unsloth) that is not installed
        imported.append(module.name)
import huggingface_hub.constants
after = dict(os.environ)
print(json.dumps({"added": sorted(set(after) - set(before)),
                  "changed": sorted(k for k in before if k in after and before[k] != after[k]),
                  "removed": sorted(set(before) - set(after)),
                  "hub_offline": huggingface_hub.constants.HF_HUB_OFFLINE, "imported": imported}))
"""

TRAIN_WITHOUT_NETWORK = r"""
import json, os, socket, sys
lookups = []
def refuse(host, *args, **kwargs):
    lookups.append(host)
    raise socket.gaierror("no network in this test")
socket.getaddrinfo = refuse
from gradian.cli.app import main
base, data, out = sys.argv[1:4]
import torch
before = dict(os.environ)
code = main(["train", "--base-model", base, "--dataset", data, "--out", out, "--set", "train.num_epochs=1",
             "--device", "cpu"])
print(json.dumps({"code": code, "lookups": lookups, "env_diff": sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k)),
                  "offline_after": os.environ.get("HF_HUB_OFFLINE"),
                  "deterministic_after": torch.are_deterministic_algorithms_enabled()}))
"""


def run_python(code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    clean.update(env or {})
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, env=clean,
                            check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_every_gradian_module_leaves_the_environment_alone():
    found = run_python(IMPORT_EVERYTHING)
    assert {"gradian.model.base", "gradian.model.loaded", "gradian.cli.app", "gradian_checks.dynamics"} <= set(found["imported"])
    assert (found["added"], found["changed"], found["removed"]) == ([], [], [])
    assert found["hub_offline"] is False  # huggingface_hub imported afterwards would still reach the Hub


def test_training_goes_off_line_only_while_it_runs(tmp_path):
    """A base named by a Hub id (in the local cache): peft's save would ask the Hub about it; it does not."""
    import shutil

    from tests.support.tiny import save_tiny_base_in_hub_cache, write_four_chat_rows

    cache = tmp_path / "hub"
    save_tiny_base_in_hub_cache(cache)
    data = write_four_chat_rows(tmp_path / "train.jsonl")
    found = run_python(TRAIN_WITHOUT_NETWORK, "tiny-org/tiny-base", str(data), str(tmp_path / "out"),
                       env={"HF_HUB_CACHE": str(cache)})
    assert found["code"] == 0 and (tmp_path / "out" / "adapter" / "adapter_config.json").is_file()
    assert found["lookups"] == []
    # Neither the off-line switch nor transformers' full_determinism (CUDA_LAUNCH_BLOCKING, ...) outlives the job.
    assert found["env_diff"] == [] and found["offline_after"] is None and found["deterministic_after"] is False
    shutil.rmtree(cache)
