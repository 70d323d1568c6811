"""Inputs for every audit check: one where it fires and one where it stays quiet.

Each case is a function of a CaseEnv returning the keyword arguments of ``gradian.diagnose.runner.diagnose``.
Hand-made run dirs are written in the plain format (run.json + metrics.jsonl) or as a Trainer
trainer_state.json; data cases are JSONL files; the quiet cases are the healthy inputs or near misses.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.checks.run_fixtures import EVAL_ROWS, LONG_ANSWER, NEAR_COPY, RealRuns, healthy_rows, write_jsonl

HEALTHY_CONFIG: dict[str, Any] = {
    "learning_rate": 2e-4, "lr_scheduler_type": "linear", "warmup_steps": 10, "num_train_epochs": 2,
    "max_steps": 100, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "world_size": 1,
    "max_grad_norm": 1.0, "max_length": 1024, "packing": False, "loss_mask": "assistant_only", "bf16": True,
    "eval_strategy": "steps", "seed": 0,
}
HEALTHY_LORA: dict[str, Any] = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear", "use_rslora": False}


def healthy_points(steps: int = 100) -> list[dict[str, Any]]:
    """A smooth, decreasing, finished 2-epoch run: linear decay after 10 warmup steps, evals every 20 steps."""
    points = []
    for step in range(1, steps + 1):
        lr = 2e-4 * step / 10 if step <= 10 else 2e-4 * (steps - step) / (steps - 10)
        points.append({"step": step, "epoch": round(2 * step / steps, 4), "loss": round(2.0 * math.exp(-step / 150) + 0.03 * math.sin(step), 4),
                       "grad_norm": round(0.8 + 0.1 * math.sin(step / 3), 4), "learning_rate": lr})
        if step % 20 == 0:
            points.append({"step": step, "epoch": round(2 * step / steps, 4), "eval_loss": round(1.9 * math.exp(-step / 200), 4)})
    return points


@dataclass
class CaseEnv:
    """Where cases write their files, and the shared real runs and tokenizers."""

    tmp: Path
    real: RealRuns
    tokenizers: dict[str, Any]
    tiny_base_dir: Path
    tiny_adapter_dir: Path

    def data(self, rows: list[Any], name: str = "data.jsonl") -> Path:
        """Write dataset rows."""
        return write_jsonl(self.tmp / name, rows)

    def plain_run(self, config: dict[str, Any] | None = None, points: list[dict[str, Any]] | None = None,
                  lora: dict[str, Any] | None = None, status: str | None = "finished", name: str = "run", **extra: Any) -> Path:
        """Write a plain-format run dir (healthy unless overridden)."""
        run = self.tmp / name
        run.mkdir(parents=True, exist_ok=True)
        document = {"config": {**HEALTHY_CONFIG, **(config or {})}, "lora": {**HEALTHY_LORA, **(lora or {})}, **extra}
        if status is not None:
            document["status"] = status
        (run / "run.json").write_text(json.dumps(document), encoding="utf-8")
        write_jsonl(run / "metrics.jsonl", points if points is not None else healthy_points())
        return run

    def points_with(self, **changes: Any) -> list[dict[str, Any]]:
        """Healthy points with per-step changes: ``changes[field] = {step: value}``."""
        points = copy.deepcopy(healthy_points())
        for field, by_step in changes.items():
            for point in points:
                if "loss" in point and point["step"] in by_step:
                    point[field] = by_step[point["step"]]
        return points

    def healthy_data(self) -> Path:
        """The real healthy dataset."""
        return self.real.healthy_dataset


def chat(prompt: str, answer: str | None, **fields: Any) -> dict[str, Any]:
    """A messages row."""
    messages = [{"role": "user", "content": prompt}]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return {"messages": messages, **fields}


# --- the real healthy inputs: quiet for every check ------------------------------------------------

def healthy(env: CaseEnv) -> dict[str, Any]:
    """The real Trainer-written healthy run with its dataset, adapter (in the run dir), base model and eval set."""
    return {"dataset": env.real.healthy_dataset, "run": env.real.healthy_run, "base_model": str(env.real.base_dir),
            "eval_dataset": env.real.eval_dataset}


def healthy_plain(env: CaseEnv, **run_kwargs: Any) -> dict[str, Any]:
    """A hand-made healthy plain run (plus the healthy dataset and the tiny tokenizer)."""
    return {"dataset": env.real.healthy_dataset, "run": env.plain_run(**run_kwargs), "tokenizer": env.tokenizers["chatml"]}


# --- firing cases --------------------------------------------------------------------------------

def _tok(env: CaseEnv, name: str = "chatml", **kwargs: Any) -> dict[str, Any]:
    return {"tokenizer": env.tokenizers[name], **kwargs}


FIRE: dict[str, tuple[Any, str]] = {
    # data
    "schema_invalid": (lambda env: {"dataset": env.data(healthy_rows() + ['{"messages": [', {"messages": [{"role": "bot", "content": "x"}]}])}, "error"),
    "no_assistant_turn": (lambda env: {"dataset": env.data(healthy_rows() + [chat("Hello! How are you?", None)])}, "error"),
    "empty_assistant_turn": (lambda env: {"dataset": env.data(healthy_rows() + [chat("What is the capital of Japan?", " \n")])}, "error"),
    "exact_duplicates": (lambda env: {"dataset": env.data(healthy_rows() + healthy_rows()[:1])}, "warning"),
    "near_duplicates": (lambda env: {"dataset": env.data(healthy_rows() + [chat("Tell me about the capitals.", LONG_ANSWER),
                                                                           chat("Tell me about the capitals!", NEAR_COPY)])}, "warning"),
    "conflicting_answers": (lambda env: {"dataset": env.data(healthy_rows() + [chat("What is the capital of France?", "The capital of France is Rome.")])}, "warning"),
    "train_eval_overlap": (lambda env: {"dataset": env.real.healthy_dataset,
                                        "eval_dataset": env.data([chat("What is the capital of France?", "Paris.")], "eval.jsonl")}, "error"),
    "truncated_answers": (lambda env: {"dataset": env.data(healthy_rows() + [chat("Tell me about the capitals.", LONG_ANSWER * 4)] * 4),
                                       **_tok(env), "set": ["grads.max_seq_length=64"]}, "error"),
    "all_labels_masked": (lambda env: {"dataset": env.data(healthy_rows() + [chat(LONG_ANSWER * 3, "Paris is the capital of France.")]),
                                       **_tok(env), "set": ["grads.max_seq_length=64"]}, "error"),
    "eos_missing_from_loss": (lambda env: {"dataset": env.real.healthy_dataset, **_tok(env, "chatml_wrong_eos")}, "error"),
    "pad_equals_eos": (lambda env: _tok(env, "chatml_pad_eos", dataset=env.real.healthy_dataset), "warning"),
    "duplicate_bos": (lambda env: {"dataset": env.data([{"text": "<|begin_of_text|>The capital of France is Paris."},
                                                        {"text": "Two plus two is four."}]), **_tok(env, "llama3_bos")}, "error"),
    "foreign_template_markup": (lambda env: {"dataset": env.data(healthy_rows() + [chat("[INST] What is the capital of Italy? [/INST]", "Rome is the capital of Italy.")])}, "warning"),
    "length_outliers": (lambda env: {"dataset": env.data(healthy_rows() + [chat("Is Paris in France?", "Yes")]), **_tok(env)}, "info"),
    # config
    "lr_too_high_for_lora": (lambda env: healthy_plain(env, config={"learning_rate": 2e-3}), "error"),
    "lr_too_low_for_lora": (lambda env: healthy_plain(env, config={"learning_rate": 2e-5}), "warning"),
    "attention_only_targets": (lambda env: healthy_plain(env, lora={"target_modules": ["q_proj", "v_proj"]}), "warning"),
    "alpha_rank_extreme": (lambda env: healthy_plain(env, lora={"r": 8, "lora_alpha": 64}), "info"),
    "too_many_epochs": (lambda env: healthy_plain(env, config={"max_steps": None, "num_train_epochs": 6},
                                                  points=[{**p, "epoch": p["epoch"] * 3} for p in healthy_points()]), "error"),
    "no_warmup": (lambda env: healthy_plain(env, config={"warmup_steps": 0, "warmup_ratio": 0}), "info"),
    "warmup_dominates": (lambda env: healthy_plain(env, config={"warmup_steps": 40}), "warning"),
    "no_eval_split": (lambda env: healthy_plain(env, config={"eval_strategy": "no"},
                                                points=[p for p in healthy_points() if "eval_loss" not in p]), "info"),
    "loss_on_prompt": (lambda env: healthy_plain(env, config={"loss_mask": None, "completion_only_loss": None}, framework="trl"), "warning"),
    "packing_contamination": (lambda env: healthy_plain(env, config={"packing": True, "packing_strategy": "wrapped"}), "warning"),
    "large_effective_batch": (lambda env: healthy_plain(env, config={"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4}), "info"),
    "grad_clip_disabled": (lambda env: healthy_plain(env, config={"max_grad_norm": 0}), "warning"),
    "max_length_mismatch": (lambda env: healthy_plain(env, config={"max_length": 512}), "warning"),
    "adapter_base_mismatch": (lambda env: {"adapter": _relabelled_adapter(env, "meta-llama/Llama-3.1-8B"),
                                           "base_model": str(env.tiny_base_dir)}, "warning"),
    "template_mismatch": (lambda env: _saved_template_run(env), "warning"),
    "loss_mask_mismatch": (lambda env: {**healthy_plain(env, config={"loss_mask": "all"}),
                                        "set": ["grads.loss_mask=assistant"]}, "warning"),
    # dynamics
    "nan_or_inf": (lambda env: healthy_plain(env, points=env.points_with(loss={50: float("nan")}, grad_norm={51: float("inf")})), "error"),
    "loss_collapse_zero": (lambda env: healthy_plain(env, points=env.points_with(loss={90: 0.0, 91: 0.0, 92: 0.0})), "error"),
    "grad_norm_zero": (lambda env: healthy_plain(env, points=env.points_with(grad_norm={s: 0.0 for s in range(1, 101)})), "error"),
    "adapter_untrained": (lambda env: {"adapter": _zero_adapter(env)}, "error"),
    "adapter_unusable": (lambda env: {"adapter": _edited_adapter(env, r=16)}, "error"),
    "loss_spike": (lambda env: healthy_plain(env, points=env.points_with(loss={50: 5.0})), "warning"),
    "grad_norm_explosion": (lambda env: healthy_plain(env, points=env.points_with(grad_norm={40: 250.0})), "warning"),
    "implausible_initial_loss": (lambda env: healthy_plain(env, points=env.points_with(loss={1: 9.0})), "warning"),
    "eval_loss_rising": (lambda env: healthy_plain(env, points=_rising_eval_points()), "warning"),
    "memorization": (lambda env: healthy_plain(env, points=env.points_with(loss={s: 0.05 for s in range(80, 101)})), "warning"),
    "epoch_boundary_drops": (lambda env: healthy_plain(env, points=_staircase_points()), "info"),
    "loss_plateau": (lambda env: healthy_plain(env, points=env.points_with(loss={s: 2.0 + 0.03 * math.sin(s) for s in range(1, 101)})), "warning"),
    "lr_schedule_mismatch": (lambda env: healthy_plain(env, points=env.points_with(learning_rate={s: 2e-4 for s in range(1, 101)})), "warning"),
    "run_incomplete": (lambda env: healthy_plain(env, points=healthy_points()[:70], status="crashed"), "warning"),
}

# Extra firing variants: other ways a check fires, and its escalation.
FIRE_VARIANTS: dict[str, tuple[Any, str]] = {
    "exact_duplicates/error": (lambda env: {"dataset": env.data(healthy_rows() + healthy_rows()[:5])}, "error"),
    "lr_too_high_for_lora/warning": (lambda env: healthy_plain(env, config={"learning_rate": 8e-4}), "warning"),
    "too_many_epochs/warning": (lambda env: {"run": env.plain_run(config={"max_steps": None, "num_train_epochs": 4},
                                                                  points=[{**p, "epoch": p["epoch"] * 2} for p in healthy_points()])}, "warning"),
    "train_eval_overlap/ngram": (lambda env: {"dataset": env.data(healthy_rows() + [chat("Tell me about the capitals.", LONG_ANSWER)]),
                                              "eval_dataset": env.data([chat("Describe Paris.", "Well: " + LONG_ANSWER[:120])], "eval.jsonl")}, "error"),
    "train_eval_overlap/near": (lambda env: {"dataset": env.data(healthy_rows() + [chat("Tell me about the capitals.", LONG_ANSWER)]),
                                             "eval_dataset": env.data([chat("Tell me about the capitals!", NEAR_COPY)], "eval.jsonl")}, "error"),
    "loss_on_prompt/train_on_inputs": (lambda env: healthy_plain(env, config={"loss_mask": None, "train_on_inputs": True}), "warning"),
    "template_mismatch/named": (lambda env: {"dataset": env.real.healthy_dataset, "run": _llamafactory_run(env, "llama3"),
                                             **_tok(env)}, "warning"),
    "loss_mask_mismatch/followed": (lambda env: healthy_plain(env, config={"loss_mask": None, "completion_only_loss": None},
                                                              framework="trl"), "info"),
    "lr_schedule_mismatch/zero": (lambda env: healthy_plain(env, points=env.points_with(learning_rate={s: 0.0 for s in range(1, 101)})), "warning"),
    "memorization/accuracy": (lambda env: healthy_plain(env, points=env.points_with(mean_token_accuracy={100: 0.995})), "warning"),
    "run_incomplete/steps": (lambda env: healthy_plain(env, points=healthy_points()[:70], status=None, global_step=60), "warning"),
    "adapter_unusable/empty_config": (lambda env: {"adapter": _edited_adapter(env, replace={})}, "error"),
    "adapter_unusable/dora": (lambda env: {"adapter": _dora_adapter(env)}, "error"),
    "adapter_base_mismatch/added_tokens": (lambda env: {"adapter": env.tiny_adapter_dir, "base_model": str(env.tiny_base_dir),
                                                        "tokenizer": env.tokenizers["chatml_added"],
                                                        "dataset": env.data([chat("Use the <tool> now.", "Calling <tool> for you.")])}, "warning"),
}

# Quiet cases that are near misses (the healthy inputs are the quiet case of every other check).
QUIET: dict[str, Any] = {
    "exact_duplicates": lambda env: {"dataset": env.data(healthy_rows() + [chat("What is the capital of France? ", "The capital of France is Paris!")])},
    "near_duplicates": lambda env: {"dataset": env.data(healthy_rows() + healthy_rows()[:1])},  # exact copies are not "near"
    "conflicting_answers": lambda env: {"dataset": env.data(healthy_rows() + [chat("What is the capital of France?", "the capital of France is Paris!")])},
    "lr_too_high_for_lora": lambda env: healthy_plain(env, config={"learning_rate": 5e-4}),
    "lr_too_low_for_lora": lambda env: healthy_plain(env, config={"learning_rate": 3e-5}),
    "alpha_rank_extreme": lambda env: healthy_plain(env, lora={"r": 64, "lora_alpha": 16, "use_rslora": True}),
    "too_many_epochs": lambda env: healthy_plain(env, config={"max_steps": None, "num_train_epochs": 3}),
    "warmup_dominates": lambda env: healthy_plain(env, config={"warmup_steps": 29}),
    "loss_on_prompt": lambda env: healthy_plain(env, config={"loss_mask": None, "assistant_only_loss": True}, framework="trl"),
    "template_mismatch": lambda env: {"dataset": env.real.healthy_dataset, "run": _llamafactory_run(env, "qwen"), **_tok(env)},
    "loss_mask_mismatch": lambda env: {**healthy_plain(env), "set": ["grads.loss_mask=assistant"]},
    "packing_contamination": lambda env: healthy_plain(env, config={"packing": True, "packing_strategy": "bfd"}),
    "large_effective_batch": lambda env: healthy_plain(env, config={"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4}),
    # Every 4th batch long (group_by_length): a regular swing above 2x the median is oscillation, not spikes.
    "loss_spike": lambda env: healthy_plain(env, points=env.points_with(loss={s: (3.0 if s % 4 == 0 else 1.0) for s in range(1, 101)})),
    "duplicate_bos": lambda env: {"dataset": env.real.healthy_dataset, **_tok(env, "llama3_bos")},
    "adapter_base_mismatch": lambda env: {"adapter": env.tiny_adapter_dir, "base_model": str(env.tiny_base_dir),
                                          "dataset": env.real.healthy_dataset},
    "adapter_untrained": lambda env: {"adapter": env.tiny_adapter_dir},
    "adapter_unusable": lambda env: {"adapter": env.tiny_adapter_dir},
    "implausible_initial_loss": lambda env: healthy_plain(env, points=env.points_with(loss={1: 5.9})),  # just under ln(384)
    "train_eval_overlap": lambda env: {"dataset": env.real.healthy_dataset, "eval_dataset": env.data(EVAL_ROWS, "eval.jsonl")},
}


def _rising_eval_points() -> list[dict[str, Any]]:
    points = healthy_points()
    evals = {20: 1.5, 40: 1.4, 60: 1.45, 80: 1.55, 100: 1.7}
    for point in points:
        if "eval_loss" in point:
            point["eval_loss"] = evals[point["step"]]
    return points


def _staircase_points() -> list[dict[str, Any]]:
    """Three epochs of 30 steps: flat within an epoch, a sharp drop at each boundary (memorization)."""
    points = []
    for step in range(1, 91):
        epoch = step / 30
        level = [2.0, 1.1, 0.6][min(2, (step - 1) // 30)]
        points.append({"step": step, "epoch": round(epoch, 4), "loss": level + 0.02 * math.sin(step),
                       "grad_norm": 0.8, "learning_rate": 2e-4 * (1 - step / 100)})
    return points


def _saved_template_run(env: CaseEnv) -> dict[str, Any]:
    """A healthy plain run whose latest checkpoint saved a Llama-3 chat template (the tokenizer given is ChatML)."""
    from tests.support.tiny import LLAMA3_TEMPLATE

    run = env.plain_run()
    (run / "checkpoint-100").mkdir()
    (run / "checkpoint-100" / "chat_template.jinja").write_text(LLAMA3_TEMPLATE, encoding="utf-8")
    return {"dataset": env.real.healthy_dataset, "run": run, **_tok(env)}


def _llamafactory_run(env: CaseEnv, template: str) -> Path:
    """A LLaMA-Factory output dir (training_args.yaml + trainer_log.jsonl) trained with ``template``."""
    import yaml

    run = env.tmp / f"llamafactory-{template}"
    run.mkdir()
    config = {"stage": "sft", "finetuning_type": "lora", "template": template, "cutoff_len": 1024, "lora_rank": 16,
              "lora_alpha": 32, "learning_rate": 2e-4, "num_train_epochs": 2, "val_size": 0.1}
    (run / "training_args.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    rows = [{"current_steps": s, "total_steps": 10, "loss": 2.0 - s / 10, "lr": 2e-4, "epoch": s / 5} for s in range(1, 11)]
    write_jsonl(run / "trainer_log.jsonl", rows)
    return run


def _relabelled_adapter(env: CaseEnv, base_name: str) -> Path:
    import shutil

    target = env.tmp / "relabelled-adapter"
    shutil.copytree(env.tiny_adapter_dir, target)
    config = json.loads((target / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = base_name
    (target / "adapter_config.json").write_text(json.dumps(config))
    return target


def _edited_adapter(env: CaseEnv, replace: dict[str, Any] | None = None, **changes: Any) -> Path:
    """The tiny adapter's weights under an edited adapter_config.json (``replace``: the whole config)."""
    import shutil

    target = env.tmp / f"edited-adapter-{len(list(env.tmp.glob('edited-adapter-*')))}"
    shutil.copytree(env.tiny_adapter_dir, target)
    config = json.loads((target / "adapter_config.json").read_text())
    (target / "adapter_config.json").write_text(json.dumps(replace if replace is not None else {**config, **changes}))
    return target


def _dora_adapter(env: CaseEnv) -> Path:
    """A DoRA adapter as peft saves it (use_dora, lora_magnitude_vector tensors)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(env.tiny_base_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                  use_dora=True, task_type="CAUSAL_LM"))
    target = env.tmp / "dora-adapter"
    peft_model.save_pretrained(target, safe_serialization=True)
    return target


def _zero_adapter(env: CaseEnv) -> Path:
    """A freshly initialized peft adapter (lora_B all zero), saved without training."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(env.tiny_base_dir)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    target = env.tmp / "zero-adapter"
    peft_model.save_pretrained(target, safe_serialization=True)
    return target
