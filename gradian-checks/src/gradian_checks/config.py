"""Config checks: the run's hyperparameters against what works for LoRA (docs/checks.md, "Config")."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gradian.file_names import ADAPTER_CONFIG, TRAINER_STATE
from gradian.records import Evidence
from gradian_checks.registry import CheckFamily, Hit, config_evidence

family = CheckFamily("config")

ATTENTION_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "query", "key", "value", "q", "k", "v", "o",
                               "query_key_value", "c_attn", "qkv_proj", "wqkv", "out_proj", "dense"})
DECAYING_SCHEDULES = frozenset({"linear", "cosine", "cosine_with_restarts", "polynomial", "inverse_sqrt",
                                "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay"})
ISOLATING_PACKING = frozenset({"bfd", "ffd", "neat_packing"})
EMBEDDING_MODULES = ("embed_tokens", "lm_head", "wte", "embed_out", "word_embeddings")


def is_lora(cfg: Any) -> bool:
    """Whether the run trained a LoRA adapter (unknown counts as LoRA: that is what Gradian debugs)."""
    return cfg.finetuning_type in (None, "lora", "qlora")


@family.check(
    "lr_too_high_for_lora", "warning",
    "learning rate for a LoRA run above 5e-4 (error at 1e-3 or more)",
    "use 1e-4 to 2e-4 for LoRA",
    needs={"run_config"},
)
def lr_too_high_for_lora(ctx: Any) -> Iterator[Hit]:
    """A LoRA learning rate past the warning / error thresholds."""
    cfg, t = ctx.run.config, ctx.config.diagnose
    if cfg.learning_rate is None or not is_lora(cfg) or cfg.learning_rate <= t.lr_warn:
        return
    severity = "error" if cfg.learning_rate >= t.lr_error else None
    yield Hit(f"learning rate {cfg.learning_rate:g} is high for LoRA (warn above {t.lr_warn:g}, error at {t.lr_error:g})",
              (config_evidence(ctx, "learning_rate", f"learning_rate = {cfg.learning_rate:g}", learning_rate=cfg.learning_rate),),
              severity)


@family.check(
    "lr_too_low_for_lora", "warning",
    "LoRA learning rate at or below 2e-5 (the full fine-tune default)",
    "LoRA needs about 10x the full fine-tune learning rate: use 1e-4 to 2e-4",
    needs={"run_config"},
)
def lr_too_low_for_lora(ctx: Any) -> Iterator[Hit]:
    """A LoRA learning rate copied from a full fine-tune recipe."""
    cfg = ctx.run.config
    if cfg.learning_rate is not None and is_lora(cfg) and cfg.learning_rate <= ctx.config.diagnose.lr_low:
        yield Hit(f"learning rate {cfg.learning_rate:g} is a full fine-tune rate; LoRA barely moves at it",
                  (config_evidence(ctx, "learning_rate", f"learning_rate = {cfg.learning_rate:g}", learning_rate=cfg.learning_rate),))


def _targets(ctx: Any) -> tuple[tuple[str, ...] | None, str]:
    cfg = ctx.run.config
    if cfg.lora_target_modules:
        return cfg.lora_target_modules, "lora_target_modules"
    if ctx.adapter is not None and ctx.adapter.config.get("target_modules"):
        targets = ctx.adapter.config["target_modules"]
        return (tuple(targets) if not isinstance(targets, str) else (targets,)), "adapter"
    return None, ""


@family.check(
    "attention_only_targets", "warning",
    "LoRA target modules are a subset of q/k/v/o (peft's llama default is q,v)",
    "target every linear layer (target_modules='all-linear', or add gate_proj/up_proj/down_proj): "
    "attention-only LoRA learns much less",
    needs={"run_config"},
)
def attention_only_targets(ctx: Any) -> Iterator[Hit]:
    """LoRA applied to attention projections only."""
    targets, field = _targets(ctx)
    if not targets or not is_lora(ctx.run.config) or any("linear" in t or "*" in t or "(" in t for t in targets):
        return
    names = {t.rsplit(".", 1)[-1].lower() for t in targets}
    if names <= ATTENTION_MODULES:
        location = ctx.adapter.path.as_posix() + "/adapter_config.json" if field == "adapter" else ctx.config_location(field)
        yield Hit(f"LoRA targets only attention projections ({', '.join(sorted(targets))})",
                  (Evidence(f"target_modules = {sorted(targets)}", location=location, values={"targets": sorted(targets)}),))


@family.check(
    "alpha_rank_extreme", "info",
    "effective LoRA scale alpha/r (alpha/sqrt(r) with rsLoRA) above 4 or below 0.25",
    "set lora_alpha to r or 2r (or use rsLoRA for large ranks)",
    needs={"run_config"},
)
def alpha_rank_extreme(ctx: Any) -> Iterator[Hit]:
    """An alpha/r scale far from the usual 1-2."""
    cfg, t = ctx.run.config, ctx.config.diagnose
    if not cfg.lora_r or cfg.lora_alpha is None:
        return
    scale = cfg.lora_alpha / (math.sqrt(cfg.lora_r) if cfg.use_rslora else cfg.lora_r)
    if scale > t.alpha_rank_max or scale < t.alpha_rank_min:
        formula = "alpha/sqrt(r)" if cfg.use_rslora else "alpha/r"
        yield Hit(f"LoRA scale {formula} = {cfg.lora_alpha:g}/{'sqrt(' if cfg.use_rslora else ''}{cfg.lora_r}"
                  f"{')' if cfg.use_rslora else ''} = {scale:.3g}, outside [{t.alpha_rank_min:g}, {t.alpha_rank_max:g}]",
                  (config_evidence(ctx, "lora_alpha", f"r = {cfg.lora_r}, lora_alpha = {cfg.lora_alpha:g}",
                                   scale=scale),))


def planned_epochs(ctx: Any) -> tuple[float | None, str]:
    """Epochs the run was set to train: max_steps x (epochs per step as logged), else num_epochs."""
    cfg = ctx.run.config
    logged = [p for p in ctx.run.metrics if p.epoch is not None and p.step > 0]
    if cfg.max_steps and logged:
        last = logged[-1]
        return cfg.max_steps * last.epoch / last.step, f"max_steps {cfg.max_steps} at {last.epoch / last.step:.3g} epochs/step"
    if cfg.num_epochs is not None:
        return cfg.num_epochs, "num_epochs"
    if logged:
        return logged[-1].epoch, "last logged epoch"
    return None, ""


@family.check(
    "too_many_epochs", "warning",
    "more than 3 epochs (error at 5 or more on fewer than 1k rows)",
    "train 1-3 epochs; more passes over a small dataset memorize it",
    needs={"run_config"},
)
def too_many_epochs(ctx: Any) -> Iterator[Hit]:
    """Too many passes over the data for its size."""
    t = ctx.config.diagnose
    epochs, how = planned_epochs(ctx)
    if epochs is None or epochs <= t.epochs_warn + 1e-9:
        return
    rows = len(ctx.examples) if ctx.dataset is not None else None
    small = rows is not None and rows < t.epochs_error_max_rows
    severity = "error" if small and epochs >= t.epochs_error else None
    size = f" on {rows} rows" if rows is not None else ""
    yield Hit(f"{epochs:.3g} epochs{size} ({how})",
              (config_evidence(ctx, "num_epochs", f"{epochs:.3g} epochs{size}", epochs=epochs, rows=rows),), severity)


def total_steps(ctx: Any) -> int | None:
    """The run's planned optimizer steps (max_steps, else the logged global step)."""
    return ctx.run.config.max_steps or ctx.run.global_step


@family.check(
    "no_warmup", "info",
    "warmup_steps = 0 and warmup_ratio = 0",
    "warm up for about 3% of the steps (warmup_ratio 0.03)",
    needs={"run_config"},
)
def no_warmup(ctx: Any) -> Iterator[Hit]:
    """A schedule that starts at the peak learning rate."""
    cfg = ctx.run.config
    known = [v for v in (cfg.warmup_steps, cfg.warmup_ratio) if v is not None]
    if known and all(v == 0 for v in known):
        yield Hit("no learning-rate warmup", (config_evidence(ctx, "warmup_steps" if cfg.warmup_steps is not None else "warmup_ratio",
                                                              "warmup_steps = 0, warmup_ratio = 0"),))


@family.check(
    "warmup_dominates", "warning",
    "warmup is 30% or more of the total steps",
    "cut warmup to about 3-10% of the steps",
    needs={"run_config"},
)
def warmup_dominates(ctx: Any) -> Iterator[Hit]:
    """A warmup so long the run barely trains at the peak rate."""
    cfg = ctx.run.config
    total = total_steps(ctx)
    if not total:
        return
    warmup = cfg.warmup_steps if cfg.warmup_steps else (cfg.warmup_ratio or 0) * total
    if warmup / total >= ctx.config.diagnose.warmup_max_fraction:
        field = "warmup_steps" if cfg.warmup_steps else "warmup_ratio"
        yield Hit(f"warmup takes {warmup:g} of {total} steps ({warmup / total:.0%})",
                  (config_evidence(ctx, field, f"{field} = {getattr(cfg, field):g}, total steps {total}",
                                   fraction=warmup / total),))


@family.check(
    "no_eval_split", "info",
    "no evaluation during training (eval_strategy 'no', val_set_size 0)",
    "hold out a few percent of the data and evaluate periodically (eval_strategy 'steps'), so over-fitting shows",
    needs={"run_config"},
)
def no_eval_split(ctx: Any) -> Iterator[Hit]:
    """A run that never measured held-out loss."""
    cfg = ctx.run.config
    if ctx.eval_points():
        return
    if cfg.eval_strategy == "no" or cfg.val_set_size == 0:
        field = "eval_strategy" if cfg.eval_strategy == "no" else "val_set_size"
        yield Hit("the run never evaluated on held-out data", (config_evidence(ctx, field, f"{field} = {getattr(cfg, field)!r}"),))
    elif cfg.eval_strategy is None and ctx.train_points():
        yield Hit("the logs hold no eval_loss: the run never evaluated on held-out data",
                  (Evidence("no eval_loss in the logs", location=ctx.run.sources.get("metrics")),))


@family.check(
    "loss_on_prompt", "warning",
    "the loss includes prompt tokens (train_on_inputs / train_on_prompt, completion_only_loss false, "
    "conversational data without assistant_only_loss)",
    "train on the answers only: train_on_inputs false (axolotl), train_on_prompt false (LLaMA-Factory), "
    "assistant_only_loss true for conversational data in TRL",
    needs={"run_config"},
)
def loss_on_prompt(ctx: Any) -> Iterator[Hit]:
    """A loss mask that trains on prompt tokens too."""
    cfg = ctx.run.config
    if cfg.loss_mask == "all":
        yield Hit("the loss covers prompt tokens, so the model learns to write prompts as well as answers",
                  (config_evidence(ctx, "loss_mask", "loss mask: all tokens"),))
        return
    conversational = ctx.dataset is not None and any(e.format in ("messages", "sharegpt") for e in ctx.examples)
    if cfg.framework in ("trl", "unsloth") and cfg.loss_mask != "assistant_only" and conversational:
        yield Hit("TRL trains on every token of conversational (messages) data unless assistant_only_loss is true; "
                  "completion_only_loss applies to prompt/completion data only",
                  (config_evidence(ctx, "loss_mask", f"assistant_only_loss not set; loss mask {cfg.loss_mask or 'default'}"),),
                  fix="set assistant_only_loss=True in SFTConfig (with a template that marks generation), or convert "
                      "the data to prompt/completion")


@family.check(
    "packing_contamination", "warning",
    "packing without sample isolation (wrapped strategy, no padding-free / flash path)",
    "pack with isolation: TRL packing_strategy='bfd' (padding-free), axolotl sample_packing with flash attention, "
    "LLaMA-Factory neat_packing; or turn packing off",
    needs={"run_config"},
)
def packing_contamination(ctx: Any) -> Iterator[Hit]:
    """Packed sequences whose examples attend to each other."""
    cfg = ctx.run.config
    if not cfg.packing or cfg.padding_free or (cfg.packing_strategy or "") in ISOLATING_PACKING:
        return
    strategy = cfg.packing_strategy or "default"
    yield Hit(f"packing ({strategy}) without sample isolation: packed examples attend across their boundaries",
              (config_evidence(ctx, "packing", f"packing = true, strategy = {strategy}, padding_free = {cfg.padding_free}"),))


@family.check(
    "large_effective_batch", "info",
    "per_device x grad_accum x world > 32 for LoRA",
    "LoRA does best with small batches: keep the effective batch at 32 or less",
    needs={"run_config"},
)
def large_effective_batch(ctx: Any) -> Iterator[Hit]:
    """An effective batch larger than LoRA likes."""
    cfg = ctx.run.config
    if not cfg.per_device_batch_size or not is_lora(cfg):
        return
    accumulation, world = cfg.gradient_accumulation_steps or 1, cfg.world_size or 1
    effective = cfg.per_device_batch_size * accumulation * world
    if effective > ctx.config.diagnose.large_batch:
        assumed = "" if cfg.world_size else " (world size 1 assumed)"
        yield Hit(f"effective batch {effective} = {cfg.per_device_batch_size} x {accumulation} x {world}{assumed}",
                  (config_evidence(ctx, "per_device_batch_size", f"effective batch {effective}", effective=effective),))


@family.check(
    "grad_clip_disabled", "warning",
    "max_grad_norm 0 or None (and grad_norm then goes unlogged)",
    "set max_grad_norm to 1.0",
    needs={"run_config"},
)
def grad_clip_disabled(ctx: Any) -> Iterator[Hit]:
    """Gradient clipping turned off."""
    cfg = ctx.run.config
    if cfg.max_grad_norm is not None and cfg.max_grad_norm <= 0:
        yield Hit(f"gradient clipping is off (max_grad_norm = {cfg.max_grad_norm:g}); one bad batch can wreck the adapter",
                  (config_evidence(ctx, "max_grad_norm", f"max_grad_norm = {cfg.max_grad_norm:g}"),))
        return
    points = ctx.train_points()
    source = ctx.run.sources.get("metrics", "")
    if cfg.max_grad_norm is None and points and source.endswith(TRAINER_STATE) and all(p.grad_norm is None for p in points):
        yield Hit("grad_norm is never logged, which the Trainer does when clipping is off",
                  (Evidence(f"no grad_norm in {len(points)} logged steps", location=source),))


@family.check(
    "max_length_mismatch", "warning",
    "the run's max length differs from the attribution max length, or truncates more than 5% of the data",
    "set grads.max_seq_length to the run's max length (--set grads.max_seq_length=N) so attribution sees "
    "what training saw",
    needs={"run_config"},
)
def max_length_mismatch(ctx: Any) -> Iterator[Hit]:
    """Training and attribution would see differently truncated sequences."""
    run_length = ctx.run.config.max_length
    if not run_length:
        return
    grads_length = ctx.config.grads.max_seq_length
    if run_length != grads_length:
        yield Hit(f"the run trained at max length {run_length} but attribution uses grads.max_seq_length {grads_length}",
                  (config_evidence(ctx, "max_length", f"max length {run_length} vs grads.max_seq_length {grads_length}"),),
                  fix=f"--set grads.max_seq_length={run_length}")
    if {"dataset", "tokenizer"} <= ctx.available():
        from gradian_checks.data_tokens import truncated_examples

        cut = truncated_examples(ctx, run_length)
        share = len(cut) / max(len(ctx.examples), 1)
        if share > ctx.config.diagnose.max_length_truncated_fraction:
            yield Hit(f"the run's max length {run_length} truncates {len(cut)} rows ({share:.1%}) of the dataset",
                      (config_evidence(ctx, "max_length", f"max length {run_length}", truncated=len(cut)),),
                      fix="raise the run's max length (and grads.max_seq_length with it), or shorten the long rows")


def _name(text: str) -> str:
    return text.rstrip("/").rsplit("/", 1)[-1].lower()


def _base_vocab_size(base_model: str) -> int | None:
    from gradian.model.base import resolve_base_model

    config = resolve_base_model(base_model, progress=False) / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    vocab = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
    return int(vocab) if isinstance(vocab, int) else None


def _base_mismatch_hit(recorded: str, given: str, config_file: str) -> Hit:
    """A mismatch warning, or a note when --base-model is the unquantized base of the adapter's 4-bit one (QLoRA)."""
    from gradian.model.quantized import unsloth_unquantized_name

    evidence = (Evidence(f"base_model_name_or_path = {recorded!r}", location=config_file),)
    unquantized = unsloth_unquantized_name(recorded)
    if unquantized and _name(unquantized) == _name(given):
        return Hit(f"the adapter was trained on the quantized base {recorded!r} and --base-model {given!r} is its "
                   "unquantized base: the adapter applies unchanged, and gradian attribute takes gradients on the "
                   "dequantized base", evidence, severity="info",
                   fix="nothing to fix: attributing a QLoRA / unsloth adapter on its unquantized base is the "
                       "supported path")
    return Hit(f"the adapter was trained on {recorded!r} but --base-model is {given!r}", evidence)


@family.check(
    "adapter_base_mismatch", "warning",
    "adapter_config base_model_name_or_path differs from the base model, or added tokens are used but "
    "embed/lm_head were not trainable",
    "pass the base model the adapter was trained on; when tokens were added, train embed_tokens and lm_head "
    "(modules_to_save or trainable_token_indices)",
    needs={"adapter", "tokenizer"},
)
def adapter_base_mismatch(ctx: Any) -> Iterator[Hit]:
    """The adapter was trained on another base model, or relies on new tokens it never trained."""
    adapter = ctx.adapter
    config_file = (adapter.path / ADAPTER_CONFIG).as_posix()
    recorded = str(adapter.config.get("base_model_name_or_path") or "")
    given = str(ctx.base_model or "")
    if recorded and given:
        from gradian.model import embedded

        same = _name(recorded) == _name(given) or (embedded.is_embedded_alias(given) and embedded.is_embedded_hub_id(recorded))
        if not same:
            try:
                same = Path(recorded).resolve() == Path(given).resolve()
            except OSError:
                same = False
        if not same:
            yield _base_mismatch_hit(recorded, given, config_file)
    vocab = _base_vocab_size(given) if given else None
    if vocab is None:
        return
    modules = [str(m) for m in (adapter.config.get("modules_to_save") or [])]
    trainable = (any(any(e in m for e in EMBEDDING_MODULES) for m in modules)
                 or bool(adapter.config.get("trainable_token_indices"))
                 or any(any(e in name for e in EMBEDDING_MODULES) for name in adapter.tensors))
    if trainable:
        return
    used = 0
    if "dataset" in ctx.available():
        used = max((max(enc.input_ids) for enc in ctx.encodings() if enc is not None and enc.input_ids), default=0)
    else:
        used = len(ctx.tokenizer) - 1
    if used >= vocab:
        yield Hit(f"token id {used} is used but the base model's embedding has {vocab} rows, and the adapter does not "
                  "train embed_tokens / lm_head: the new tokens stay untrained",
                  (Evidence(f"modules_to_save = {modules or None}; base vocab_size {vocab}; tokenizer size {len(ctx.tokenizer)}",
                            location=config_file, values={"vocab_size": vocab, "max_token_id": used}),))


# peft LoraConfig fields that turn a LoRA layer into a variant (DoRA and the rest) whose computation is not the plain
# x A^T B^T the gradient hooks differentiate; ``init_lora_weights`` values that do the same.
LORA_VARIANT_FIELDS = ("use_dora", "velora_config", "alora_invocation_tokens", "monteclora_config", "use_bdlora",
                       "arrow_config", "kasa_config")
LORA_VARIANT_INITS = ("mica",)
_LORA_TENSOR = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+?)\.(?P<kind>lora_A|lora_B)(?:\.[^.]+)?\.weight$")


def _rank_for(module: str, config: Any) -> Any:
    """The rank peft gives ``module``: its rank_pattern entry (peft's own matching), else r."""
    pattern = config.get("rank_pattern") or {}
    if isinstance(pattern, dict):
        for key, rank in pattern.items():
            try:
                if re.match(rf"(.*\.)?({key})$", module):
                    return rank
            except re.error:
                continue
    return config.get("r")


def _adapter_config_problems(adapter: Any, config_file: str) -> Iterator[Hit]:
    """What in adapter_config.json makes gradian index refuse the adapter: no LoRA type, no rank, a variant."""
    config = adapter.config
    peft_type = config.get("peft_type")
    if str(peft_type or "").upper() != "LORA":
        what = f"peft_type {peft_type!r}" if peft_type else "no peft_type"
        yield Hit(f"adapter_config.json has {what}, not LORA: gradian index and attribute refuse this adapter",
                  (Evidence(f"{len(config)} keys, peft_type = {peft_type!r}", location=config_file,
                            values={"peft_type": str(peft_type)}),),
                  fix="pass the adapter_config.json peft's save_pretrained wrote with the LoRA weights (it names "
                      "peft_type LORA, r, lora_alpha and target_modules)")
        return
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        yield Hit(f"adapter_config.json has r = {rank!r}, not a positive rank: peft cannot build the LoRA layers",
                  (Evidence(f"r = {rank!r}", location=config_file),),
                  fix="restore adapter_config.json from the run that saved these weights")
    variants = [name for name in LORA_VARIANT_FIELDS if config.get(name)]
    if config.get("init_lora_weights") in LORA_VARIANT_INITS:
        variants.append(f"init_lora_weights={config['init_lora_weights']}")
    magnitude = [name for name in adapter.tensors if "lora_magnitude_vector" in name]
    if magnitude and "use_dora" not in variants:
        variants.append("use_dora (lora_magnitude_vector tensors)")
    if variants:
        shown = ", ".join(variants)
        yield Hit(f"the adapter is a LoRA variant ({shown}): gradian computes plain LoRA gradients, and gradian index "
                  "and attribute refuse it",
                  (Evidence(f"{shown}" + (f"; {len(magnitude)} lora_magnitude_vector tensors" if magnitude else ""),
                            location=config_file, values={"variants": variants}),),
                  fix="attribute a plain LoRA adapter (train with use_dora=False), or skip these blocks with "
                      "grads.module_filter")


@family.check(
    "adapter_unusable", "error",
    "adapter_config.json does not describe its weights (not LoRA, no rank, a rank other than the tensors'), or "
    "the adapter is a LoRA variant such as DoRA: gradian index and attribute refuse it",
    "restore the adapter_config.json saved with these weights (peft's save_pretrained writes both), or attribute "
    "a plain LoRA adapter",
    needs={"adapter"},
)
def adapter_unusable(ctx: Any) -> Iterator[Hit]:
    """The adapter index would refuse, found from its config and tensor headers alone (no model, no torch)."""
    adapter = ctx.adapter
    config_file = (adapter.path / ADAPTER_CONFIG).as_posix()
    problems = list(_adapter_config_problems(adapter, config_file))
    yield from problems
    if problems:
        return
    wrong = []
    for name, info in sorted(adapter.tensors.items()):
        match = _LORA_TENSOR.match(name)
        if match is None or len(info.shape) != 2:
            continue
        expected = _rank_for(match.group("module"), adapter.config)
        actual = info.shape[0] if match.group("kind") == "lora_A" else info.shape[1]
        if isinstance(expected, int) and actual != expected:
            wrong.append((name, info.shape, actual, expected))
    if wrong:
        name, shape, actual, expected = wrong[0]
        yield Hit(f"adapter_config.json says rank {expected} but {len(wrong)} of the LoRA tensors have rank {actual}: "
                  "gradian index and attribute refuse an adapter whose config does not match its weights",
                  tuple(Evidence(f"{n} has shape {list(s)} (rank {a}); the config gives rank {e}",
                                 location=adapter.weights.as_posix(), values={"rank": a, "config_rank": e})
                        for n, s, a, e in wrong[:5]),
                  fix="restore the adapter_config.json saved with these weights (its r and rank_pattern must match "
                      "the tensors' shapes)")


CHECKS = tuple(family.checks)
