"""diagnose's tokenizer: the same tokenizer load_tokenizer gives, without importing torch when it can."""

from __future__ import annotations

import json
import subprocess
import sys

from gradian.diagnose.tokenizer import load_audit_tokenizer
from gradian.model.base import load_tokenizer

SAMPLES = ["The capital of France is Paris.", "<|im_start|>user\nhi<|im_end|>\n", "  spaces\tand\nnewlines  "]


def test_same_tokenizer_as_load_tokenizer(tiny_base_dir):
    light, full = load_audit_tokenizer(str(tiny_base_dir)), load_tokenizer(str(tiny_base_dir))
    assert type(light) is type(full)
    assert (light.bos_token, light.eos_token, light.pad_token, len(light)) == (full.bos_token, full.eos_token, full.pad_token, len(full))
    assert light.chat_template == full.chat_template
    for text in SAMPLES:
        for special in (True, False):
            assert light(text, add_special_tokens=special)["input_ids"] == full(text, add_special_tokens=special)["input_ids"]
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Paris."}]
    assert light.apply_chat_template(conversation, tokenize=False) == full.apply_chat_template(conversation, tokenize=False)


def test_generic_tokenizers_load_without_torch(tiny_base_dir):
    code = (f"import sys; from gradian.diagnose.tokenizer import load_audit_tokenizer; load_audit_tokenizer({str(tiny_base_dir)!r}); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_other_tokenizer_classes_go_through_load_tokenizer(tiny_base_dir, tmp_path):
    import shutil

    model = shutil.copytree(tiny_base_dir, tmp_path / "model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"  # a class AutoTokenizer resolves itself
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_audit_tokenizer(str(model))
    assert type(tokenizer).__name__ == "GPT2Tokenizer"  # AutoTokenizer's choice, not the generic class
    assert type(tokenizer) is type(load_tokenizer(str(model)))
