"""The file names peft and transformers.Trainer write into adapter and run dirs, named once for every reader."""

from __future__ import annotations

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"  # torch.save: read only with --allow-pickle
TRAINER_STATE = "trainer_state.json"
TRAINING_ARGS = "training_args.bin"
