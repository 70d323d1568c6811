"""Base-model resolution and loading: local dirs, the local HF cache, clear errors, no network, no remote code."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest

from gradian.cli.options import BaseModelOption
from gradian.errors import ModelError
from gradian.model.base import hub_cache_snapshot, load_base_model, load_tokenizer, resolve_base_model


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test loudly."""

    def refuse(*args, **kwargs):
        raise AssertionError("tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def put_in_hub_cache(root: Path, repo_id: str, source: Path) -> Path:
    """Lay out ``source``'s files the way huggingface_hub caches a downloaded snapshot."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


# --- resolution errors --------------------------------------------------------------------------


def test_missing_directory_is_a_model_error(tmp_path, no_network):
    with pytest.raises(ModelError, match="does not exist") as caught:
        resolve_base_model(tmp_path / "no-such-model")
    assert "smollm2-135m-instruct" in caught.value.hint


def test_directory_without_config_json_is_a_model_error(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_base_model(tmp_path)


def test_a_file_is_not_a_model_directory(tmp_path):
    file = tmp_path / "config.json"
    file.write_text("{}")
    with pytest.raises(ModelError, match="is a file, not a model directory"):
        resolve_base_model(file)


def test_empty_name_is_a_model_error():
    with pytest.raises(ModelError, match="empty"):
        resolve_base_model("  ")


def test_unknown_hub_id_fails_at_once_without_network(hub_cache, no_network):
    with pytest.raises(ModelError) as caught:
        load_base_model("acme/never-downloaded-7b")
    assert "neither a local directory nor in the local Hugging Face cache" in caught.value.message
    assert str(hub_cache) in caught.value.message


def test_deep_relative_path_is_reported_as_a_path(hub_cache):
    with pytest.raises(ModelError, match="base model directory models/acme/tiny does not exist"):
        resolve_base_model("models/acme/tiny")


# --- local dirs and the HF cache ----------------------------------------------------------------


def test_local_tiny_model_loads_in_eval_mode(tiny_base_dir, no_network):
    import torch

    model, tokenizer = load_base_model(str(tiny_base_dir))
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert tokenizer.pad_token == "<|endoftext|>"
    assert model.config.vocab_size == len(tokenizer)


def test_dtype_is_honoured(tiny_base_dir):
    import torch

    model, _ = load_base_model(tiny_base_dir, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_unknown_dtype_and_device_are_model_errors(tiny_base_dir):
    with pytest.raises(ModelError, match="unknown dtype 'fp8'"):
        load_base_model(tiny_base_dir, dtype="fp8")
    with pytest.raises(ModelError, match="unknown device 'gpu0'"):
        load_base_model(tiny_base_dir, device="gpu0")


def test_cuda_without_a_gpu_is_a_model_error(tiny_base_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    with pytest.raises(ModelError, match="no CUDA GPU is visible"):
        load_base_model(tiny_base_dir, device="cuda")


def test_id_in_the_local_hub_cache_resolves_to_its_snapshot(tiny_base_dir, hub_cache, no_network):
    snapshot = put_in_hub_cache(hub_cache, "acme/tiny-chat", tiny_base_dir)
    assert resolve_base_model("acme/tiny-chat") == snapshot
    assert hub_cache_snapshot("acme/other") is None
    model, tokenizer = load_base_model("acme/tiny-chat")
    assert not model.training and tokenizer.eos_token == "<|im_end|>"


def test_smollm2_hub_id_in_the_hub_cache_wins_over_the_embedded_gguf(tiny_base_dir, hub_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "gradian-cache"))
    snapshot = put_in_hub_cache(hub_cache, "HuggingFaceTB/SmolLM2-135M-Instruct", tiny_base_dir)
    assert resolve_base_model("HuggingFaceTB/SmolLM2-135M-Instruct") == snapshot
    assert not (tmp_path / "gradian-cache").exists()  # nothing was converted


# --- trust_remote_code --------------------------------------------------------------------------


def _spy_on_from_pretrained(monkeypatch, cls) -> list[dict]:
    """Record the keyword arguments of every call to ``cls.from_pretrained``, then run the real one."""
    calls: list[dict] = []
    real = cls.from_pretrained.__func__

    def spy(klass, *args, **kwargs):
        calls.append(kwargs)
        return real(klass, *args, **kwargs)

    monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    return calls


def test_trust_remote_code_is_off_and_files_are_local_unless_passed(tiny_base_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_calls = _spy_on_from_pretrained(monkeypatch, AutoModelForCausalLM)
    tokenizer_calls = _spy_on_from_pretrained(monkeypatch, AutoTokenizer)
    load_base_model(tiny_base_dir)
    load_tokenizer(tiny_base_dir)
    calls = model_calls + tokenizer_calls
    assert len(model_calls) == 1 and len(tokenizer_calls) == 2
    assert all(call["trust_remote_code"] is False and call["local_files_only"] is True for call in calls)

    model_calls.clear()
    load_base_model(tiny_base_dir, trust_remote_code=True)
    assert model_calls[0]["trust_remote_code"] is True


def test_a_model_with_its_own_code_is_refused_and_its_code_never_runs(tiny_base_dir, tmp_path):
    custom = tmp_path / "custom-model"
    custom.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (custom / name).write_bytes((tiny_base_dir / name).read_bytes())
    config = json.loads((tiny_base_dir / "config.json").read_text())
    config.update(model_type="gradian-test-custom", architectures=["CustomForCausalLM"],
                  auto_map={"AutoConfig": "configuration_custom.CustomConfig",
                            "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"})
    (custom / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "code-ran"
    for module in ("configuration_custom", "modeling_custom"):
        (custom / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")

    with pytest.raises(ModelError) as caught:
        load_base_model(custom)
    assert "ships its own Python code" in caught.value.message
    assert "--trust-remote-code" in caught.value.hint
    assert not marker.exists()


# --- pad token ----------------------------------------------------------------------------------


def test_missing_pad_token_falls_back_to_eos_without_touching_files(tmp_path, caplog):
    from tests.support.tiny import tiny_llama, tiny_tokenizer

    tokenizer = tiny_tokenizer("chatml")
    tokenizer.pad_token = None
    model = tiny_llama(tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}

    with caplog.at_level(logging.INFO, logger="gradian.model.base"):
        loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"
    assert "no pad token" in caplog.text
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before


# --- the CLI path -------------------------------------------------------------------------------


@pytest.fixture
def base_model_command():
    """A throwaway command on the real app that loads a tokenizer from --base-model, as commands do."""
    from gradian.cli.app import app

    def probe(base_model: BaseModelOption = None) -> None:
        load_tokenizer(base_model or "")

    app.command("test-probe-base-model")(probe)
    added = app.registered_commands[-1]
    yield "test-probe-base-model"
    app.registered_commands.remove(added)


@pytest.mark.parametrize("name", ["does/not/exist", "acme/never-downloaded-7b", "."])
def test_cli_reports_a_bad_base_model_in_one_line_with_exit_2(base_model_command, name, hub_cache, capsys):
    from gradian.cli.app import main

    assert main([base_model_command, "--base-model", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gradian: error: ")
    assert "(hint: " in err and "Traceback" not in err
