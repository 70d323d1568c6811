"""AuditContext: everything an audit check may read, loaded once and computed lazily.

Checks get one context per diagnose run. Expensive shared work (tokenizing the dataset, MinHash
signatures) is computed on first use and memoized, so ten checks that need token ids tokenize once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gradian.config import GradianConfig
from gradian.diagnose.adapter import AdapterInfo
from gradian.diagnose.encoding import encode_examples
from gradian.diagnose.tokenizer import load_audit_tokenizer
from gradian.model.base import _load_tokenizer_from
from gradian.records import MetricPoint, Need, RunArtifact
from gradian.runs.training_format import TokenizerChoice, apply_saved_files, tokenizer_dirs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from gradian.data.encode import Encoded
    from gradian.data.examples import Example
    from gradian.data.loading import DatasetScan

T = TypeVar("T")

# encode() without truncation: truncation at any max length is then derived from one encoding.
UNTRUNCATED = 1 << 30

NEED_FLAGS: dict[str, str] = {
    "dataset": "--dataset",
    "tokenizer": "--base-model (for its tokenizer)",
    "eval_dataset": "--eval-dataset",
    "run_config": "--run (a run directory with the trainer config)",
    "run_logs": "--run (a run directory with logged metrics)",
    "adapter": "--adapter (or an adapter inside the run directory)",
}


@dataclass(frozen=True)
class EncodeFailure:
    """An example the chat template or tokenizer could not encode."""

    example_id: str
    location: str
    reason: str


class AuditContext:
    """The inputs of one diagnose run and the derived data checks share."""

    def __init__(
        self,
        config: GradianConfig,
        *,
        dataset: DatasetScan | None = None,
        eval_dataset: DatasetScan | None = None,
        run: RunArtifact | None = None,
        adapter: AdapterInfo | None = None,
        base_model: str | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        self.config = config
        self.dataset = dataset
        self.eval_dataset = eval_dataset
        self.run = run
        self.adapter = adapter
        self.base_model = base_model
        self.trust_remote_code = trust_remote_code
        self._tokenizer = tokenizer
        self._base_template: str | None = getattr(tokenizer, "chat_template", None)
        self.tokenizer_choice: TokenizerChoice | None = None  # once the tokenizer loads
        self._memo: dict[str, Any] = {}

    # --- what is available ----------------------------------------------------------------------

    def available(self) -> frozenset[Need]:
        """The needs this context satisfies."""
        have: set[Need] = set()
        if self.dataset is not None:
            have.add("dataset")
        if self._tokenizer is not None or self.base_model is not None:
            have.add("tokenizer")
        if self.eval_dataset is not None:
            have.add("eval_dataset")
        if self.run is not None:
            have.add("run_config")
            if self.run.metrics:
                have.add("run_logs")
        if self.adapter is not None:
            have.add("adapter")
        return frozenset(have)

    def need_text(self, need: Need) -> str:
        """What a skipped check needs, in words; a need whose input was given but holds nothing says so."""
        if need == "run_logs" and self.run is not None:
            return "logged metrics (the --run directory has none: no log_history entries or metrics lines)"
        return NEED_FLAGS[need]

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer the run trained with: saved with the adapter or a checkpoint, else the base's (loaded once)."""
        if self._tokenizer is None:
            if self.base_model is None:
                raise RuntimeError("a check used the tokenizer without declaring the 'tokenizer' need")
            base = load_audit_tokenizer(self.base_model, trust_remote_code=self.trust_remote_code)
            self._base_template = getattr(base, "chat_template", None)
            self._tokenizer, self.tokenizer_choice = apply_saved_files(
                base, self.base_model, self.training_dirs(),
                lambda path: _load_tokenizer_from(Path(path), trust_remote_code=self.trust_remote_code))
        return self._tokenizer

    def base_template(self) -> str | None:
        """The base model's own chat template (the given tokenizer's when one was passed in); None when it has none."""
        _ = self.tokenizer
        return self._base_template

    def training_dirs(self) -> list[Path]:
        """Where the run saved tokenizer files: the adapter dir, the run dir, its checkpoints (newest first)."""
        adapter = self.adapter.path if self.adapter is not None else (self.run.adapter_dir if self.run else None)
        return tokenizer_dirs(adapter, self.run.path if self.run is not None else None)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """Compute a value shared between checks once (keys are namespaced by the caller)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # --- dataset-derived data -------------------------------------------------------------------

    @property
    def examples(self) -> tuple[Example, ...]:
        """The training examples that parsed (bad rows are in ``dataset.problems``)."""
        return tuple(self.dataset.examples) if self.dataset is not None else ()

    def encodings(self) -> list[Encoded | None]:
        """encode() of every training example without truncation (None where encoding failed)."""
        return self._encode_all()[0]

    def encode_failures(self) -> list[EncodeFailure]:
        """Examples the tokenizer's chat template could not encode."""
        return self._encode_all()[1]

    def _encode_all(self) -> tuple[list[Encoded | None], list[EncodeFailure]]:
        def compute() -> tuple[list[Encoded | None], list[EncodeFailure]]:
            encoded, failed = encode_examples(self.examples, self.tokenizer, UNTRUNCATED)
            return encoded, [EncodeFailure(example.id, example.location, reason) for example, reason in failed]

        return self.memo("core.encode_all", compute)

    def max_length(self) -> tuple[int, str]:
        """The effective max sequence length and where it comes from (the run config, else grads.max_seq_length)."""
        if self.run is not None and self.run.config.max_length:
            source = self.run.sources.get("max_length", "run config")
            return self.run.config.max_length, f"the run's max length ({source})"
        return self.config.grads.max_seq_length, "grads.max_seq_length"

    # --- run-derived data -----------------------------------------------------------------------

    def metric_location(self, point: MetricPoint) -> str | None:
        """``file:line`` of a logged point, when the reader knew it."""
        if self.run is None:
            return None
        source = self.run.sources.get("metrics")
        if source is None:
            return None
        return f"{source}:{point.line}" if point.line else source

    def config_location(self, name: str) -> str | None:
        """Where a run config field was read from."""
        return self.run.sources.get(name) if self.run is not None else None

    def train_points(self) -> list[MetricPoint]:
        """Logged training points (with a loss), in step order."""
        return [p for p in self.run.metrics if p.loss is not None] if self.run is not None else []

    def eval_points(self) -> list[MetricPoint]:
        """Logged evaluation points (with an eval_loss), in step order."""
        return [p for p in self.run.metrics if p.eval_loss is not None] if self.run is not None else []

    def dataset_path(self) -> Path | None:
        """The training dataset's path."""
        return Path(self.dataset.path) if self.dataset is not None else None
