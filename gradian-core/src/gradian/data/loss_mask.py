"""Which tokens the loss covers (``grads.loss_mask``), and how ``auto`` follows the run that trained the adapter.

Modes (what ``encode(..., loss_mask=...)`` supervises in a conversation; plain text rows are all tokens in each):

- ``assistant``: every supervised assistant turn, content through its end-of-turn marker (TRL's
  ``assistant_only_loss``, axolotl ``train_on_inputs: false`` on chat data, LLaMA-Factory ``train_on_prompt: false``,
  ``gradian train``). The default, and what Gradian always used before ``auto``.
- ``completion``: every token after the rendered prompt (the messages before the last assistant turn with the
  generation prompt), template text after the answer included (TRL's ``completion_only_loss`` on prompt/completion
  data).
- ``all``: every token of the rendered conversation (TRL's default on ``messages`` data, axolotl
  ``train_on_inputs: true``, LLaMA-Factory ``train_on_prompt: true``).

``auto`` takes the mode from the run's config (``RunConfig.loss_mask`` and the trainer); without a run, or when the
run does not say, it is ``assistant``.

``grads.string_pairs`` says how a prompt/completion row of two plain strings is rendered: ``template`` (a user and an
assistant turn through the chat template, as ``gradian train`` trains them) or ``raw`` (prompt + completion + EOS with
no template, as TRL's SFTTrainer does); ``auto`` is ``raw`` for a TRL or unsloth run, else ``template``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gradian.config import GradsConfig
    from gradian.records import RunConfig

LOSS_MASKS: tuple[str, ...] = ("assistant", "completion", "all")
PAIR_RENDERINGS: tuple[str, ...] = ("template", "raw")
SETTINGS: tuple[str, ...] = ("auto", *LOSS_MASKS)
DEFAULT_LOSS_MASK = "assistant"
# TRL decides per dataset: completion_only_loss (None by default) masks the prompt of prompt/completion rows only.
TRL_FRAMEWORKS = frozenset({"trl", "unsloth"})


@dataclass(frozen=True)
class LossMaskChoice:
    """The mask attribution uses, and why (``source``: the file the run's setting came from, when there is one)."""

    mode: str
    reason: str
    source: str | None = None


def mask_of_run(run_config: RunConfig | None, formats: Iterable[str]) -> tuple[str | None, str]:
    """The mask a run trained with (None when its config does not say) and the setting that says so."""
    framework = getattr(run_config, "framework", None)
    recorded = getattr(run_config, "loss_mask", None)
    if recorded == "assistant_only":
        return "assistant", "the run's loss mask is assistant turns only"
    if recorded == "all":
        return "all", "the run's loss covers every token (train_on_inputs / train_on_prompt / completion_only_loss false)"
    if framework in TRL_FRAMEWORKS and recorded in (None, "completion_only"):
        kinds = set(formats)
        if kinds and kinds <= {"prompt_completion"}:
            return "completion", "TRL masks the prompt of prompt/completion data (completion_only_loss)"
        return "all", "TRL trains on every token of messages data unless assistant_only_loss is set"
    if recorded == "completion_only":
        return "assistant", f"{framework or 'the trainer'} trains on the responses only (train_on_inputs / train_on_prompt false)"
    return None, "the run's config does not say which tokens the loss covers"


def resolve_loss_mask(setting: str, run_config: RunConfig | None = None, formats: Iterable[str] = (),
                      source: str | None = None) -> LossMaskChoice:
    """The concrete mask for ``grads.loss_mask`` (``auto`` follows ``run_config``; None when there is no run)."""
    if setting != "auto":
        return LossMaskChoice(setting, f"grads.loss_mask is {setting}")
    if run_config is None:
        return LossMaskChoice(DEFAULT_LOSS_MASK, "no training run found: assistant turns (the default)")
    mode, reason = mask_of_run(run_config, formats)
    if mode is None:
        return LossMaskChoice(DEFAULT_LOSS_MASK, reason + "; assistant turns (the default)", source)
    return LossMaskChoice(mode, reason, source)


def concrete_loss_mask(grads: GradsConfig) -> str:
    """grads.loss_mask as encode() takes it: ``auto`` left unresolved (no run to follow) is the default mask."""
    mode = getattr(grads, "loss_mask", "assistant")
    return "assistant" if mode == "auto" else mode


def resolve_pair_rendering(setting: str, run_config: RunConfig | None = None) -> str:
    """The concrete ``grads.string_pairs``: ``auto`` is ``raw`` after a TRL or unsloth run (TRL tokenizes string
    prompt/completion rows as prompt + completion + EOS, no template), else ``template`` (gradian train's rendering)."""
    if setting != "auto":
        return setting
    return "raw" if getattr(run_config, "framework", None) in TRL_FRAMEWORKS else "template"


def concrete_encoding(grads: GradsConfig) -> dict[str, str]:
    """encode()'s ``loss_mask`` and ``pairs`` from a grads section, ``auto`` left unresolved taken as the default."""
    return {"loss_mask": concrete_loss_mask(grads), "pairs": concrete_pair_rendering(grads)}


def concrete_pair_rendering(grads: GradsConfig) -> str:
    """grads.string_pairs as encode() takes it: ``auto`` left unresolved (no run to follow) is ``template``."""
    mode = getattr(grads, "string_pairs", "template")
    return "template" if mode == "auto" else mode
