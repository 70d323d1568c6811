"""Per-example LoRA gradients of a whole batch from one forward and one backward, through hooks on lora_A / lora_B.

For a LoRA Linear y = W x + s * B(A(dropout(x))): hooks keep x (lora_A's input), z (lora_B's input, = A x) and
y_B (lora_B's output); one autograd call returns a = dL/dz and b = dL/dy_B for the whole batch (the scaling s is
inside b). Per example i: grad_A_i = sum_t a_t^T x_t (r x d_in) and grad_B_i = sum_t b_t^T z_t (d_out x r).
The batch loss is the sum of the examples' own losses, so nothing mixes between examples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gradian.grads.batch import Batch, as_batch
from gradian.grads.loss import REDUCTIONS, SupervisedLoss, supervised_loss, supervised_positions
from gradian.grads.projection import FactoredProjection, ProjectionPlan, lora_matrices, resolve_projection
from gradian.grads.whitening import MomentAccumulator, Whitening
from gradian.model.lora_blocks import LoraBlock, block_modules

if TYPE_CHECKING:
    from gradian.config import GradsConfig
    from gradian.model.loaded import LoadedModel

Hook = Callable[[torch.nn.Module, tuple[Any, ...], torch.Tensor], None]


class WhitenedIndex(Protocol):
    """What ``for_index`` reads of an index (``gradian.index.store.Index``, a layer above this one)."""

    def whitening(self) -> Whitening | None:
        """The scaling applied before the sketch, or None when unscaled."""


@dataclass(frozen=True)
class LayoutEntry:
    """Where one LoRA matrix's (possibly sketched) gradient sits in the flat per-example vector."""

    block: str
    matrix: str  # "A" or "B"
    shape: tuple[int, int]  # stored shape: exact (r, d_in) / (d_out, r), or the sketch's (k_rows, k_cols)
    offset: int

    @property
    def size(self) -> int:
        """Numbers stored for this matrix."""
        return self.shape[0] * self.shape[1]

    def to_json(self) -> dict[str, Any]:
        """Plain dict for the manifest."""
        return {"block": self.block, "matrix": self.matrix, "shape": list(self.shape), "offset": self.offset}


@dataclass(frozen=True)
class CapturedBatch:
    """One batch's per-example gradients (flat, float32) with the losses they are gradients of."""

    gradients: torch.Tensor  # [B, dim] float32
    losses: torch.Tensor  # [B] per-example loss (sum or mean over its supervised tokens)
    token_counts: torch.Tensor  # [B] supervised tokens per example
    logit_rows: int  # rows of the vocab-sized fp32 tensor (= supervised tokens in the batch)


class _Recorder:
    """Tensors seen by the hooks during one forward, per block and per call."""

    def __init__(self, count: int) -> None:
        self.inputs: list[list[torch.Tensor]] = [[] for _ in range(count)]  # x, lora_A's input
        self.mids: list[list[torch.Tensor]] = [[] for _ in range(count)]  # z, lora_B's input
        self.outs: list[list[torch.Tensor]] = [[] for _ in range(count)]  # y_B, lora_B's output


class GradientCapture:
    """Captures exact (or factored-projected) per-example gradients of the selected LoRA blocks.

    ``capture(batch)`` returns a float32 [batch, dim] tensor in ``block_layout`` order (A then B per block).
    """

    def __init__(self, loaded: LoadedModel, blocks: Sequence[LoraBlock] | None = None, *,
                 projection_dim: int | str | None = None, seed: int = 0, loss_reduction: str = "sum",
                 module_filter: str | None = None, output_device: str | torch.device = "cpu") -> None:
        if loss_reduction not in REDUCTIONS:
            raise ValueError(f"loss_reduction must be one of {REDUCTIONS}, not {loss_reduction!r}")
        self.loaded = loaded
        self.blocks: tuple[LoraBlock, ...] = tuple(blocks) if blocks is not None else tuple(loaded.blocks(module_filter))
        if not self.blocks:
            raise ValueError("GradientCapture needs at least one LoRA block")
        self.loss_reduction = loss_reduction
        self.output_device = torch.device(output_device)
        self._modules = [block_modules(loaded.model, block, loaded.adapter_name) for block in self.blocks]
        plan = resolve_projection(self.blocks, projection_dim, seed)
        self.projection: FactoredProjection | None = FactoredProjection(plan) if plan is not None else None
        # Transforms applied to each matrix's factors before the sketch (a projected index's preconditioner).
        self.whitening: Whitening | None = None
        self.block_layout: tuple[LayoutEntry, ...] = self._layout()
        self.dim: int = plan.dim if plan is not None else self.block_layout[-1].offset + self.block_layout[-1].size

    @classmethod
    def from_config(cls, loaded: LoadedModel, grads: GradsConfig,
                    blocks: Sequence[LoraBlock] | None = None) -> GradientCapture:
        """A capture configured by a GradsConfig (module_filter, projection_dim, seed, loss_reduction)."""
        return cls(loaded, blocks, projection_dim=grads.projection_dim, seed=grads.seed,
                   loss_reduction=grads.loss_reduction, module_filter=grads.module_filter)

    @classmethod
    def for_index(cls, loaded: LoadedModel, grads: GradsConfig, index: WhitenedIndex) -> GradientCapture:
        """A capture whose gradients live in ``index``'s space: its settings, and its scaling before the sketch."""
        capture = cls.from_config(loaded, grads)
        capture.whitening = index.whitening()
        return capture

    @property
    def projection_plan(self) -> ProjectionPlan | None:
        """The projection plan, or None for exact gradients."""
        return None if self.projection is None else self.projection.plan

    def _layout(self) -> tuple[LayoutEntry, ...]:
        entries, offset = [], 0
        for index, block in enumerate(self.blocks):
            for position, (matrix, exact) in enumerate((("A", (block.r, block.d_in)), ("B", (block.d_out, block.r)))):
                shape = exact
                if self.projection is not None:
                    sketch = self.projection.plan.sketches[2 * index + position]
                    shape = (sketch.k_rows, sketch.k_cols)
                entries.append(LayoutEntry(block.name, matrix, shape, offset))
                offset += shape[0] * shape[1]
        return tuple(entries)

    def spec(self) -> dict[str, Any]:
        """What defines these gradients, for manifests and cache keys."""
        return {
            "blocks": [block.to_json() for block in self.blocks],
            "layout": [entry.to_json() for entry in self.block_layout],
            "dim": self.dim,
            "loss_reduction": self.loss_reduction,
            "projection": None if self.projection is None else self.projection.plan.to_json(),
        }

    def capture(self, batch: Batch | Mapping[str, Any]) -> torch.Tensor:
        """Per-example gradients [batch, dim], float32."""
        return self.capture_full(batch).gradients

    def capture_full(self, batch: Batch | Mapping[str, Any]) -> CapturedBatch:
        """Per-example gradients with their losses and supervised-token counts."""
        batch = as_batch(batch).to(self.loaded.device)
        result = torch.zeros((batch.size, self.dim), dtype=torch.float32, device=self.loaded.device)
        traced = self._trace(batch)
        if traced is None:  # nothing supervised: a zero gradient, never a NaN
            zeros = torch.zeros(batch.size, dtype=torch.float32)
            return CapturedBatch(result.to(self.output_device), zeros, torch.zeros(batch.size, dtype=torch.long), 0)
        recorder, grads, loss, width = traced
        with torch.no_grad():  # the products below are data, not part of any graph
            for index, gradient in self._matrix_gradients(recorder, grads, loss, batch.size, width, exact=False):
                entry = self.block_layout[index]
                result[:, entry.offset:entry.offset + entry.size] = gradient.reshape(batch.size, -1)
        del recorder, grads  # drop the batch's activations before returning
        return CapturedBatch(result.to(self.output_device), loss.per_example.float().cpu(),
                             loss.token_counts.cpu(), loss.logit_rows)

    def measure_moments(self, batch: Batch | Mapping[str, Any], moments: MomentAccumulator) -> None:
        """Add the batch's exact, unscaled matrix gradients to ``moments`` (what a whitening is fitted from)."""
        batch = as_batch(batch).to(self.loaded.device)
        traced = self._trace(batch)
        moments.examples += batch.size
        if traced is None:
            return
        recorder, grads, loss, width = traced
        with torch.no_grad():
            for index, gradient in self._matrix_gradients(recorder, grads, loss, batch.size, width, exact=True):
                moments.add(index, gradient)

    def exact_shapes(self) -> list[tuple[int, int]]:
        """(rows, cols) of every LoRA matrix gradient, in layout order."""
        return [(rows, cols) for _, _, rows, cols in lora_matrices(self.blocks)]

    def _trace(self, batch: Batch) -> tuple[_Recorder, list[torch.Tensor | None], SupervisedLoss, int] | None:
        """One forward and one backward of the batch with the hooks on; None when nothing in it is supervised."""
        if torch.is_inference_mode_enabled():
            raise RuntimeError("gradient capture cannot run inside torch.inference_mode(); call it outside that context")
        model = self.loaded.model
        model.eval()
        positions = supervised_positions(batch.labels)
        if positions.count == 0:
            return None
        recorder = _Recorder(len(self.blocks))
        handles = []
        try:
            for index, (lora_a, lora_b) in enumerate(self._modules):
                handles.append(lora_a.register_forward_hook(_record_input(recorder.inputs[index])))
                handles.append(lora_b.register_forward_hook(_record_mid_and_out(recorder.mids[index], recorder.outs[index])))
            with torch.enable_grad():
                loss = supervised_loss(model, batch, self.loss_reduction, positions)
                grads = self._backward(loss, recorder)
        finally:
            for handle in handles:
                handle.remove()
        return recorder, grads, loss, positions.width

    def _backward(self, loss: SupervisedLoss, recorder: _Recorder) -> list[torch.Tensor | None]:
        """dL/dz and dL/dy_B of every recorded call, from one backward; LoRA .grad is never touched."""
        for index, block in enumerate(self.blocks):
            if not recorder.inputs[index] or len(recorder.inputs[index]) != len(recorder.outs[index]):
                raise RuntimeError(f"LoRA block {block.name} was not called as lora_B(lora_A(x)) in the forward")
        wanted = [t for calls in recorder.mids for t in calls] + [t for calls in recorder.outs for t in calls]
        return list(torch.autograd.grad(loss.total, wanted, allow_unused=True))

    def _matrix_gradients(self, recorder: _Recorder, grads: list[torch.Tensor | None], loss: SupervisedLoss,
                          size: int, width: int, *, exact: bool) -> Iterator[tuple[int, torch.Tensor]]:
        """(layout index, per-example gradients [B, rows, cols]) of every matrix, summed over its calls."""
        calls = sum(len(c) for c in recorder.mids)
        mid_grads, out_grads = iter(grads[:calls]), iter(grads[calls:])
        for index in range(len(self.blocks)):
            total_a = total_b = None
            for x, z, y in zip(recorder.inputs[index], recorder.mids[index], recorder.outs[index], strict=True):
                a, b = next(mid_grads), next(out_grads)
                a = torch.zeros_like(z) if a is None else a
                b = torch.zeros_like(y) if b is None else b
                ga = self._per_example(2 * index, a, x, loss, size, width, exact)
                gb = self._per_example(2 * index + 1, b, z, loss, size, width, exact)
                total_a = ga if total_a is None else total_a + ga
                total_b = gb if total_b is None else total_b + gb
            yield 2 * index, total_a
            yield 2 * index + 1, total_b

    def _per_example(self, sketch_index: int, out_grad: torch.Tensor, inp: torch.Tensor, loss: SupervisedLoss,
                     size: int, width: int, exact: bool = False) -> torch.Tensor:
        """sum_t out_t^T in_t per example, [B, rows, cols] (scaled, then sketched, before the product unless exact)."""
        out_grad, inp = out_grad.float(), inp.float()
        if self.whitening is not None and not exact:
            row_side, col_side = self.whitening.matrices(sketch_index, out_grad.device)
            out_grad, inp = _transformed(out_grad, row_side), _transformed(inp, col_side)
        if self.projection is not None and not exact:
            rows, cols = self.projection.matrices(sketch_index, out_grad.device)
            out_grad = out_grad if rows is None else out_grad @ rows.T
            inp = inp if cols is None else inp @ cols.T
        if out_grad.dim() == 2 and out_grad.shape[0] == size * width:  # layers that flatten tokens, e.g. MoE experts
            out_grad, inp = out_grad.reshape(size, width, -1), inp.reshape(size, width, -1)
        if out_grad.dim() == 3 and out_grad.shape[0] == size:
            return torch.bmm(out_grad.transpose(1, 2), inp)
        if out_grad.dim() == 2 and out_grad.shape[0] == loss.logit_rows:  # a LoRA lm_head sees the gathered rows
            gradient = out_grad.new_zeros((size, out_grad.shape[1], inp.shape[1]))
            counts = loss.token_counts.tolist()
            start = 0
            for example, count in enumerate(counts):
                if count:
                    gradient[example] = out_grad[start:start + count].T @ inp[start:start + count]
                start += count
            return gradient
        raise RuntimeError(f"cannot assign LoRA activations of shape {tuple(inp.shape)} to the {size} examples of the batch")


def _transformed(factor: torch.Tensor, transform: torch.Tensor) -> torch.Tensor:
    """A factor's last dimension through a symmetric transform (a matrix) or a diagonal one (a vector)."""
    return factor @ transform if transform.dim() == 2 else factor * transform


def _record_input(store: list[torch.Tensor]) -> Hook:
    def hook(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        store.append(args[0])
    return hook


def _record_mid_and_out(mids: list[torch.Tensor], outs: list[torch.Tensor]) -> Hook:
    def hook(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        mids.append(args[0])
        outs.append(output)
    return hook
