"""4-bit bases (QLoRA, unsloth -bnb-4bit): refused before loading with the unquantized base to use, noted in reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gradian.cli.app import main
from tests.core.test_attribute_errors import TRAIN_ROWS, assert_one_line_error, write_jsonl
from tests.core.test_model_base import put_in_hub_cache

BNB_4BIT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
            "_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8",
            "llm_int8_threshold": 6.0, "llm_int8_skip_modules": None}
WHY = "applies to the unquantized base unchanged, and gradients are then taken on the dequantized base"


def quantized_copy(source: Path, target: Path, **config_extra) -> Path:
    """A copy of a tiny base whose config.json carries the quantization_config an unsloth -bnb-4bit upload has."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "quantization_config": BNB_4BIT, **config_extra}))
    return target


def adapter_trained_on(source: Path, target: Path, base_name: str) -> Path:
    """A copy of a tiny adapter whose adapter_config.json names ``base_name`` as its base, as unsloth writes it."""
    shutil.copytree(source, target)
    config = json.loads((target / "adapter_config.json").read_text())
    (target / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base_name}))
    return target


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    cache = tmp_path / "gradian-cache"
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(cache))
    return cache


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_gradian_attribute_refuses_a_4bit_base_naming_the_unsloth_unquantized_base(
        capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, cache_dir, hub_cache):
    base = quantized_copy(tiny_base_dir, tmp_path / "llama-tiny-bnb-4bit")
    adapter = adapter_trained_on(tiny_adapter_dir, tmp_path / "adapter", "unsloth/llama-tiny-bnb-4bit")
    train, out = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS), tmp_path / "report"
    code, stdout, err = run(capsys, "attribute", "--base-model", base, "--adapter", adapter, "--dataset", train,
                            "--out", out)
    line = assert_one_line_error(
        code, err, f"base model {base} is a bitsandbytes 4-bit (nf4) checkpoint", "does not load",
        "--base-model unsloth/llama-tiny (the unsloth name without -bnb-4bit; it is not in the local Hugging Face "
        "cache, so download it first", "trained on the 4-bit base (QLoRA, unsloth)", WHY)
    assert "Traceback" not in err and stdout == ""
    assert not out.exists() and not cache_dir.exists()  # nothing written: no report, no index
    assert line.count("gradian: error:") == 1


def test_gradian_index_prefers_an_unquantized_name_the_adapter_or_config_records(
        capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, cache_dir, hub_cache):
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS)
    base = quantized_copy(tiny_base_dir, tmp_path / "q", _name_or_path="meta-llama/Llama-tiny")
    put_in_hub_cache(hub_cache, "meta-llama/Llama-tiny", tiny_base_dir)  # found locally: no download advice
    trained_on_q = adapter_trained_on(tiny_adapter_dir, tmp_path / "adapter-q", str(base))  # trained on this dir
    code, _, err = run(capsys, "index", "--base-model", base, "--adapter", trained_on_q, "--dataset", train,
                       "--out", tmp_path / "index")
    line = assert_one_line_error(code, err, "--base-model meta-llama/Llama-tiny (config.json _name_or_path)", WHY)
    assert "download" not in line and not (tmp_path / "index").exists() and not (tmp_path / ".index.partial").exists()

    # QLoRA through transformers: the adapter records the unquantized id it was loaded from in 4 bits.
    adapter = adapter_trained_on(tiny_adapter_dir, tmp_path / "adapter", "Qwen/Qwen-tiny")
    code, _, err = run(capsys, "index", "--base-model", base, "--adapter", adapter, "--dataset", train,
                       "--out", tmp_path / "index")
    assert_one_line_error(code, err, "--base-model Qwen/Qwen-tiny (adapter_config.json base_model_name_or_path; "
                                     "it is not in the local Hugging Face cache, so download it first")


def test_nothing_names_the_unquantized_base_still_explains_the_way_out(capsys, tmp_path, tiny_base_dir,
                                                                       tiny_adapter_dir, cache_dir, hub_cache):
    base = tmp_path / "q8"
    shutil.copytree(tiny_base_dir, base)
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (base / "config.json").write_text(json.dumps(config))
    adapter = adapter_trained_on(tiny_adapter_dir, tmp_path / "adapter", str(base))
    code, _, err = run(capsys, "index", "--base-model", base, "--adapter", adapter,
                       "--dataset", write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS), "--out", tmp_path / "index")
    line = assert_one_line_error(code, err, "is a GPTQ 4-bit checkpoint", "pass the unquantized base it was made "
                                 "from (for unsloth/<model>-bnb-4bit that is unsloth/<model>)", WHY)
    assert "QLoRA" not in line  # that advice is about bitsandbytes bases


@pytest.mark.parametrize(("name", "unquantized"), [
    ("unsloth/llama-3-8b-bnb-4bit", "unsloth/llama-3-8b"),
    ("unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit", "unsloth/Meta-Llama-3.1-8B-Instruct"),
    ("unsloth/Qwen2.5-7B-Instruct-unsloth-bnb-4bit", "unsloth/Qwen2.5-7B-Instruct"),
    ("unsloth/mistral-7b-v0.3-bnb-8bit", "unsloth/mistral-7b-v0.3"),
    ("/models/llama-3-8b-bnb-4bit/", "/models/llama-3-8b"),
    ("meta-llama/Llama-3.1-8B", None),
    ("TheBloke/Llama-2-7B-GPTQ", None),  # no convention says where its unquantized base lives
])
def test_unsloth_naming_convention(name, unquantized):
    from gradian.model.quantized import names_quantized_model, unsloth_unquantized_name

    assert unsloth_unquantized_name(name) == unquantized
    assert names_quantized_model(name) == (unquantized is not None or "GPTQ" in name)


@pytest.mark.parametrize(("spec", "text"), [
    (BNB_4BIT, "bitsandbytes 4-bit (nf4)"),
    ({"load_in_8bit": True}, "bitsandbytes 8-bit"),
    ({"quant_method": "awq", "bits": 4, "version": "gemm"}, "AWQ 4-bit"),
    ({"quant_method": "quanto", "weights": "int4"}, "quanto 4-bit"),
    ({"quant_method": "fbgemm_fp8"}, "fbgemm_fp8 8-bit"),
])
def test_quantization_configs_are_named_with_their_method_and_bits(spec, text):
    from gradian.model.quantized import quantization_of

    assert quantization_of({"quantization_config": spec}).describe() == text
    assert quantization_of({"model_type": "llama"}) is None and quantization_of({"quantization_config": {}}) is None


def test_an_adapter_trained_on_a_4bit_base_is_noted_in_the_report(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir,
                                                                  cache_dir):
    from gradian.model.loaded import LoadedModel

    adapter = adapter_trained_on(tiny_adapter_dir, tmp_path / "adapter", "unsloth/llama-tiny-bnb-4bit")
    assert LoadedModel.load(tiny_base_dir, adapter).quantized_training_base == "unsloth/llama-tiny-bnb-4bit"
    assert LoadedModel.load(tiny_base_dir, tiny_adapter_dir).quantized_training_base is None

    out = tmp_path / "report"
    code, _, err = run(capsys, "attribute", "--base-model", tiny_base_dir, "--adapter", adapter,
                       "--dataset", write_jsonl(tmp_path / "train.jsonl", TRAIN_ROWS), "--out", out)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    [note] = [w for w in report["warnings"] if w["code"] == "model.quantized_training_base"]
    expected = (f"The adapter was trained on a 4-bit base (unsloth/llama-tiny-bnb-4bit); gradients were taken on the "
                f"unquantized base {tiny_base_dir}.")
    assert note["message"].startswith(expected)
    assert expected in (out / "report.md").read_text()


def test_diagnose_notes_an_unsloth_adapter_on_its_unquantized_base_instead_of_a_mismatch(
        capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, hub_cache):
    put_in_hub_cache(hub_cache, "unsloth/llama-tiny", tiny_base_dir)
    put_in_hub_cache(hub_cache, "meta-llama/Llama-other", tiny_base_dir)
    adapter = adapter_trained_on(tiny_adapter_dir, tmp_path / "adapter", "unsloth/llama-tiny-bnb-4bit")

    def findings(base: str) -> list[dict]:
        code, out, err = run(capsys, "diagnose", "--adapter", adapter, "--base-model", base, "--select",
                             "adapter_base_mismatch", "--format", "json", "--fail-on", "never")
        assert code == 0, err
        return [f for f in json.loads(out)["findings"] if f["id"] == "adapter_base_mismatch"]

    [note] = findings("unsloth/llama-tiny")
    assert note["severity"] == "info" and "trained on the quantized base 'unsloth/llama-tiny-bnb-4bit'" in note["message"]
    assert "dequantized base" in note["message"]
    [mismatch] = findings("meta-llama/Llama-other")  # another model altogether is still a mismatch
    assert mismatch["severity"] == "warning" and "but --base-model is 'meta-llama/Llama-other'" in mismatch["message"]
