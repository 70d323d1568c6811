"""LoadedModel and LoRA block discovery: what loads, what is frozen, and the one-line errors for bad adapters."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import types

import pytest
import torch

from gradian.errors import ConfigError, GradianError, ModelError
from gradian.grads.batch import collate
from gradian.grads.capture import GradientCapture
from gradian.model.loaded import UNSLOTH_ENV, LoadedModel, base_model_fingerprint, require_adapter
from gradian.model.lora_blocks import discover_lora_blocks
from tests.support.tiny import save_tiny_base, tiny_llama, tiny_lora, tiny_tokenizer


def _one_line(error: GradianError) -> str:
    text = error.one_line()
    assert "\n" not in text and "Traceback" not in text
    return text


def _copy(adapter_dir, tmp_path, name="adapter"):
    target = tmp_path / name
    shutil.copytree(adapter_dir, target)
    return target


def test_load_freezes_everything_but_lora_and_records_identity(tiny_base_dir, tiny_adapter_dir):
    loaded = LoadedModel.load(tiny_base_dir, tiny_adapter_dir)
    assert not loaded.model.training
    names = loaded.trainable_parameter_names()
    assert names and all(".lora_A.default." in n or ".lora_B.default." in n for n in names)
    assert len(names) == 2 * len(loaded.blocks()) == 2 * 2 * 3  # 2 layers x (q, v, down)
    assert loaded.adapter_dir == tiny_adapter_dir and loaded.base_model_name == str(tiny_base_dir)
    assert len(loaded.adapter_hash) == 64 and len(loaded.base_model_hash) == 64
    assert loaded.tokenizer is not None and loaded.adapter_name == "default"
    # The saved LoRA weights are the ones in the model (random B, so not peft's zero init).
    from safetensors.torch import load_file

    saved = load_file(str(tiny_adapter_dir / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"
    live = loaded.model.get_submodule("base_model.model.model.layers.0.mlp.down_proj").lora_B["default"].weight
    assert saved[key].abs().sum() > 0 and torch.equal(saved[key], live.detach())


def test_hashes_follow_content_not_location(tiny_base_dir, tiny_adapter_dir, tmp_path):
    first = LoadedModel.load(tiny_base_dir, tiny_adapter_dir)
    moved_base = tmp_path / "base-copy"
    shutil.copytree(tiny_base_dir, moved_base)
    moved = LoadedModel.load(moved_base, _copy(tiny_adapter_dir, tmp_path))
    assert (moved.adapter_hash, moved.base_model_hash) == (first.adapter_hash, first.base_model_hash)

    edited = _copy(tiny_adapter_dir, tmp_path, "edited")
    config = json.loads((edited / "adapter_config.json").read_text())
    config["lora_alpha"] = config["lora_alpha"] * 2
    (edited / "adapter_config.json").write_text(json.dumps(config))
    assert LoadedModel.load(tiny_base_dir, edited).adapter_hash != first.adapter_hash

    # peft writes target_modules from a set, in an order that varies by process: not a different adapter.
    reordered = _copy(tiny_adapter_dir, tmp_path, "reordered")
    config = json.loads((reordered / "adapter_config.json").read_text())
    config["target_modules"] = list(reversed(sorted(config["target_modules"])))
    (reordered / "adapter_config.json").write_text(json.dumps(config, indent=4))
    assert LoadedModel.load(tiny_base_dir, reordered).adapter_hash == first.adapter_hash

    other_base = save_tiny_base(tmp_path / "other-base", seed=5)
    assert LoadedModel.load(other_base, tiny_adapter_dir).base_model_hash != first.base_model_hash
    # The fingerprint of the wrapped model equals that of the bare base it was built from.
    from gradian.model.base import load_base_model

    bare, _ = load_base_model(str(tiny_base_dir))
    assert base_model_fingerprint(bare) == first.base_model_hash == base_model_fingerprint(first.model)


def test_wrap_a_peft_model_already_in_memory(chatml_tokenizer):
    peft_model = tiny_lora(tiny_llama(chatml_tokenizer), r=2)
    peft_model.train()
    for param in peft_model.parameters():
        param.requires_grad_(True)
    loaded = LoadedModel(peft_model, chatml_tokenizer)
    assert not peft_model.training
    assert all(".lora_" in n for n in loaded.trainable_parameter_names())
    again = LoadedModel(tiny_lora(tiny_llama(chatml_tokenizer), r=2), chatml_tokenizer)
    assert loaded.adapter_hash == again.adapter_hash and loaded.base_model_hash == again.base_model_hash
    batch = collate([{"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]}], chatml_tokenizer.pad_token_id)
    assert GradientCapture(loaded).capture(batch).abs().sum() > 0
    with pytest.raises(ModelError, match="no LoRA layers"):
        LoadedModel(tiny_llama(chatml_tokenizer), chatml_tokenizer)


def test_require_adapter_explains_why():
    with pytest.raises(ModelError) as caught:
        require_adapter(None)
    text = _one_line(caught.value)
    assert "Gradian attributes over adapter parameters" in text
    assert "gradian attribute refuses to run without an adapter" in text
    assert "gradian diagnose" in text and "needs only a dataset" in text
    assert "gradian index refuses" in _one_line(pytest.raises(ModelError, require_adapter, "", "index").value)
    assert str(require_adapter("some/dir")) == "some/dir"


def test_load_without_adapter_refuses(tiny_base_dir):
    with pytest.raises(ModelError, match="refuses to run without an adapter"):
        LoadedModel.load(tiny_base_dir, None)


@pytest.mark.parametrize("case", ["missing", "file", "no-config", "bad-json", "no-weights", "no-lora-tensors",
                                  "corrupt-safetensors"])
def test_broken_adapter_directories_give_one_line_errors(tiny_base_dir, tiny_adapter_dir, tmp_path, case):
    adapter = _copy(tiny_adapter_dir, tmp_path)
    expected = {
        "missing": "does not exist",
        "file": "is a file, not an adapter directory",
        "no-config": "adapter_config.json is missing",
        "bad-json": "not valid JSON",
        "no-weights": "no LoRA weights",
        "no-lora-tensors": "no LoRA weights",
        "corrupt-safetensors": "not a readable safetensors file",
    }[case]
    if case == "missing":
        adapter = tmp_path / "nowhere"
    elif case == "file":
        adapter = adapter / "adapter_config.json"
    elif case == "no-config":
        (adapter / "adapter_config.json").unlink()
    elif case == "bad-json":
        (adapter / "adapter_config.json").write_text("{not json")
    elif case == "no-weights":
        (adapter / "adapter_model.safetensors").unlink()
    elif case == "no-lora-tensors":
        from safetensors.torch import save_file

        save_file({"lm_head.weight": torch.zeros(2, 2)}, str(adapter / "adapter_model.safetensors"))
    elif case == "corrupt-safetensors":
        (adapter / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(ModelError) as caught:
        LoadedModel.load(tiny_base_dir, adapter)
    assert expected in _one_line(caught.value)


def test_non_lora_peft_adapter_is_refused(tiny_base_dir, tmp_path):
    from peft import IA3Config, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_base_dir)
    ia3 = get_peft_model(model, IA3Config(target_modules=["v_proj", "down_proj"], feedforward_modules=["down_proj"],
                                          task_type="CAUSAL_LM"))
    ia3.save_pretrained(tmp_path / "ia3")
    with pytest.raises(ModelError) as caught:
        LoadedModel.load(tiny_base_dir, tmp_path / "ia3")
    assert "holds a IA3 PEFT adapter, not LoRA" in _one_line(caught.value)


def test_pickle_weights_are_refused_unless_allowed(tiny_base_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    pickled = tmp_path / "pickled"
    peft_model = tiny_lora(AutoModelForCausalLM.from_pretrained(tiny_base_dir))
    peft_model.save_pretrained(pickled, safe_serialization=False)
    assert (pickled / "adapter_model.bin").is_file() and not (pickled / "adapter_model.safetensors").exists()
    with pytest.raises(ModelError) as caught:
        LoadedModel.load(tiny_base_dir, pickled)
    assert "--allow-pickle" in _one_line(caught.value)
    with pytest.warns(UserWarning, match="weights_only=True"):
        loaded = LoadedModel.load(tiny_base_dir, pickled, allow_pickle=True)
    for (name, mine), (_, saved) in zip(loaded.model.named_parameters(), peft_model.named_parameters(), strict=True):
        assert torch.equal(mine, saved), name


def test_adapter_for_another_base_model_names_a_tensor(tiny_adapter_dir, tmp_path):
    tokenizer = tiny_tokenizer("chatml")
    wider = tiny_llama(tokenizer, hidden=48)
    wider.save_pretrained(tmp_path / "wider")
    tokenizer.save_pretrained(tmp_path / "wider")
    with pytest.raises(ModelError) as caught:
        LoadedModel.load(tmp_path / "wider", tiny_adapter_dir)
    text = _one_line(caught.value)
    assert "does not fit base model" in text
    assert re.search(r"tensor base_model\.model\.model\.layers\.\d\.\S+\.lora_[AB]\.weight has shape \[\d+, \d+\] "
                     r"but model\.layers\.\d\.\S+ has (input|output) size (48|96)", text), text
    assert "adapter for another base model" in text


def test_adapter_config_that_disagrees_with_its_weights(tiny_base_dir, tiny_adapter_dir, tmp_path):
    adapter = _copy(tiny_adapter_dir, tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["r"] = 8
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError) as caught:
        LoadedModel.load(tiny_base_dir, adapter)
    text = _one_line(caught.value)
    assert "has shape [4, 32] in the adapter file but [8, 32] in the model" in text


def test_unsloth_in_process_is_refused_unless_allowed(tiny_base_dir, tiny_adapter_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    monkeypatch.delenv(UNSLOTH_ENV, raising=False)
    with pytest.raises(ModelError) as caught:
        LoadedModel.load(tiny_base_dir, tiny_adapter_dir)
    text = _one_line(caught.value)
    assert text.startswith("unsloth is imported in this process, so a plain transformers model cannot be built here")
    assert "prepare_for_gradients" in text and UNSLOTH_ENV in text
    monkeypatch.setenv(UNSLOTH_ENV, "1")
    assert LoadedModel.load(tiny_base_dir, tiny_adapter_dir).blocks()


def test_blocks_follow_the_module_filter(chatml_tokenizer):
    loaded = LoadedModel(tiny_lora(tiny_llama(chatml_tokenizer), r=4, use_rslora=True), chatml_tokenizer)
    names = [b.name for b in loaded.blocks()]
    assert names == [f"model.layers.{i}.{m}" for i in (0, 1)
                     for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")]
    assert [b.name for b in loaded.blocks("down_proj")] == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    assert [b.name for b in loaded.blocks(r"layers\.1\.self_attn")] == ["model.layers.1.self_attn.q_proj",
                                                                       "model.layers.1.self_attn.v_proj"]
    q = loaded.blocks("layers.0.self_attn.q_proj")[0]
    assert (q.d_in, q.d_out, q.r, q.scaling) == (32, 32, 4, pytest.approx(8.0 / 2.0))
    v = loaded.blocks("v_proj")[0]
    assert (v.d_in, v.d_out) == (32, 16)
    with pytest.raises(ModelError) as caught:
        loaded.blocks("gate_proj")
    text = _one_line(caught.value)
    assert "no LoRA blocks found" in text and "'gate_proj' matched none of the 6 LoRA blocks" in text
    assert "module filter" in text and "embeddings or convolutions" in text
    with pytest.raises(ConfigError, match=r"grads.module_filter '\(' is not a valid regular expression"):
        loaded.blocks("(")


def test_lora_on_embeddings_is_skipped_and_logged(chatml_tokenizer, caplog):
    loaded = LoadedModel(tiny_lora(tiny_llama(chatml_tokenizer), targets=("embed_tokens", "q_proj")), chatml_tokenizer)
    with caplog.at_level(logging.INFO, logger="gradian.model.lora_blocks"):
        blocks = loaded.blocks()
    assert [b.name for b in blocks] == ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"]
    assert "skipping LoRA layer model.embed_tokens: LoRA on an embedding" in caplog.text
    assert not any("embed" in n for n in loaded.trainable_parameter_names())
    only_embeddings = LoadedModel(tiny_lora(tiny_llama(chatml_tokenizer), targets=("embed_tokens",)), chatml_tokenizer)
    with pytest.raises(ModelError, match="no LoRA blocks found"):
        only_embeddings.blocks()


def test_dora_and_merged_adapters_are_refused(chatml_tokenizer):
    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(tiny_llama(chatml_tokenizer), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    with pytest.raises(ModelError, match="LoRA variant Dora on block model.layers.0.self_attn.q_proj"):
        discover_lora_blocks(LoadedModel(dora, chatml_tokenizer).model)
    merged = tiny_lora(tiny_llama(chatml_tokenizer))
    merged.merge_adapter()
    with pytest.raises(ModelError, match="merged into the base weights"):
        LoadedModel(merged, chatml_tokenizer).blocks()
