"""Shared fixtures: tiny models and tokenizers built in code, fresh plugin state per test."""

from __future__ import annotations

import os

import pytest

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A bug in a test run raises with its traceback instead of main()'s one-line "internal error"; the hostile-input
# tests unset it to check that net.
os.environ.setdefault("GRADIAN_DEBUG", "1")


@pytest.fixture(autouse=True)
def _fresh_plugins():
    """Each test sees a plugin manager loaded from scratch."""
    from gradian.plugins import reset_plugins

    reset_plugins()
    yield
    reset_plugins()


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty local Hugging Face cache that huggingface_hub looks in."""
    from huggingface_hub import constants

    root = tmp_path / "hf-hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def chatml_tokenizer():
    """The tiny ChatML tokenizer (SmolLM2's template family)."""
    from tests.support.tiny import tiny_tokenizer

    return tiny_tokenizer("chatml")


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory):
    """A tiny Llama base model + ChatML tokenizer saved to disk, usable as --base-model."""
    from tests.support.tiny import save_tiny_base

    return save_tiny_base(tmp_path_factory.mktemp("tiny-base"))


@pytest.fixture(scope="session")
def tiny_adapter_dir(tiny_base_dir, tmp_path_factory):
    """A LoRA adapter for tiny_base_dir, with random B so every gradient is non-zero."""
    from tests.support.tiny import save_tiny_adapter

    return save_tiny_adapter(tiny_base_dir, tmp_path_factory.mktemp("tiny-adapter") / "adapter")
