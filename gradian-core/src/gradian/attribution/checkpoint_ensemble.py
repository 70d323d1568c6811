"""Blame summed over several checkpoints of the run (TracIn-CP): which checkpoints, their weights, the weighted blame.

By the end of training the rows that caused a regression are fitted and their gradients are small; TracIn-CP
(Pruthi et al. 2020) sums the influence over checkpoints along the run, each weighted by the learning rate
there: blame = sum_c w_c B_c with B_c the per-item blame [examples, items] under checkpoint c's adapter and
w_c = lr_c / sum lr. ``attribution.checkpoints`` members: the adapter given, plus the run's checkpoints nearest
to evenly spaced steps before it (bench/results/checkpoints.md measured the gain and the index cost).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gradian.errors import GradianError
from gradian.file_names import ADAPTER_PICKLE, ADAPTER_SAFETENSORS
from gradian.model.adapter_swap import checkpoint_hash, checkpoint_weights
from gradian.runs import read_run
from gradian.runs.hf_trainer import checkpoints

if TYPE_CHECKING:
    from gradian.model.loaded import LoadedModel
    from gradian.records import RunArtifact

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnsembleMember:
    """One point of the run that is scored: its step, adapter dir, the learning rate logged there, its weight."""

    step: int | None  # None when the run logged no step for the adapter given
    adapter_dir: Path
    learning_rate: float | None
    weight: float
    is_adapter: bool  # the adapter given, scored with the main index

    def to_dict(self, index_id: str | None) -> dict[str, Any]:
        """The member as the report's method section lists it."""
        return {"step": self.step, "adapter": str(self.adapter_dir), "learning_rate": self.learning_rate,
                "weight": round(self.weight, 6), "is_adapter": self.is_adapter, "index_id": index_id}


@dataclass(frozen=True)
class EnsemblePlan:
    """The members to score (empty: the adapter alone) and, when fewer than asked, why."""

    members: tuple[EnsembleMember, ...] = ()
    note: str | None = None


def plan_ensemble(count: int, run_dir: Path | None, adapter_dir: Path | None, adapter_hash: str | None, *,
                  allow_pickle: bool = False) -> EnsemblePlan:
    """Up to ``count`` members: the adapter and the run's checkpoints nearest to evenly spaced steps before it."""
    if count <= 1:
        return EnsemblePlan()
    if run_dir is None or adapter_dir is None:
        return EnsemblePlan(note=f"attribution.checkpoints is {count}, but no training run was found next to the "
                                 "adapter, so it was scored alone; pass --run with the run's output dir")
    try:
        artifact = read_run(run_dir)
    except GradianError as error:
        return EnsemblePlan(note=f"the run at {run_dir} could not be read ({error.one_line()}), so the adapter was "
                                 "scored alone")
    # a checkpoint whose weights are a pickle is left out unless --allow-pickle, as an adapter would be refused
    weights = (ADAPTER_SAFETENSORS, ADAPTER_PICKLE) if allow_pickle else (ADAPTER_SAFETENSORS,)
    found = [(int(folder.name.rsplit("-", 1)[1]), folder) for folder in checkpoints(run_dir)
             if any((folder / name).is_file() for name in weights)]
    final_step = artifact.global_step
    if found and adapter_hash is not None and checkpoint_hash(found[-1][1], allow_pickle=allow_pickle) == adapter_hash:
        final_step = found.pop()[0]  # the last checkpoint is the adapter itself
    earlier = [(step, folder) for step, folder in found if final_step is None or step < final_step]
    if final_step is None and earlier:
        final_step = earlier[-1][0]
    chosen = _evenly_spaced(earlier, final_step or 0, count - 1)
    rates = logged_rates(artifact)
    points = [(step, folder, False) for step, folder in chosen] + [(final_step, adapter_dir, True)]
    learning_rates = [rate_at(rates, step) for step, _, _ in points]
    members = tuple(EnsembleMember(step, Path(folder), rate, weight, is_adapter) for (step, folder, is_adapter), rate,
                    weight in zip(points, learning_rates, _weights(learning_rates), strict=True))
    notes = []
    if len(members) < count:
        notes.append(f"attribution.checkpoints is {count}, and the run at {run_dir} kept "
                     f"{len(chosen)} checkpoint{'s' if len(chosen) != 1 else ''} before the adapter, "
                     f"so {len(members)} point{'s of the run were' if len(members) != 1 else ' of the run was'} scored")
    if len(members) > 1 and not all(rate is not None for rate in learning_rates):
        notes.append("the run logged no learning rate, so its checkpoints were weighted equally")
    return EnsemblePlan(members, "; ".join(notes) or None)


def checkpoint_hashes(plan: EnsemblePlan, *, allow_pickle: bool = False) -> list[str]:
    """The adapter hashes of the plan's checkpoints (not the adapter), whose indexes the ensemble builds."""
    return [checkpoint_hash(member.adapter_dir, allow_pickle=allow_pickle)
            for member in plan.members if not member.is_adapter]


def _evenly_spaced(found: Sequence[tuple[int, Path]], final_step: int, wanted: int) -> list[tuple[int, Path]]:
    """The checkpoints nearest to steps final_step x j / (wanted + 1), j = 1..wanted, each at most once, oldest first."""
    if wanted <= 0 or not found:
        return []
    if len(found) <= wanted:
        return list(found)
    chosen: list[tuple[int, Path]] = []
    left = list(found)
    for j in range(1, wanted + 1):
        target = final_step * j / (wanted + 1)
        nearest = min(left, key=lambda entry: (abs(entry[0] - target), entry[0]))
        left.remove(nearest)
        chosen.append(nearest)
    return sorted(chosen, key=lambda entry: entry[0])


def logged_rates(artifact: RunArtifact) -> list[tuple[int, float]]:
    """(step, learning rate) of every logged point of a run that has one, by step."""
    return sorted((m.step, float(m.learning_rate)) for m in artifact.metrics if m.learning_rate is not None)


def rate_at(rates: Sequence[tuple[int, float]], step: int | None) -> float | None:
    """The learning rate last logged at or before ``step`` (the first logged one before any log)."""
    if not rates:
        return None
    if step is None:
        return rates[-1][1]
    before = [rate for logged, rate in rates if logged <= step]
    return before[-1] if before else rates[0][1]


def _weights(rates: Sequence[float | None]) -> list[float]:
    """lr / sum(lr), or equal weights when some rate is unknown or they sum to nothing."""
    if all(rate is not None and rate >= 0 for rate in rates):
        total = float(sum(rates))  # type: ignore[arg-type]
        if total > 0:
            return [float(rate) / total for rate in rates]  # type: ignore[arg-type]
    return [1.0 / len(rates)] * len(rates)


@dataclass(frozen=True)
class EnsembleBlame:
    """The weighted per-item blame [examples, items] (None: the adapter alone), the members scored, and a note.

    ``scored`` pairs each member with what ``score_member`` kept of it (None for the adapter), so a later stage
    (the span drill-down) can work at the same points with the same weights.
    """

    item_blame: np.ndarray | None
    members: tuple[dict[str, Any], ...] = ()
    note: str | None = None
    scored: tuple[tuple[EnsembleMember, Any], ...] = ()


def score_checkpoints(plan: EnsemblePlan, loaded: LoadedModel, adapter_blame: np.ndarray,
                      adapter_index_id: str | None,
                      score_member: Callable[[LoadedModel], tuple[np.ndarray, str, Any]], *,
                      allow_pickle: bool = False) -> EnsembleBlame:
    """sum_c w_c B_c over the points of the run ``plan_ensemble`` chose.

    ``score_member(view)`` gives (B_c, index id, anything the caller wants back in ``scored``) under c.
    """
    if len(plan.members) < 2:
        return EnsembleBlame(None, note=plan.note)
    total = np.zeros_like(np.asarray(adapter_blame, dtype=np.float64))
    records, scored = [], []
    for member in plan.members:
        kept = None
        if member.is_adapter:
            blame, index_id = adapter_blame, adapter_index_id
        else:
            with checkpoint_weights(loaded, member.adapter_dir, allow_pickle=allow_pickle) as view:
                blame, index_id, kept = score_member(view)
        if blame.shape != total.shape:
            raise GradianError(f"checkpoint {member.adapter_dir} gave blame of shape {blame.shape}, the adapter "
                               f"{total.shape}", "report this with the gradian doctor output")
        total += member.weight * np.asarray(blame, dtype=np.float64)
        records.append(member.to_dict(index_id))
        scored.append((member, kept))
        logger.info("scored checkpoint %s (weight %.3g)", member.adapter_dir, member.weight)
    return EnsembleBlame(total, tuple(records), plan.note, tuple(scored))


def with_base_point(blame: np.ndarray, base_blame: np.ndarray, share: float, *, blocks: int = 1) -> np.ndarray:
    """(1 - share) x blame + share x base_blame, each scaled to unit norm first: the two are on different scales.

    With ``blocks`` > 1 the columns are that many equal blocks (queries of different generated weights), each mixed
    on its own scale, as when it is the only one.
    """
    def unit(matrix: np.ndarray) -> np.ndarray:
        norm = float(np.linalg.norm(matrix))
        return matrix / norm if norm > 0 else matrix

    if np.shape(blame) != np.shape(base_blame):
        raise GradianError(f"the base point gave blame of shape {np.shape(base_blame)}, the adapter "
                           f"{np.shape(blame)}", "report this with the gradian doctor output")
    blame, base_blame = np.asarray(blame, dtype=np.float64), np.asarray(base_blame, dtype=np.float64)
    if blocks == 1:  # any shape, a per-item vector included
        return (1.0 - share) * unit(blame) + share * unit(base_blame)
    pairs = zip(np.split(blame, blocks, axis=1), np.split(base_blame, blocks, axis=1), strict=True)
    return np.concatenate([(1.0 - share) * unit(own) + share * unit(base) for own, base in pairs], axis=1)


def base_point_record(share: float, index_id: str) -> dict[str, Any]:
    """The base point as the report's method section lists it, beside the checkpoints."""
    return {"step": 0, "adapter": "base point (the adapter's B matrices zeroed)", "learning_rate": None,
            "weight": round(share, 6), "is_adapter": False, "base_point": True, "index_id": index_id}
