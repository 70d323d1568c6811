"""The base point (attribution.base_point): the adapter with its B matrices zeroed, scored as one more point of the run.

The swap is checked against the base model with the adapter disabled, its B gradient against plain autograd of
the base weight, and the mixed blame of `gradian attribute` against the blame at each point attributed alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gradian.attribution.checkpoint_ensemble import with_base_point
from gradian.cli.app import main
from gradian.errors import GradianError
from gradian.report.json_report import checkpoints_text
from tests.core.counterfactual_reports import write_dataset
from tests.core.test_checkpoint_ensemble import _item_blame


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """The base point's index goes to the index cache: a fresh one per test, never the user's."""
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "cache"))


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_the_base_point_computes_the_base_model_and_puts_the_adapter_back(tiny_base_dir, tiny_adapter_dir):
    from gradian.model.adapter_swap import base_point_hash, base_point_weights
    from gradian.model.loaded import LoadedModel

    loaded = LoadedModel.load(tiny_base_dir, tiny_adapter_dir)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    adapted = _logits(loaded.model, ids)
    with loaded.model.disable_adapter():
        base = _logits(loaded.model, ids)
    assert not torch.allclose(adapted, base)  # the adapter's random B changes the outputs
    with base_point_weights(loaded) as view:
        torch.testing.assert_close(_logits(view.model, ids), base)
        assert view.adapter_hash == base_point_hash(loaded.adapter_hash) != loaded.adapter_hash
    torch.testing.assert_close(_logits(loaded.model, ids), adapted, rtol=0, atol=0)


def test_the_base_points_b_gradient_is_the_base_weight_gradient_through_a(tiny_base_dir, tiny_adapter_dir):
    from gradian.model.adapter_swap import base_point_weights
    from gradian.model.loaded import LoadedModel

    loaded = LoadedModel.load(tiny_base_dir, tiny_adapter_dir)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    layer = next(module for name, module in loaded.model.named_modules() if name.endswith("q_proj"))
    with base_point_weights(loaded) as view:
        layer.base_layer.weight.requires_grad_(True)
        try:
            view.model(input_ids=ids, labels=ids).loss.backward()
            weight_grad = layer.base_layer.weight.grad.detach().clone()
        finally:
            layer.base_layer.weight.requires_grad_(False)
            layer.base_layer.weight.grad = None
        a = layer.lora_A["default"].weight
        b_grad = layer.lora_B["default"].weight.grad / layer.scaling["default"]
        torch.testing.assert_close(b_grad, weight_grad @ a.detach().T, rtol=1e-4, atol=1e-6)
        assert torch.count_nonzero(layer.lora_A["default"].weight.grad) == 0  # B^T dL/dW with B = 0
    loaded.model.zero_grad(set_to_none=True)


def test_mixing_scales_each_side_to_unit_norm():
    blame = np.array([[3.0, 0.0], [0.0, 4.0]])
    base = np.array([[0.0, 1.0], [1.0, 0.0]])
    mixed = with_base_point(blame, base, 0.25)
    np.testing.assert_allclose(mixed, 0.75 * blame / 5.0 + 0.25 * base / np.sqrt(2.0))
    np.testing.assert_allclose(with_base_point(blame, base, 1.0), base / np.sqrt(2.0))
    with pytest.raises(GradianError, match="shape"):
        with_base_point(blame, base[:1], 0.5)


def test_mixing_takes_a_per_item_vector_and_scales_each_column_block_on_its_own():
    vector, base_vector = np.array([3.0, 4.0]), np.array([1.0, 0.0])
    np.testing.assert_allclose(with_base_point(vector, base_vector, 0.5), 0.5 * vector / 5.0 + 0.5 * base_vector)
    blame = np.array([[3.0, 30.0], [4.0, 40.0]])
    base = np.array([[1.0, 0.0], [0.0, 2.0]])
    mixed = with_base_point(blame, base, 0.5, blocks=2)
    np.testing.assert_allclose(mixed[:, :1], with_base_point(blame[:, :1], base[:, :1], 0.5))
    np.testing.assert_allclose(mixed[:, 1:], with_base_point(blame[:, 1:], base[:, 1:], 0.5))


def test_the_method_line_names_the_base_point_beside_the_run_points():
    base = {"step": 0, "weight": 0.75, "is_adapter": False, "base_point": True}
    alone = checkpoints_text([base])
    assert "base model's blame" in alone and "0.75" in alone and "TracIn-CP" not in alone
    run = [{"step": 10, "weight": 0.6, "is_adapter": False}, {"step": 20, "weight": 0.4, "is_adapter": True}]
    both = checkpoints_text([*run, base])
    assert "summed over 2 points" in both and "the adapter (step 20) x 0.4" in both and "0.75" in both


def _attribute(tiny_base_dir, adapter: Path, dataset: Path, out: Path, share: float) -> dict:
    argv = ["attribute", "--base-model", str(tiny_base_dir), "--adapter", str(adapter), "--dataset", str(dataset),
            "--out", str(out), "--set", "attribution.cluster_field=source", "--set",
            "evaluation.require_significant=false", "--set", f"attribution.base_point={share}"]
    assert main(argv) == 0
    return json.loads((out / "report.json").read_text())


def test_attribute_mixes_the_adapters_blame_with_the_base_points(tiny_base_dir, tiny_adapter_dir, tmp_path):
    dataset = write_dataset(tmp_path / "train.jsonl")
    mixed = _attribute(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "mixed", 0.5)
    (record,) = mixed["method"]["checkpoints"]
    assert record["base_point"] and record["weight"] == 0.5 and record["step"] == 0
    assert "base model's blame" in (tmp_path / "mixed" / "report.md").read_text()
    items = mixed["method"]["query_items"]
    adapter = _attribute(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "adapter", 0.0)
    assert "checkpoints" not in adapter["method"]
    base = _attribute(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "base", 1.0)
    assert base["method"]["checkpoints"][0]["index_id"] == record["index_id"]  # the cached index, reused
    alone = _item_blame(tmp_path / "adapter", items)
    expected = with_base_point(alone, _item_blame(tmp_path / "base", items), 0.5)
    np.testing.assert_allclose(_item_blame(tmp_path / "mixed", items), expected, rtol=1e-5, atol=1e-9)
    assert not np.allclose(expected, alone / np.linalg.norm(alone), atol=1e-3)  # the base point moved the blame


def test_a_share_outside_zero_to_one_is_refused(tiny_base_dir, tiny_adapter_dir, tmp_path, capsys):
    dataset = write_dataset(tmp_path / "train.jsonl")
    argv = ["attribute", "--base-model", str(tiny_base_dir), "--adapter", str(tiny_adapter_dir), "--dataset",
            str(dataset), "--out", str(tmp_path / "out"), "--set", "attribution.base_point=1.5"]
    assert main(argv) == 2
    assert "attribution.base_point" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
