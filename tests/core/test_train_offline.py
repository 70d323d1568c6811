"""Issue 14 (8): with HF_HUB_OFFLINE=0 in the environment, `gradian train` never asks the Hub anything, not even
when peft saves the adapter (it would look up the base model's config.json when the base is named by a Hub id)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TRAIN_WITH_THE_HUB_FORBIDDEN = r"""
import json, socket, sys
calls = []

def refuse(name):
    def call(*args, **kwargs):
        calls.append(name)
        raise RuntimeError(f"{name} called: gradian train must not reach the Hub")
    return call

socket.getaddrinfo = refuse("socket.getaddrinfo")
import huggingface_hub, huggingface_hub.hf_api as hf_api
from huggingface_hub.utils import _http
_http.set_client_factory(refuse("huggingface_hub HTTP client"))  # every Hub request makes its client first
for name in ("file_exists", "repo_exists", "model_info", "hf_hub_download", "snapshot_download", "list_repo_files"):
    setattr(huggingface_hub, name, refuse(f"huggingface_hub.{name}"))
    if hasattr(hf_api.HfApi, name):
        setattr(hf_api.HfApi, name, refuse(f"HfApi.{name}"))
import peft.utils.other, peft.utils.save_and_load
for module in (peft.utils.other, peft.utils.save_and_load):
    for name in ("file_exists", "hf_hub_download"):
        if hasattr(module, name):
            setattr(module, name, refuse(f"{module.__name__}.{name}"))
from gradian.cli.app import main
base, data, out = sys.argv[1:4]
code = main(["train", "--base-model", base, "--dataset", data, "--out", out, "--set", "train.max_steps=2",
             "--set", "train.checkpoints=2", "--device", "cpu"])
print(json.dumps({"code": code, "calls": calls}))
"""


@pytest.mark.parametrize("offline", ["0", "false", None])
def test_train_saves_its_adapter_without_a_hub_lookup_whatever_hf_hub_offline_says(tmp_path, offline):
    from tests.support.tiny import save_tiny_base_in_hub_cache, write_four_chat_rows

    cache = tmp_path / "hub"
    save_tiny_base_in_hub_cache(cache)
    data = write_four_chat_rows(tmp_path / "train.jsonl")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HUB_CACHE"] = str(cache)
    if offline is not None:
        env["HF_HUB_OFFLINE"] = offline
    result = subprocess.run([sys.executable, "-c", TRAIN_WITH_THE_HUB_FORBIDDEN, "tiny-org/tiny-base", str(data),
                             str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"code": 0, "calls": []}, result.stderr[-3000:]
    adapter = json.loads((tmp_path / "out" / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "tiny-org/tiny-base"  # a Hub id: the case peft would look up
    assert sorted(p.name for p in (tmp_path / "out" / "run").glob("checkpoint-*"))  # checkpoint saves too
