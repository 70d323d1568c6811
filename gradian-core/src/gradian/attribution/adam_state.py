"""Adam's second moment (exp_avg_sq) from a run's last checkpoint, laid out in the index's stored space.

The LESS / TrackStar optimizer correction divides train gradients by sqrt(v) + eps. transformers.Trainer saves
the optimizer as ``checkpoint-N/optimizer.pt``; its state is keyed by parameter position, and the Trainer
builds its parameter groups from ``named_parameters()`` in order, so the i-th trainable parameter of the same
adapter is the i-th optimizer slot. Shapes are checked one by one, so a mismatch is reported, never guessed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gradian.errors import RunDirError
from gradian.runs.hf_trainer import checkpoints

if TYPE_CHECKING:
    import torch

    from gradian.grads.capture import GradientCapture
    from gradian.model.loaded import LoadedModel


def latest_optimizer_file(run: str | Path | None) -> Path | None:
    """``optimizer.pt`` of the highest checkpoint-N of a run dir (or the run dir itself), if any."""
    if run is None:
        return None
    run = Path(run)
    for folder in [*reversed(checkpoints(run)), run]:
        if (folder / "optimizer.pt").is_file():
            return folder / "optimizer.pt"
    return None


def adam_second_moment(run: str | Path | None, capture: GradientCapture) -> np.ndarray:
    """Bias-corrected exp_avg_sq for every stored coordinate of an exact (unprojected) index."""
    import torch  # here, not at the top: gradian.attribution stays torch-free until a model is loaded

    path = latest_optimizer_file(run)
    if path is None:
        raise RunDirError("attribution.preconditioner=adam needs the run's optimizer state, and none was found",
                          "pass --run with a checkpoint-N/optimizer.pt, or use attribution.preconditioner=diagonal")
    if capture.projection is not None:
        raise RunDirError("attribution.preconditioner=adam works on exact gradients only",
                          "set grads.projection_dim=null, or use attribution.preconditioner=diagonal")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)  # never runs code from the file
        state, groups = saved["state"], saved["param_groups"]
    except Exception as error:
        raise RunDirError(f"{path} is not a readable optimizer state ({type(error).__name__})",
                          "point --run at the run directory the Trainer wrote") from None
    order = [index for group in groups for index in group["params"]]
    betas = {index: group.get("betas", (0.9, 0.999)) for group in groups for index in group["params"]}
    params = _trainable(capture.loaded)
    if len(order) != len(params):
        raise RunDirError(f"{path} has {len(order)} optimized tensors and the adapter {len(params)} trainable ones",
                          "use the run directory of this adapter's training")
    by_name = {}
    for slot, (name, param) in zip(order, params, strict=True):
        entry = state.get(slot)
        if entry is None or "exp_avg_sq" not in entry:
            raise RunDirError(f"{path} has no exp_avg_sq for {name}", "the optimizer was not Adam; use diagonal")
        v = entry["exp_avg_sq"].float()
        if tuple(v.shape) != tuple(param.shape):
            raise RunDirError(f"{path}: exp_avg_sq of {name} is {tuple(v.shape)}, the adapter's is {tuple(param.shape)}",
                              "use the run directory of this adapter's training")
        step = float(entry.get("step", 1))
        correction = 1.0 - betas[slot][1] ** max(step, 1.0)
        by_name[name] = (v / correction).numpy().astype(np.float64).ravel()
    return _stored_layout(capture, by_name)


def _trainable(loaded: LoadedModel) -> list[tuple[str, torch.nn.Parameter]]:
    """Trainable parameters in named_parameters() order, as the Trainer saw them."""
    return [(name, p) for name, p in loaded.model.named_parameters() if p.requires_grad]


def _stored_layout(capture: GradientCapture, by_name: dict[str, np.ndarray]) -> np.ndarray:
    """Concatenate per-matrix vectors in the capture's layout (block, A then B)."""
    out = np.zeros(capture.dim, dtype=np.float64)
    for entry in capture.block_layout:
        suffix = f".{entry.block}.lora_{entry.matrix}."
        matches = [name for name in by_name if suffix in f".{name.removeprefix('base_model.model.')}"]
        if len(matches) != 1:
            raise RunDirError(f"cannot find the optimizer state of {entry.block} lora_{entry.matrix}",
                              "use attribution.preconditioner=diagonal")
        out[entry.offset:entry.offset + entry.size] = by_name[matches[0]]
    return out
