"""The tokenizer diagnose reads, loaded without torch when the model's tokenizer allows it.

diagnose needs only a tokenizer (never the model), and ``AutoTokenizer`` imports torch, which costs
seconds of a command meant to take seconds. When a model's ``tokenizer_config.json`` names the generic
fast tokenizer class (``TokenizersBackend`` / ``PreTrainedTokenizerFast``: the class AutoTokenizer
would pick for it anyway) with no custom code, that class is loaded directly; any other tokenizer goes
through :func:`gradian.model.base.load_tokenizer`. Either way the pad token is guaranteed the same way.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gradian.model.base import ensure_pad_token, load_tokenizer, resolve_base_model

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GENERIC_FAST_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_audit_tokenizer(name: str, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The base model's tokenizer, as load_tokenizer gives it, importing torch only when it must."""
    path = resolve_base_model(name)
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    generic = (isinstance(config, dict) and config.get("tokenizer_class") in GENERIC_FAST_CLASSES
               and "auto_map" not in config and (path / "tokenizer.json").is_file())
    if generic:
        try:
            from transformers.tokenization_utils_tokenizers import TokenizersBackend
        except ImportError:  # transformers 4.x: no torch-free generic class to load directly
            generic = False
    if not generic:
        return load_tokenizer(name, trust_remote_code=trust_remote_code)
    try:
        tokenizer = TokenizersBackend.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return load_tokenizer(name, trust_remote_code=trust_remote_code)  # let the full loader explain the failure
    ensure_pad_token(tokenizer, source=str(path))
    return tokenizer
