"""A stand-in for the ``unsloth`` package, put on PYTHONPATH by the unsloth backend's tests.

The real unsloth needs CUDA, so it cannot run on the CPU test machine. This package has the same entry
points with the same signatures (``FastLanguageModel.from_pretrained`` / ``get_peft_model``,
``is_bfloat16_supported``) implemented with plain transformers + peft, so that the worker process's own code
(job file, Trainer, output layout) runs for real. It also records, in the file named by
``FAKE_UNSLOTH_RECORD``, whether transformers was already imported when it was: the worker must import
unsloth first.
"""

from __future__ import annotations

import json
import os
import sys

__version__ = "0.0.0+gradian-test-stand-in"

_RECORD = os.environ.get("FAKE_UNSLOTH_RECORD")
if _RECORD:
    with open(_RECORD, "w", encoding="utf-8") as handle:
        json.dump({"transformers_already_imported": "transformers" in sys.modules,
                   "peft_already_imported": "peft" in sys.modules}, handle)


def is_bfloat16_supported() -> bool:
    """unsloth's check for bf16 support on the current GPU (never, on CPU)."""
    return False


class FastLanguageModel:
    """The two calls of unsloth's FastLanguageModel that gradian's worker makes."""

    @staticmethod
    def from_pretrained(model_name, max_seq_length=2048, dtype=None, load_in_4bit=True, trust_remote_code=False,
                        fix_tokenizer=True, **kwargs):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if load_in_4bit:
            raise ValueError("the stand-in has no 4-bit loading; gradian's worker must ask for load_in_4bit=False")
        model = AutoModelForCausalLM.from_pretrained(model_name, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(model_name, trust_remote_code=trust_remote_code)
        model.max_seq_length = max_seq_length
        return model, tokenizer

    @staticmethod
    def get_peft_model(model, r=16, target_modules=None, lora_alpha=16, lora_dropout=0.0, bias="none",
                       use_gradient_checkpointing="unsloth", random_state=3407, use_rslora=False, **kwargs):
        import torch
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(random_state)
        config = LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, bias=bias,
                            target_modules=target_modules, use_rslora=use_rslora, task_type="CAUSAL_LM")
        peft_model = get_peft_model(model, config)
        peft_model._unsloth_gradient_checkpointing = use_gradient_checkpointing
        return peft_model
