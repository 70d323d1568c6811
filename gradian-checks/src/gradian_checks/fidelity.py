"""Fidelity checks (family config): does Gradian render and mask the data the way the run trained on it?

Attribution captures the gradients of the loss Gradian computes; when the prompt format or the loss mask differs
from the run's, those are not the gradients the run produced.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gradian.records import Evidence
from gradian_checks.registry import CheckFamily, Hit, config_evidence

family = CheckFamily("config")

# Text a rendering with each named template always contains (axolotl chat_template:, LLaMA-Factory template:).
TEMPLATE_MARKERS: dict[str, str] = {
    "chatml": "<|im_start|>", "qwen": "<|im_start|>", "qwen2": "<|im_start|>", "qwen2_5": "<|im_start|>",
    "qwen3": "<|im_start|>", "llama3": "<|start_header_id|>", "llama3_2": "<|start_header_id|>",
    "mistral": "[INST]", "mistral_v1": "[INST]", "llama2": "[INST]", "gemma": "<start_of_turn>",
    "gemma3": "<start_of_turn>", "phi_3": "<|user|>", "phi3": "<|user|>", "zephyr": "<|user|>",
    "alpaca": "### Instruction", "vicuna": "USER:", "cohere": "<|START_OF_TURN_TOKEN|>", "deepseek3": "<｜User｜>",
}
# Names meaning "whatever the tokenizer has": nothing to compare.
TOKENIZER_DEFAULT = frozenset({"tokenizer_default", "tokenizer_default_fallback_chatml", "default", "empty", "jinja"})
# axolotl dataset types rendered by a chat template; any other (alpaca, completion...) is its own prompt format.
CHAT_DATASET_TYPES = frozenset({"chat_template", "sharegpt", "messages"})


def _first_difference(ours: str, theirs: str) -> str:
    """The first line where two templates differ, shortened, for the evidence."""
    for a, b in zip(ours.splitlines() or [""], theirs.splitlines() or [""], strict=False):
        if a != b:
            return f"{b[:60]!r} (run) vs {a[:60]!r} (base)"
    return f"{len(theirs)} characters (run) vs {len(ours)} (base)"


def _saved_template_hit(ctx: Any) -> Hit | None:
    """The run saved a chat template other than the base model's: every other tool must be told to use it."""
    from gradian.runs.training_format import find_saved_template

    saved = find_saved_template(ctx.training_dirs())
    base = ctx.base_template()
    if saved is None or saved[0] == base:
        return None
    template, path = saved
    what = "has no chat template" if base is None else "has another chat template"
    return Hit(f"the run trained with the chat template saved in {path.parent.name}/{path.name}; the base model {what}. "
               "Gradian renders with the run's; anything given the base tokenizer (serving, eval) prompts differently",
               (Evidence(f"first difference: {_first_difference(base or '', template)}", location=str(path)),),
               fix="serve and evaluate with the tokenizer saved next to the adapter, not the base model's")


def _named_template_hit(ctx: Any) -> Hit | None:
    """The run's config names a template the tokenizer Gradian renders with does not produce."""
    name = ctx.run.config.chat_template
    marker = TEMPLATE_MARKERS.get(str(name).lower()) if name else None
    if marker is None or str(name).lower() in TOKENIZER_DEFAULT:
        return None
    template = getattr(ctx.tokenizer, "chat_template", None) or ""
    if marker in template:
        return None
    ours = "no chat template (the plain User:/Assistant: format)" if not template else "a template without it"
    return Hit(f"the run formatted prompts with the {name!r} template ({marker} turns), but the tokenizer Gradian "
               f"renders with has {ours}",
               (config_evidence(ctx, "chat_template", f"template = {name}", chat_template=name),),
               fix=f"save a tokenizer with the run's {name!r} template next to the adapter "
                   "(tokenizer.save_pretrained(adapter_dir)); Gradian renders with it")


def _dataset_type_hit(ctx: Any) -> Hit | None:
    """axolotl built prompts with a non-chat prompt format (alpaca...), which Gradian does not reproduce."""
    kind = ctx.run.config.dataset_type
    if not kind or kind.split(".")[0] in CHAT_DATASET_TYPES:
        return None
    return Hit(f"axolotl formatted the rows with its {kind!r} prompt format; Gradian renders them with the chat "
               "template, so the tokens it attributes are not the tokens the run trained on",
               (config_evidence(ctx, "dataset_type", f"datasets[0].type = {kind}", dataset_type=kind),),
               fix="train with type: chat_template, or convert the data to the exact rendered text ('text' rows)")


@family.check(
    "template_mismatch", "warning",
    "the run trained with another prompt format than the base model's chat template (a saved template, axolotl "
    "chat_template / type, LLaMA-Factory template)",
    "give Gradian (and every tool after training) the run's tokenizer and chat template",
    needs={"run_config", "tokenizer"},
)
def template_mismatch(ctx: Any) -> Iterator[Hit]:
    """The chat template or prompt format differs between the run and what Gradian renders with."""
    for hit in (_saved_template_hit(ctx), _named_template_hit(ctx), _dataset_type_hit(ctx)):
        if hit is not None:
            yield hit


@family.check(
    "loss_mask_mismatch", "warning",
    "the run's loss covered other tokens than the mask attribution uses (grads.loss_mask) or gradian train retrains with",
    "set grads.loss_mask: auto (follow the run) or the run's mask",
    needs={"run_config", "dataset"},
)
def loss_mask_mismatch(ctx: Any) -> Iterator[Hit]:
    """The run's loss mask against grads.loss_mask and against the assistant-turn mask of a plain gradian train."""
    from gradian.data.loss_mask import DEFAULT_LOSS_MASK, mask_of_run, resolve_loss_mask
    from gradian.runs.training_format import run_formats

    formats = run_formats(ctx.examples)
    trained, why = mask_of_run(ctx.run.config, formats)
    if trained is None:
        return
    setting = ctx.config.grads.loss_mask
    used = resolve_loss_mask(setting, ctx.run.config, formats).mode
    evidence = (config_evidence(ctx, "loss_mask", f"{why}: {trained}", run_mask=trained, attribution_mask=used),)
    if used != trained:
        yield Hit(f"the run's loss covered {_tokens(trained)}, but grads.loss_mask={setting} attributes {_tokens(used)}: "
                  "the captured gradients are not the run's", evidence)
    elif trained != DEFAULT_LOSS_MASK:
        yield Hit(f"the run's loss covered {_tokens(trained)}; attribution follows it (grads.loss_mask={setting} -> "
                  f"{used}) and so does verify's retraining, but a plain gradian train of this data trains on "
                  f"assistant turns only unless grads.loss_mask={trained} is set",
                  evidence, severity="info",
                  fix=f"pass --set grads.loss_mask={trained} to gradian train, or retrain with the run's own trainer")


def _tokens(mask: str) -> str:
    """A mask in words."""
    return {"assistant": "assistant turns only", "completion": "every token after the prompt",
            "all": "every token, prompts included"}[mask]
CHECKS = tuple(family.checks)
