"""Greedy, batched, deterministic generation from already-encoded prompts."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# End-of-turn markers of the common chat templates; generation stops at any of them that the tokenizer knows.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>", "<|end|>", "</s>")

Progress = Callable[[str, int, int], None]


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module | None = None) -> list[int]:
    """Token ids that end a generated answer: eos of the tokenizer and model, plus known end-of-turn tokens."""
    ids: list[int] = []

    def add(value: int | list[int] | tuple[int, ...] | None) -> None:
        for token_id in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token_id, int) and token_id >= 0 and token_id not in ids:
                ids.append(token_id)

    add(tokenizer.eos_token_id)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        add(generation_config.eos_token_id)
    vocab = tokenizer.get_vocab()
    for token in END_OF_TURN_TOKENS:
        if token in vocab:
            add(vocab[token])
    return ids


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id used for padding: the tokenizer's pad token, else its eos token."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the tokenizer has neither a pad token nor an eos token to pad with")
    return int(pad)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Put the model in eval mode for the block and restore its previous train/eval state afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (where inputs must go)."""
    return next(model.parameters()).device


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded input ids and the matching attention mask, as long tensors."""
    import torch

    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            input_ids[i, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
            attention_mask[i, width - len(row):] = 1
    return input_ids, attention_mask


def greedy_generate(model: PreTrainedModel | PeftModel, tokenizer: PreTrainedTokenizerBase,
                    prompts: Sequence[Sequence[int]], *, max_new_tokens: int, batch_size: int = 8,
                    progress: Progress | None = None, stage: str = "generate") -> list[str]:
    """Greedy continuations of encoded prompts, cut at eos / end-of-turn, decoded without special tokens."""
    import torch
    from transformers import GenerationConfig

    if any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("greedy_generate got an empty prompt")
    stops = stop_token_ids(tokenizer, model)
    pad_id = pad_token_id(tokenizer)
    generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, eos_token_id=stops or None,
        pad_token_id=pad_id, bos_token_id=tokenizer.bos_token_id,
    )
    device = model_device(model)
    outputs: list[str] = []
    with eval_mode(model), torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start:start + batch_size]
            input_ids, attention_mask = left_pad(batch, pad_id)
            generated = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                generation_config=generation_config,
            )
            for row in generated[:, input_ids.shape[1]:].tolist():
                outputs.append(_decode_until_stop(tokenizer, row, stops))
            if progress is not None:
                progress(stage, len(outputs), len(prompts))
    return outputs


def _decode_until_stop(tokenizer: PreTrainedTokenizerBase, token_ids: list[int], stops: list[int]) -> str:
    """Decode the tokens before the first stop token, with special tokens stripped."""
    stop_set = set(stops)
    cut = next((i for i, token_id in enumerate(token_ids) if token_id in stop_set), len(token_ids))
    return tokenizer.decode(token_ids[:cut], skip_special_tokens=True).strip()
