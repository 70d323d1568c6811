"""Gradian: find the training data that broke your LoRA fine-tune.

The heavy public API (``build_index``, ``attribute``, ``LoadedModel``) is imported lazily so that
``import gradian`` and ``gradian --help`` stay fast and never import torch.
"""

from __future__ import annotations

from gradian.hookspecs import hookimpl
from gradian.records import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "build_index": "gradian.index.build:build_index",
    "attribute": "gradian.pipelines.attribute:attribute",
    "LoadedModel": "gradian.model.loaded:LoadedModel",
    "GradianConfig": "gradian.config:GradianConfig",
    "load_config": "gradian.config:load_config",
}

__all__ = ["__version__", "hookimpl", *_LAZY]


__getattr__ = lazy_exports("gradian", _LAZY)
