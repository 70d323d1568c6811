"""The unsloth compatibility shim, verified at contract level on CPU (no unsloth install, no GPU).

A tiny LoRA model is put in the state unsloth leaves a model in (read from unsloth's FastLlamaModel:
``for_inference`` / ``for_training``, its causal-LM forward, ``get_peft_model``): a forward that returns empty
logits under fused cross-entropy unless UNSLOTH_RETURN_LOGITS=1 and hidden states under
UNSLOTH_RETURN_HIDDEN_STATES=1, gradient checkpointing on, use_cache on, ``_flag_for_generation`` flags and
``_fast_lora`` caches, weights and rotary buffers created under torch.inference_mode, and train mode.
``prepare_for_gradients`` must make it give exactly the gradients of an untouched twin through build_index.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from gradian.config import load_config
from gradian.errors import ModelError
from gradian.model.loaded import LoadedModel
from gradian.model.unsloth_compat import compat_state, prepare_for_gradients, unsloth_compat_report
from tests.support.tiny import tiny_llama, tiny_lora
from tests.trainer_hf.chat_data import write_chat_dataset


def _twin_models(tokenizer):
    return tiny_lora(tiny_llama(tokenizer, seed=0), seed=0), tiny_lora(tiny_llama(tokenizer, seed=0), seed=0)


def _patch_like_unsloth(model) -> None:
    """Leave ``model`` the way unsloth leaves a model it loaded, generated with, then handed back for training."""
    causal_lm = model.get_base_model()
    original = causal_lm.forward

    def unsloth_forward(*args, labels=None, **kwargs):
        # unsloth's CausalLM forward reads both variables on every call.
        if os.environ.get("UNSLOTH_RETURN_HIDDEN_STATES", "0") == "1":
            out = original(*args, output_hidden_states=True, **kwargs)
            out.logits = out.hidden_states[-1]
            return out
        out = original(*args, labels=labels, **kwargs)
        if labels is not None and os.environ.get("UNSLOTH_RETURN_LOGITS", "0") != "1":
            out.logits = torch.empty(0)  # fused cross-entropy: the loss, no logits (unsloth's EMPTY_LOGITS)
        return out

    causal_lm.forward = unsloth_forward
    causal_lm.gradient_checkpointing_enable()
    model._unsloth_gradient_checkpointing = "unsloth"
    causal_lm.config.use_cache = True
    module = model
    while hasattr(module, "model"):  # for_inference flags the chain of .model wrappers
        module._flag_for_generation = True
        module = module.model
    module._flag_for_generation = True
    with torch.inference_mode():  # loaded / generated under inference mode: weights and rotary caches
        for sub in model.modules():
            for name, param in list(sub._parameters.items()):
                if param is not None:
                    sub._parameters[name] = torch.nn.Parameter(param.detach().clone(), requires_grad=False)
            for name, buffer in list(sub._buffers.items()):
                if buffer is not None:
                    sub._buffers[name] = buffer.clone()
    for name, param in model.named_parameters():
        if "lora_A" in name:
            param._fast_lora = (param, None)  # the fast-inference LoRA cache for_training deletes
    model.train()


@pytest.fixture
def unsloth_env(monkeypatch):
    """The process as unsloth leaves it; monkeypatch restores every variable prepare_for_gradients sets."""
    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    monkeypatch.delenv("UNSLOTH_RETURN_LOGITS", raising=False)
    monkeypatch.setenv("UNSLOTH_RETURN_HIDDEN_STATES", "1")


def test_the_patched_model_is_broken_for_gradients_before_the_shim(chatml_tokenizer, unsloth_env):
    patched, _ = _twin_models(chatml_tokenizer)
    _patch_like_unsloth(patched)

    state = compat_state(patched)
    assert state.unsloth_imported and state.inference_tensors and state.checkpointing_modules
    assert state.generation_flags >= 2 and state.fast_lora_caches > 0 and state.use_cache_configs == 1
    report = unsloth_compat_report(patched)
    assert "ready for gradients: no" in report and "torch.inference_mode" in report
    with pytest.raises(RuntimeError, match="[Ii]nference tensor"):
        LoadedModel(patched, chatml_tokenizer)  # LoRA weights made under inference mode cannot require grad


def test_prepare_for_gradients_gives_the_untouched_models_gradients(chatml_tokenizer, unsloth_env, tmp_path):
    from gradian.data import load_dataset
    from gradian.index.build import build_index

    patched, clean = _twin_models(chatml_tokenizer)
    _patch_like_unsloth(patched)

    assert prepare_for_gradients(patched) is patched
    state = compat_state(patched)
    assert state.problems == ()
    assert state.training_modules == 0 and state.lora_trainable == state.lora_tensors > 0
    assert os.environ["UNSLOTH_RETURN_LOGITS"] == "1" and os.environ["UNSLOTH_RETURN_HIDDEN_STATES"] == "0"
    report = unsloth_compat_report(patched)
    assert "ready for gradients: yes" in report and "unsloth imported in this process: yes" in report
    assert "not yet run end to end on a GPU" in report

    ids = torch.tensor([[5, 6, 7, 8, 9]])
    assert patched(input_ids=ids, labels=ids).logits.shape[-1] == len(chatml_tokenizer)  # fused CE is off

    examples = list(load_dataset(write_chat_dataset(tmp_path / "train.jsonl", n=6)))
    config = load_config(None, ["grads.batch_size=3"])
    ours = build_index(LoadedModel(patched, chatml_tokenizer), examples, config, tmp_path / "index-unsloth")
    reference = build_index(LoadedModel(clean, chatml_tokenizer), examples, config, tmp_path / "index-clean")
    assert ours.num_examples == reference.num_examples == 6
    got, want = ours.rows_between(0, 6), reference.rows_between(0, 6)
    assert abs(want).max() > 0
    assert got.shape == want.shape and (got == want).all()


def test_tied_weights_stay_tied_and_inference_mode_is_refused(chatml_tokenizer, unsloth_env):
    model, _ = _twin_models(chatml_tokenizer)
    causal_lm = model.get_base_model()
    causal_lm.lm_head.weight = causal_lm.model.embed_tokens.weight  # a tied model
    _patch_like_unsloth(model)
    causal_lm.lm_head.weight = causal_lm.model.embed_tokens.weight  # re-tie the inference-mode copy
    prepare_for_gradients(model)
    assert causal_lm.lm_head.weight is causal_lm.model.embed_tokens.weight
    assert not causal_lm.lm_head.weight.is_inference()

    with torch.inference_mode(), pytest.raises(ModelError, match="inside torch.inference_mode"):
        prepare_for_gradients(model)
