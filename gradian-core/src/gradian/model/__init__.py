"""Models: base-model resolution and loading, the embedded SmolLM2, LoadedModel and LoRA blocks.

Submodules import torch and transformers inside their functions, so importing this package is cheap.
"""
