"""`gradian index` and `gradian show-index`: a real build, reuse, the printed manifest, and one-line errors."""

from __future__ import annotations

import json
import shutil
import sys
import types

import pytest

from gradian.cli.app import main

QUESTIONS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What is two plus two?", "Two plus two is four."),
    ("Hello! How are you?", "I am fine, thank you."),
    ("Explain why the sky is blue in one short sentence.", "The sky is blue. Yes."),
    ("What is seven times six?", "Seven times six is forty-two."),
]


def write_dataset(path, count: int = 5):
    """A chat JSONL training set (cycling through a few questions)."""
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(count):
            question, answer = QUESTIONS[i % len(QUESTIONS)]
            row = {"messages": [{"role": "user", "content": f"{question} ({i})"}, {"role": "assistant", "content": answer}]}
            handle.write(json.dumps(row) + "\n")
    return path


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_error(code: int, err: str, *needles: str) -> None:
    """Exit 2 and exactly one error line, no traceback (a library's own progress bar may precede it)."""
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("gradian: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.fixture()
def dataset(tmp_path):
    return write_dataset(tmp_path / "train.jsonl")


def index_args(base, adapter, dataset, out, *extra):
    args = ["index", "--base-model", base, "--dataset", dataset, "--out", out, "--set", "grads.shard_size=2", *extra]
    return args if adapter is None else [*args, "--adapter", adapter]


def test_index_builds_then_reuses_and_show_index_prints_blocks_and_manifest(capsys, tmp_path, tiny_base_dir,
                                                                              tiny_adapter_dir, dataset):
    out = tmp_path / "index"
    code, stdout, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, out))
    assert code == 0, err
    assert " built in " in stdout and "5 examples x 1664 (exact, float16)" in stdout and "3 shards" in stdout
    assert "indexing" in err and "ex/s" in err  # the progress bar, on stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["index_id"] in stdout
    code, stdout, _ = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, out))
    assert code == 0 and f"index {manifest['index_id']} reused" in stdout

    code, stdout, _ = run_cli(capsys, "show-index", out)
    assert code == 0
    assert "6 LoRA blocks, 1664 numbers per example" in stdout
    assert "model.layers.1.mlp.down_proj" in stdout and "4x64" in stdout
    for needle in (manifest["index_id"], "spec.checkpoint.adapter_sha256", "spec.grads.loss_reduction", "shard-00002.npy",
                   "spec.libraries.torch", "spec.dataset.ids_sha256", "spec.damping.damping_ratio"):
        assert needle in stdout, needle
    code, stdout, _ = run_cli(capsys, "show-index", out, "--json", "--verify")
    assert code == 0 and json.loads(stdout) == manifest


def test_a_bfloat16_index_records_its_dtype_and_show_index_prints_it(capsys, tmp_path, tiny_base_dir,
                                                                    tiny_adapter_dir, dataset):
    float32, bfloat16 = tmp_path / "fp32", tmp_path / "bf16"
    code, stdout32, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, float32, "--device", "cpu"))
    assert code == 0, err
    code, stdout16, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, bfloat16,
                                                      "--device", "cpu", "--dtype", "bfloat16"))
    assert code == 0, err
    ids = [json.loads((path / "manifest.json").read_text())["index_id"] for path in (float32, bfloat16)]
    assert ids[0] != ids[1] and ids[0] in stdout32 and ids[1] in stdout16
    code, stdout, _ = run_cli(capsys, "show-index", bfloat16)
    assert code == 0
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in stdout.splitlines() if line.count("│") >= 3}
    assert rows["spec.compute.device_type"] == "cpu"
    assert rows["spec.compute.base_dtype"] == "bfloat16" and rows["spec.compute.lora_dtype"] == "float32"


def test_no_adapter_is_refused_with_the_spec_explanation(capsys, tmp_path, tiny_base_dir, dataset):
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, None, dataset, tmp_path / "index"))
    assert_error(code, err, "no adapter given", "nothing to differentiate", "gradian diagnose")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "index").exists()


def test_adapter_dirs_without_lora_weights_or_of_another_kind_are_refused(capsys, tmp_path, tiny_base_dir,
                                                                         tiny_adapter_dir, dataset):
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(tiny_adapter_dir / "adapter_config.json", no_weights)
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, no_weights, dataset, tmp_path / "a"))
    assert_error(code, err, "no LoRA weights")

    ia3 = tmp_path / "ia3"
    shutil.copytree(tiny_adapter_dir, ia3)
    config = json.loads((ia3 / "adapter_config.json").read_text())
    (ia3 / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, ia3, dataset, tmp_path / "b"))
    assert_error(code, err, "IA3", "not LoRA")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_module_filter_that_matches_nothing_names_the_filter(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, dataset):
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "index",
                                               "--set", "grads.module_filter=layers\\.7\\."))
    assert_error(code, err, "no LoRA blocks found", "grads.module_filter", "matched none", "module filter")
    assert "indexing" not in err  # refused before the first gradient: no progress bar
    assert not (tmp_path / "index").exists()


def test_an_adapter_for_another_base_model_is_refused(capsys, tmp_path, tiny_adapter_dir, dataset):
    from tests.support.tiny import tiny_llama, tiny_tokenizer

    tokenizer = tiny_tokenizer("chatml")
    wider = tiny_llama(tokenizer, hidden=48)
    other_base = tmp_path / "other-base"
    wider.save_pretrained(other_base, safe_serialization=True)
    tokenizer.save_pretrained(other_base)
    code, _, err = run_cli(capsys, *index_args(other_base, tiny_adapter_dir, dataset, tmp_path / "index"))
    assert_error(code, err, "another base model")
    assert not (tmp_path / "index").exists()


def test_max_seq_length_must_be_positive(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, dataset):
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "index",
                                               "--set", "grads.max_seq_length=0"))
    assert_error(code, err, "grads.max_seq_length")


def test_an_index_dir_of_another_format_version_is_refused(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, dataset):
    old = tmp_path / "old-index"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"format_version": 0, "index_id": "x"}))
    code, _, err = run_cli(capsys, "show-index", old)
    assert_error(code, err, "format version 0", "rebuild")
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, old))
    assert_error(code, err, "format version 0")
    code, _, err = run_cli(capsys, "show-index", tmp_path)
    assert_error(code, err, "not a gradient index")


def test_an_unwritable_out_dir_is_one_line_and_nothing_half_written(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir,
                                                                     dataset):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where a directory should be")
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, blocker / "index"))
    assert_error(code, err, "which is a file", "--out")  # refused before the model loads
    assert blocker.read_text().startswith("a file")


def test_unsloth_in_process_is_refused(capsys, monkeypatch, tmp_path, tiny_base_dir, tiny_adapter_dir, dataset):
    monkeypatch.delenv("GRADIAN_ALLOW_UNSLOTH_IN_PROCESS", raising=False)
    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "index"))
    assert_error(code, err, "unsloth is imported in this process", "fresh process")
    assert len(err.strip().splitlines()) == 1


def test_missing_base_model_or_dataset(capsys, tmp_path, tiny_adapter_dir, dataset, hub_cache):
    from tests.core.test_base_model_default import relabelled

    # No --base-model, and the base the adapter names is not on this machine.
    elsewhere = relabelled(tiny_adapter_dir, tmp_path / "adapter", "nobody-org/not-cached")
    code, _, err = run_cli(capsys, "index", "--adapter", elsewhere, "--dataset", dataset)
    assert_error(code, err, "nobody-org/not-cached", "--base-model")
    code, _, err = run_cli(capsys, "index", "--adapter", tiny_adapter_dir, "--base-model", tmp_path / "nope",
                           "--dataset", tmp_path / "missing.jsonl")
    assert code == 2 and "Traceback" not in err


def test_truncated_examples_are_kept_and_noted(capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, dataset):
    code, stdout, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "index",
                                                    "--set", "grads.max_seq_length=30"))
    assert code == 0, err  # 30 tokens cut every example, and leave the start of most answers
    assert "5 examples" in stdout and "note: 5 example(s) were truncated to grads.max_seq_length=30 tokens" in err
    rows = [json.loads(line) for line in (tmp_path / "index" / "examples.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(r["truncated"] and r["num_tokens"] == 30 for r in rows)


def test_tokenizer_flag_renders_with_the_given_tokenizer_and_a_missing_one_is_refused_early(
        capsys, tmp_path, tiny_base_dir, tiny_adapter_dir, dataset):
    out = tmp_path / "index"
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, out, "--tokenizer",
                                               tiny_base_dir))
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sources"]["tokenizer"].endswith(f"the tokenizer given ({tiny_base_dir})")
    missing = tmp_path / "no-such-tokenizer"
    code, _, err = run_cli(capsys, *index_args(tiny_base_dir, tiny_adapter_dir, dataset, tmp_path / "other",
                                               "--tokenizer", missing))
    assert_error(code, err, f"--tokenizer {missing} does not exist")
    assert not (tmp_path / "other").exists()


def test_attribute_refuses_a_missing_tokenizer_before_loading_anything(capsys, tmp_path, tiny_base_dir,
                                                                        tiny_adapter_dir, dataset):
    missing = tmp_path / "no-such-tokenizer"
    code, _, err = run_cli(capsys, "attribute", "--base-model", tiny_base_dir, "--adapter", tiny_adapter_dir,
                           "--dataset", dataset, "--eval-dataset", dataset, "--out", tmp_path / "report",
                           "--tokenizer", missing)
    assert_error(code, err, f"--tokenizer {missing} does not exist")
    assert not (tmp_path / "report").exists()
