"""The diagnose config section: the thresholds of the audit checks, owned by gradian-checks (docs/checks.md)."""

from __future__ import annotations

from dataclasses import dataclass

from gradian.config import option
from gradian.records import ConfigSection


@dataclass(frozen=True)
class DiagnoseConfig:
    """Thresholds of the audit checks (see docs/checks.md)."""

    near_duplicate_threshold: float = option(0.85, "MinHash Jaccard at which two examples are near-duplicates", min=0.0, max=1.0)
    lr_warn: float = option(5e-4, "LoRA learning rate that warns", min=0.0)
    lr_error: float = option(1e-3, "LoRA learning rate that errors", min=0.0)
    lr_low: float = option(2e-5, "LoRA learning rate at or below which the run is too slow", min=0.0)
    near_duplicate_num_perm: int = option(128, "MinHash permutations for near-duplicate detection", min=16)
    near_duplicate_ngram: int = option(5, "word n-gram size of the MinHash shingles", min=1)
    exact_duplicate_error_fraction: float = option(0.05, "share of duplicated rows at which exact_duplicates is an error", min=0.0, max=1.0)
    overlap_ngram: int = option(12, "word n-gram an eval answer may not share with a training answer", min=1)
    truncated_error_fraction: float = option(0.10, "share of truncated rows at which truncated_answers is an error", min=0.0, max=1.0)
    short_answer_tokens: int = option(3, "answers under this many tokens are length outliers", min=0)
    long_answer_factor: float = option(20.0, "answers over this many times the median length are outliers", min=1.0)
    prompt_share: float = option(0.9, "share of an example's tokens taken by the prompt that counts as dominating", min=0.0, max=1.0)
    alpha_rank_max: float = option(4.0, "LoRA scale (alpha/r, alpha/sqrt(r) with rsLoRA) above which it is extreme", min=0.0)
    alpha_rank_min: float = option(0.25, "LoRA scale below which it is extreme", min=0.0)
    epochs_warn: float = option(3.0, "epochs above which too_many_epochs warns", min=0.0)
    epochs_error: float = option(5.0, "epochs at or above which too_many_epochs errors on a small dataset", min=0.0)
    epochs_error_max_rows: int = option(1000, "datasets under this many rows count as small", min=1)
    warmup_max_fraction: float = option(0.3, "share of total steps at or above which warmup dominates", min=0.0, max=1.0)
    large_batch: int = option(32, "effective batch (per device x accumulation x world) above which LoRA batches are large", min=1)
    max_length_truncated_fraction: float = option(0.05, "share of rows truncated by the run's max length that is a mismatch", min=0.0, max=1.0)
    loss_zero_consecutive: int = option(2, "consecutive logs of loss 0.0 that count as collapse", min=1)
    loss_spike_factor: float = option(2.0, "loss above this many times the rolling median is a spike", min=1.0)
    loss_spike_window: int = option(20, "logs in the rolling median of loss_spike", min=3)
    loss_spike_max_fraction: float = option(0.2, "share of spiking logs above which it is oscillation, not spikes", min=0.0, max=1.0)
    grad_norm_max: float = option(100.0, "grad_norm above which it explodes", min=0.0)
    grad_norm_median_factor: float = option(10.0, "grad_norm above this many times its median explodes", min=1.0)
    eval_rising_consecutive: int = option(2, "consecutive eval_loss rises (train loss falling) that warn", min=1)
    memorization_loss: float = option(0.1, "train loss below which the run memorizes", min=0.0)
    memorization_accuracy: float = option(0.99, "mean token accuracy at or above which the run memorizes", min=0.0, max=1.0)
    epoch_drop_fraction: float = option(0.3, "relative loss drop across an epoch boundary that is sharp", min=0.0, max=1.0)
    plateau_improvement: float = option(0.05, "relative loss improvement, first to last quarter, below which loss plateaus", min=0.0, max=1.0)
    adapter_zero_norm: float = option(1e-6, "lora_B norm at or below which a tensor is untrained", min=0.0)
    max_evidence: int = option(20, "evidence items kept per finding (the rest are counted)", min=1)


# Registered by gradian_checks.plugin; "diagnostics" and "audit" are what people call it coming from other tools.
SECTION = ConfigSection(name="diagnose", summary="Thresholds of the audit checks (see docs/checks.md).",
                        settings=DiagnoseConfig, aliases=("diagnostics", "audit"))
