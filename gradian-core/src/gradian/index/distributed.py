"""Ranks for distributed indexing: ``torchrun -m gradian index`` splits shards across processes.

Each rank computes a contiguous run of shard numbers, so every shard file is exactly the one a single
process writes; statistics are per-shard partials summed in shard order by rank 0, which writes the
manifest after a barrier. torch.distributed carries the control traffic (gloo on CPU, nccl on GPU):
the index id is broadcast and compared, and failures and row counts are all-reduced so that one rank's
error stops every rank instead of leaving the others waiting at a barrier.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from gradian.errors import GradianError, GradientIndexError

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions: the index command asks is_main_process before any model loads.

T = TypeVar("T")


@dataclass(frozen=True)
class RankContext:
    """This process's place in a (possibly one-process) indexing job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # None when not distributed
    owns_group: bool = False  # whether this context initialized torch.distributed (and so tears it down)

    @property
    def is_main(self) -> bool:
        """Whether this process writes the manifest and prints progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    def shard_range(self, num_shards: int) -> range:
        """The contiguous shard numbers this rank computes."""
        return range(self.rank * num_shards // self.world_size, (self.rank + 1) * num_shards // self.world_size)

    def close(self) -> None:
        """Tear down the process group if this context created it (a caller's own group is left alone)."""
        if self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def together(self, step: Callable[[], T]) -> T:
        """Run one step on every rank; when it fails on any rank it raises on every rank, so none waits forever."""
        if not self.distributed:
            return step()
        result: Any = None
        error: GradianError | None = None
        try:
            result = step()
        except GradianError as caught:
            error = caught
        failures = self.all_reduce_sum([0 if error is None else 1])[0]
        if error is not None:
            raise error
        if failures:
            raise GradientIndexError(f"{failures} other rank(s) of this distributed build failed; see their output",
                                     "fix the error they report and rerun the same command: finished shards are kept")
        return result

    def all_reduce_sum(self, values: list[int], device: torch.device | None = None) -> list[int]:
        """Element-wise sum of small integer vectors over every rank."""
        if not self.distributed:
            return list(values)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.int64, device=self._device(device))
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return [int(v) for v in tensor.cpu().tolist()]

    def check_same(self, value: str, what: str) -> None:
        """Refuse to go on when ranks disagree on ``value`` (they were given different inputs)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        holder = [value if self.is_main else None]
        dist.broadcast_object_list(holder, src=0)
        agree = self.all_reduce_sum([0 if holder[0] == value else 1])[0]
        if agree:
            raise GradientIndexError(
                f"the ranks of this distributed job disagree on the {what} ({agree} rank(s) differ from rank 0)",
                "launch every rank with the same --base-model, --adapter, --dataset and config",
            )

    def _device(self, device: torch.device | None) -> torch.device:
        import torch

        if self.backend == "nccl":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu") if device is None else device


def rank_context(device: torch.device | None = None) -> RankContext:
    """The rank context from torchrun's environment, initializing torch.distributed when needed."""
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world_size <= 1:
        return RankContext()
    import torch.distributed as dist

    if not dist.is_available():
        raise GradientIndexError("WORLD_SIZE is set but this torch has no torch.distributed",
                                 "run a single process, or install a torch build with distributed support")
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    owns = not dist.is_initialized()
    if owns:
        backend = "nccl" if _is_cuda(device) else "gloo"
        if backend == "nccl":
            import torch

            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
    return RankContext(dist.get_rank(), dist.get_world_size(), local_rank, dist.get_backend(), owns)


def _is_cuda(device: torch.device | str | None) -> bool:
    return device is not None and getattr(device, "type", str(device).split(":")[0]) == "cuda"


def is_main_process() -> bool:
    """Whether this process is rank 0 of a torchrun job (or not part of one): the one that prints."""
    return int(os.environ.get("RANK", "0") or 0) == 0
