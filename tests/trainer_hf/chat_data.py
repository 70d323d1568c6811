"""A small chat dataset written in code, shared by the trainer tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_chat_dataset(path: Path, n: int = 12) -> Path:
    """Write ``n`` two-turn arithmetic conversations as messages-format JSONL."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} plus {i}?"},
                {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
            ],
            "source": "arithmetic" if i % 2 else "facts",
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# Small and quick: a few optimizer steps on the tiny model.
QUICK = ("train.max_steps=3", "train.batch_size=4", "train.lora_r=4", "train.target_modules=q_proj,v_proj")
