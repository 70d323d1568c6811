"""What every `gradian train` backend shares: pre-encoded data, LoRA and Trainer arguments, the output layout.

Backends (gradian-trainer-hf, -trl, -unsloth) build on these so that the mask they train with is the mask
attribution uses (``gradian.data.encode``) and so that every backend writes the same directory layout.
Submodules import torch, transformers and peft inside their functions.
"""
