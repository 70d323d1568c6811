"""Adapter dirs are read without torch: the safetensors header as JSON, tensors with numpy."""

from __future__ import annotations

import json
import struct
import sys

import pytest

from gradian.diagnose.adapter import read_adapter, read_safetensors_header
from gradian.errors import ModelError


def test_header_and_norms_match_torch(tiny_adapter_dir):
    from safetensors.torch import load_file

    adapter = read_adapter(tiny_adapter_dir)
    tensors = load_file(tiny_adapter_dir / "adapter_model.safetensors")
    assert set(adapter.tensors) == set(tensors)
    for name, tensor in tensors.items():
        assert adapter.tensors[name].shape == tuple(tensor.shape)
        assert adapter.norm(name) == pytest.approx(float(tensor.norm()), rel=1e-6)
    assert adapter.lora_b_names() and all("lora_B" in n for n in adapter.lora_b_names())
    assert adapter.config["r"] == 4


def test_bf16_values_are_widened_by_hand(tmp_path):
    import torch
    from safetensors.torch import save_file

    values = torch.tensor([[1.5, -2.25], [0.0, 3.0]], dtype=torch.bfloat16)
    save_file({"base_model.model.x.lora_B.weight": values}, tmp_path / "adapter_model.safetensors")
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 2}))
    adapter = read_adapter(tmp_path)
    assert adapter.tensor("base_model.model.x.lora_B.weight").tolist() == [[1.5, -2.25], [0.0, 3.0]]


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[:4], "file is 4 bytes"),
    (lambda data: struct.pack("<Q", 10**9) + data[8:], "header length"),
    (lambda data: data[:8] + b"{not json" + data[17:], "JSONDecodeError"),
    (lambda data: data[: len(data) // 2], "points outside the file"),
])
def test_a_corrupt_header_is_a_model_error(tiny_adapter_dir, tmp_path, damage, reason):
    data = (tiny_adapter_dir / "adapter_model.safetensors").read_bytes()
    target = tmp_path / "adapter_model.safetensors"
    target.write_bytes(damage(data))
    with pytest.raises(ModelError, match=reason):
        read_safetensors_header(target)


def test_missing_files_are_model_errors(tiny_adapter_dir, tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        read_adapter(tmp_path / "nope")
    with pytest.raises(ModelError, match="has no adapter_config.json"):
        read_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4}))
    with pytest.raises(ModelError, match="has no adapter_model.safetensors"):
        read_adapter(tmp_path)
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelError, match="only adapter_model.bin"):
        read_adapter(tmp_path)


def test_reading_an_adapter_does_not_import_torch(tiny_adapter_dir):
    import subprocess

    code = (f"import sys; from gradian.diagnose.adapter import read_adapter; a = read_adapter({str(tiny_adapter_dir)!r}); "
            "[a.norm(n) for n in a.lora_b_names()]; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
