"""Fixtures of the diagnose tests: the real Trainer-written runs (once per session) and tiny tokenizers."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def real_runs():
    """A healthy and a faulty LoRA run written by the real transformers.Trainer on a tiny pretrained base."""
    from tests.checks.run_fixtures import real_runs as train

    return train()


@pytest.fixture(scope="session")
def tokenizers():
    """Tiny tokenizers: ChatML, and variants with one tokenizer-level fault each."""
    from tokenizers import processors

    from tests.support.tiny import tiny_tokenizer

    wrong_eos = tiny_tokenizer("chatml")
    wrong_eos.eos_token = "<|endoftext|>"  # the template still ends turns with <|im_end|>
    pad_eos = tiny_tokenizer("chatml")
    pad_eos.pad_token = pad_eos.eos_token
    added = tiny_tokenizer("chatml")
    added.add_tokens(["<tool>"])
    llama3_bos = tiny_tokenizer("llama3")
    llama3_bos.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", llama3_bos.bos_token_id)])
    return {"chatml": tiny_tokenizer("chatml"), "chatml_wrong_eos": wrong_eos, "chatml_pad_eos": pad_eos,
            "chatml_added": added, "llama3_bos": llama3_bos}


@pytest.fixture
def case_env(tmp_path, real_runs, tokenizers, tiny_base_dir, tiny_adapter_dir):
    """Where a check case writes its inputs."""
    from tests.checks.check_cases import CaseEnv

    return CaseEnv(tmp_path, real_runs, tokenizers, tiny_base_dir, tiny_adapter_dir)
