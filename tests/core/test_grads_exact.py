"""Hook-path per-example LoRA gradients equal a plain per-example autograd loop, whatever the batch looks like."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gradian.grads.batch import IGNORE_INDEX, Batch, collate, restrict_labels
from gradian.grads.capture import GradientCapture
from gradian.model.loaded import LoadedModel
from gradian.model.lora_blocks import block_modules
from tests.support.tiny import tiny_llama, tiny_lora

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOLERANCE = 1e-5


def build_loaded(tokenizer, *, r: int = 4, use_rslora: bool = False, dropout: float = 0.0,
                 targets=ALL_PROJECTIONS, seed: int = 0) -> LoadedModel:
    """A tiny random Llama with a LoRA adapter (random B), wrapped for gradients."""
    model = tiny_llama(tokenizer, seed=seed)
    return LoadedModel(tiny_lora(model, r=r, alpha=2.0 * r, targets=targets, use_rslora=use_rslora,
                                 dropout=dropout, seed=seed + 1), tokenizer)


def random_example(generator: torch.Generator, vocab: int, length: int, prompt: int) -> dict[str, list[int]]:
    """Random tokens; the first ``prompt`` are unsupervised (-100), the rest are their own labels."""
    ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]}


def examples(tokenizer, seed: int = 0) -> list[dict[str, list[int]]]:
    """Four examples of different lengths and prompt/answer splits."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(12, 5), (21, 13), (7, 2), (16, 9)]
    return [random_example(generator, len(tokenizer), length, prompt) for length, prompt in shapes]


def reference_gradient(loaded: LoadedModel, capture: GradientCapture, example: dict[str, list[int]],
                       reduction: str) -> torch.Tensor:
    """One example alone through the full model: standard fp32 loss over supervised tokens, .grad of A and B."""
    model = loaded.model
    model.zero_grad(set_to_none=True)
    ids = torch.tensor([example["input_ids"]])
    labels = torch.tensor([example["labels"]])
    logits = model(input_ids=ids).logits.float()[0, :-1]
    targets = labels[0, 1:]
    keep = targets != IGNORE_INDEX
    loss = F.cross_entropy(logits[keep], targets[keep], reduction="sum")
    if reduction == "mean":
        loss = loss / keep.sum()
    loss.backward()
    parts = []
    for block in capture.blocks:
        lora_a, lora_b = block_modules(model, block, loaded.adapter_name)
        parts += [lora_a.weight.grad.flatten(), lora_b.weight.grad.flatten()]
    model.zero_grad(set_to_none=True)
    return torch.cat(parts)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


CONFIGS = {
    "all-r4-sum": dict(module_filter=None, r=4, use_rslora=False, dropout=0.0, reduction="sum"),
    "all-r1-mean": dict(module_filter=None, r=1, use_rslora=False, dropout=0.0, reduction="mean"),
    "all-r8-rslora-dropout-sum": dict(module_filter=None, r=8, use_rslora=True, dropout=0.1, reduction="sum"),
    "down_proj-r4-rslora-mean": dict(module_filter="down_proj", r=4, use_rslora=True, dropout=0.0, reduction="mean"),
    "layer1-r8-dropout-mean": dict(module_filter=r"layers\.1\.", r=8, use_rslora=False, dropout=0.1, reduction="mean"),
    "qv-r1-rslora-dropout-sum": dict(module_filter=r"self_attn\.(q|v)_proj", r=1, use_rslora=True, dropout=0.05,
                                     reduction="sum"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_hook_gradients_equal_per_example_autograd(chatml_tokenizer, name, padding_side):
    config = CONFIGS[name]
    loaded = build_loaded(chatml_tokenizer, r=config["r"], use_rslora=config["use_rslora"], dropout=config["dropout"])
    capture = GradientCapture(loaded, module_filter=config["module_filter"], loss_reduction=config["reduction"])
    # The configuration under test is really the one in the model.
    for block in capture.blocks:
        layer = loaded.model.get_submodule(block.module_name)
        expected_scaling = 2.0 * config["r"] / (config["r"] ** 0.5 if config["use_rslora"] else config["r"])
        assert block.scaling == pytest.approx(expected_scaling)
        assert (layer.lora_dropout["default"].p if config["dropout"] else 0.0) == config["dropout"]
    if config["module_filter"] == "down_proj":
        assert [b.name for b in capture.blocks] == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    if config["module_filter"] == r"layers\.1\.":
        assert len(capture.blocks) == 7 and all(".layers.1." in b.name for b in capture.blocks)

    batch_examples = examples(chatml_tokenizer, seed=len(name))
    gradients = capture.capture(collate(batch_examples, chatml_tokenizer.pad_token_id, padding_side))
    assert gradients.dtype == torch.float32 and gradients.shape == (len(batch_examples), capture.dim)
    for row, example in enumerate(batch_examples):
        want = reference_gradient(loaded, capture, example, config["reduction"])
        assert want.norm() > 0
        assert relative_error(gradients[row], want) < TOLERANCE


def test_batch_composition_and_padding_do_not_change_an_example(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4)
    capture = GradientCapture(loaded, loss_reduction="sum")
    generator = torch.Generator().manual_seed(7)
    vocab = len(chatml_tokenizer)
    target = random_example(generator, vocab, 14, 6)
    longer = random_example(generator, vocab, 25, 10)
    shorter = random_example(generator, vocab, 6, 2)
    pad = chatml_tokenizer.pad_token_id
    want = reference_gradient(loaded, capture, target, "sum")
    layouts = {
        "alone": (collate([target], pad), 0),
        "right": (collate([longer, target, shorter], pad, "right"), 1),
        "left": (collate([longer, target, shorter], pad, "left"), 1),
        "left-first": (collate([target, shorter, longer], pad, "left"), 0),
        "right-last": (collate([shorter, longer, target], pad, "right"), 2),
    }
    got = {}
    for layout, (batch, row) in layouts.items():
        got[layout] = capture.capture(batch)[row]
        assert relative_error(got[layout], want) < TOLERANCE, layout
    for layout in layouts:
        assert relative_error(got[layout], got["alone"]) < TOLERANCE, layout


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_left_padding_is_exact_with_each_attention_kernel(chatml_tokenizer, attention):
    loaded = build_loaded(chatml_tokenizer, r=4)
    loaded.causal_lm.set_attn_implementation(attention)
    assert loaded.causal_lm.config._attn_implementation == attention
    capture = GradientCapture(loaded)
    batch_examples = examples(chatml_tokenizer, seed=3)
    gradients = capture.capture(collate(batch_examples, chatml_tokenizer.pad_token_id, "left"))
    assert torch.isfinite(gradients).all()
    for row, example in enumerate(batch_examples):
        assert relative_error(gradients[row], reference_gradient(loaded, capture, example, "sum")) < TOLERANCE


def test_encoded_chat_examples_from_the_dataset_layer(chatml_tokenizer):
    from gradian.data.encode import encode
    from gradian.data.examples import Message, make_example

    rows = [
        [("user", "What is the capital of France?"), ("assistant", "The capital of France is Paris.")],
        [("system", "Be polite."), ("user", "Rewrite this sentence politely, please."), ("assistant", "Yes.")],
        [("user", "Hello! How are you?"), ("assistant", "I am fine, thank you."), ("user", "Two plus two?"),
         ("assistant", "Two plus two is four.")],
    ]
    encoded = [encode(make_example(i, messages=[Message(role, text) for role, text in row]), chatml_tokenizer, 128)
               for i, row in enumerate(rows)]
    loaded = build_loaded(chatml_tokenizer, r=4)
    capture = GradientCapture(loaded, loss_reduction="mean")
    gradients = capture.capture(collate(encoded, chatml_tokenizer.pad_token_id, "right"))
    for row, item in enumerate(encoded):
        example = {"input_ids": list(item.input_ids), "labels": list(item.labels)}
        assert relative_error(gradients[row], reference_gradient(loaded, capture, example, "mean")) < TOLERANCE


def test_lm_head_sees_only_supervised_rows(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4)
    capture = GradientCapture(loaded)
    batch = collate(examples(chatml_tokenizer), chatml_tokenizer.pad_token_id, "right")
    shapes = []
    handle = loaded.causal_lm.lm_head.register_forward_hook(lambda m, a, out: shapes.append(tuple(out.shape)))
    try:
        result = capture.capture_full(batch)
    finally:
        handle.remove()
    supervised = int((batch.labels[:, 1:] != IGNORE_INDEX).sum())
    assert shapes == [(supervised, len(chatml_tokenizer))]
    assert result.logit_rows == supervised < batch.input_ids.numel()
    assert result.token_counts.tolist() == [7, 8, 5, 7]


def test_lora_on_the_lm_head_is_captured_exactly(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4, targets=("down_proj", "lm_head"))
    capture = GradientCapture(loaded)
    assert [b.name for b in capture.blocks][-1] == "lm_head"
    batch_examples = examples(chatml_tokenizer, seed=5)
    gradients = capture.capture(collate(batch_examples, chatml_tokenizer.pad_token_id, "left"))
    for row, example in enumerate(batch_examples):
        assert relative_error(gradients[row], reference_gradient(loaded, capture, example, "sum")) < TOLERANCE


def test_examples_without_supervised_tokens_give_zero_gradients(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4)
    capture = GradientCapture(loaded, loss_reduction="mean")
    generator = torch.Generator().manual_seed(11)
    vocab = len(chatml_tokenizer)
    first, second = random_example(generator, vocab, 10, 4), random_example(generator, vocab, 13, 8)
    empty = {"input_ids": random_example(generator, vocab, 9, 0)["input_ids"], "labels": [IGNORE_INDEX] * 9}
    only_first = {"input_ids": [5, 6, 7], "labels": [5, IGNORE_INDEX, IGNORE_INDEX]}  # position 0 is never predicted
    result = capture.capture_full(collate([first, empty, second, only_first], chatml_tokenizer.pad_token_id))
    assert torch.isfinite(result.gradients).all()
    assert result.gradients[1].abs().max() == 0 and result.gradients[3].abs().max() == 0
    assert result.losses[1] == 0 and result.token_counts[1] == 0
    assert relative_error(result.gradients[0], reference_gradient(loaded, capture, first, "mean")) < TOLERANCE
    assert relative_error(result.gradients[2], reference_gradient(loaded, capture, second, "mean")) < TOLERANCE

    calls = []
    handle = loaded.causal_lm.lm_head.register_forward_hook(lambda *args: calls.append(1))
    try:
        nothing = capture.capture_full(collate([empty, only_first], chatml_tokenizer.pad_token_id))
    finally:
        handle.remove()
    assert calls == [] and nothing.logit_rows == 0
    assert nothing.gradients.shape == (2, capture.dim) and not nothing.gradients.any()


def test_span_gradients_are_gradients_of_the_restricted_loss_and_add_up(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4)
    capture = GradientCapture(loaded, loss_reduction="sum")
    example = random_example(torch.Generator().manual_seed(2), len(chatml_tokenizer), 20, 6)
    batch = collate([example], chatml_tokenizer.pad_token_id)
    positions = torch.arange(batch.labels.shape[1])
    spans = [(6, 11), (11, 16), (16, 20)]
    span_batches = [batch.with_labels(restrict_labels(batch.labels, ((positions >= s) & (positions < e))[None]))
                    for s, e in spans]
    span_gradients = torch.cat([capture.capture(b) for b in span_batches])
    whole = capture.capture(batch)[0]
    assert relative_error(span_gradients.sum(0), whole) < TOLERANCE
    for span_batch, gradient in zip(span_batches, span_gradients, strict=True):
        restricted = {"input_ids": example["input_ids"], "labels": span_batch.labels[0].tolist()}
        assert relative_error(gradient, reference_gradient(loaded, capture, restricted, "sum")) < TOLERANCE


def test_only_lora_requires_grad_and_capture_changes_nothing(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4, dropout=0.1)
    trainable = loaded.trainable_parameter_names()
    assert trainable and all(".lora_A.default." in n or ".lora_B.default." in n for n in trainable)
    assert len(trainable) == 2 * len(loaded.blocks())
    assert not loaded.model.training
    before = {name: value.clone() for name, value in loaded.model.state_dict().items()}
    capture = GradientCapture(loaded)
    batch = collate(examples(chatml_tokenizer), chatml_tokenizer.pad_token_id)
    first = capture.capture(batch)
    second = capture.capture(batch)
    assert torch.equal(first, second)  # eval mode: configured dropout is inactive, capture is deterministic
    after = loaded.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(param.grad is None for param in loaded.model.parameters())


def test_capture_accepts_a_mapping_of_tensors(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4)
    capture = GradientCapture(loaded)
    batch = collate(examples(chatml_tokenizer), chatml_tokenizer.pad_token_id)
    as_mapping = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "labels": batch.labels}
    assert torch.equal(capture.capture(as_mapping), capture.capture(batch))
    assert isinstance(batch, Batch) and batch.size == 4


def test_layout_covers_the_vector_in_block_order(chatml_tokenizer):
    loaded = build_loaded(chatml_tokenizer, r=4, targets=("q_proj", "down_proj"))
    capture = GradientCapture(loaded)
    layout = capture.block_layout
    assert [(e.block, e.matrix) for e in layout] == [
        (b.name, m) for b in capture.blocks for m in ("A", "B")
    ]
    assert layout[0].offset == 0
    assert all(a.offset + a.size == b.offset for a, b in zip(layout, layout[1:], strict=False))
    assert layout[-1].offset + layout[-1].size == capture.dim == sum(b.size for b in capture.blocks)
    down = next(b for b in capture.blocks if b.name.endswith("down_proj"))
    assert (down.r, down.d_in, down.d_out) == (4, 64, 32)
    spec = capture.spec()
    assert spec["projection"] is None and spec["dim"] == capture.dim and spec["loss_reduction"] == "sum"


def test_collate_pads_each_side_and_rejects_bad_rows():
    rows = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": (4,), "labels": (4,)}]
    right = collate(rows, pad_id=0, padding_side="right")
    left = collate(rows, pad_id=0, padding_side="left")
    assert right.input_ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert right.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert left.input_ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert left.labels.tolist() == [[-100, 2, 3], [-100, -100, 4]]
    assert left.position_ids().tolist() == [[0, 1, 2], [0, 0, 0]]
    with pytest.raises(ValueError, match="labels"):
        collate([{"input_ids": [1, 2], "labels": [1]}], pad_id=0)
    with pytest.raises(ValueError, match="padding_side"):
        collate(rows, pad_id=0, padding_side="middle")


def test_bfloat16_base_model_gives_float32_gradients_close_to_autograd(chatml_tokenizer):
    model = tiny_llama(chatml_tokenizer).to(torch.bfloat16)
    loaded = LoadedModel(tiny_lora(model, r=4), chatml_tokenizer)  # peft keeps the adapter in fp32
    capture = GradientCapture(loaded)
    batch_examples = examples(chatml_tokenizer)
    gradients = capture.capture(collate(batch_examples, chatml_tokenizer.pad_token_id, "left"))
    assert gradients.dtype == torch.float32 and torch.isfinite(gradients).all()
    for row, example in enumerate(batch_examples):
        # bf16 activations round differently in a batch than alone: close, not bit-equal.
        assert relative_error(gradients[row], reference_gradient(loaded, capture, example, "sum").float()) < 2e-2


def test_capture_refuses_inference_mode(chatml_tokenizer):
    capture = GradientCapture(build_loaded(chatml_tokenizer, r=2))
    batch = collate(examples(chatml_tokenizer), chatml_tokenizer.pad_token_id)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="inference_mode"):
        capture.capture(batch)
