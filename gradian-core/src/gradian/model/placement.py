"""Where a model runs and in which dtype: ``--device`` and ``--dtype`` resolved and checked once, before any loading.

``auto`` picks this process's GPU when CUDA is visible (``cuda:$LOCAL_RANK``, so each torchrun rank gets its own),
else MPS, else the CPU; its dtype is bfloat16 on CUDA (float16 on a GPU without bf16), float16 on MPS and float32
on the CPU. Only the base model takes the dtype: LoRA weights and captured gradients stay float32.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradian.errors import DeviceError

if TYPE_CHECKING:
    import torch

AUTO = "auto"
DTYPES = ("float32", "bfloat16", "float16")
LORA_DTYPE = "float32"
DEVICE_HINT = "use auto, cpu, cuda, cuda:N or mps; `gradian doctor` lists the visible devices"
_CUDA = re.compile(r"^cuda(?::(\d+))?$")


@dataclass(frozen=True)
class Placement:
    """A checked device (``cpu``, ``cuda:0``, ``mps``) and base-model dtype (``float32``, ``bfloat16``, ``float16``)."""

    device: str
    dtype: str

    @property
    def device_type(self) -> str:
        """``cpu``, ``cuda`` or ``mps``: what the index id records (the GPU's number does not change a gradient)."""
        return self.device.split(":", 1)[0]

    @property
    def torch_device(self) -> torch.device:
        """The device as a torch.device."""
        import torch

        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The base model's dtype as a torch.dtype."""
        import torch

        return getattr(torch, self.dtype)

    def to_dict(self) -> dict[str, str]:
        """The placement as the index manifest and the cache keys record it."""
        return {"device_type": self.device_type, "base_dtype": self.dtype, "lora_dtype": LORA_DTYPE}

    def __str__(self) -> str:
        return f"{self.device} {self.dtype}"


@dataclass(frozen=True)
class Accelerators:
    """What this machine offers: each visible CUDA GPU (name, native bfloat16) and whether MPS is there."""

    cuda_names: tuple[str, ...] = ()
    cuda_bf16: tuple[bool, ...] = ()
    mps: bool = False

    @property
    def cuda_count(self) -> int:
        """Visible CUDA devices."""
        return len(self.cuda_names)


def detect_accelerators() -> Accelerators:
    """The accelerators torch sees in this process (initializes CUDA only when a GPU is visible)."""
    import torch

    names: list[str] = []
    bf16: list[bool] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            names.append(f"{properties.name}, compute capability {properties.major}.{properties.minor}")
            # torch.cuda.is_bf16_supported(including_emulation=False), for this GPU rather than the current one.
            bf16.append(bool(torch.version.hip) or properties.major >= 8)
    backend = getattr(torch.backends, "mps", None)
    return Accelerators(tuple(names), tuple(bf16), bool(backend is not None and backend.is_available()))


def resolve_placement(device: str = AUTO, dtype: str = AUTO, *, accelerators: Accelerators | None = None) -> Placement:
    """The placement ``device`` and ``dtype`` name on this machine; DeviceError when it cannot run here."""
    machine = accelerators if accelerators is not None else detect_accelerators()
    target = _resolve_device(str(device).strip(), machine)
    return Placement(target, _resolve_dtype(str(dtype).strip(), target, machine))


def _resolve_device(device: str, machine: Accelerators) -> str:
    if device == AUTO:
        if machine.cuda_count:
            return f"cuda:{_rank_gpu(machine.cuda_count)}"
        return "mps" if machine.mps else "cpu"
    if device == "cpu":
        return "cpu"
    if device == "mps":
        if not machine.mps:
            raise DeviceError("device 'mps' was asked for but MPS is not available on this machine",
                              "use --device cpu or auto; `gradian doctor` lists the visible devices")
        return "mps"
    cuda = _CUDA.match(device)
    if cuda is None:
        raise DeviceError(f"unknown device {device!r}", DEVICE_HINT)
    count = machine.cuda_count
    if not count:
        raise DeviceError(f"device {device!r} was asked for but no CUDA GPU is visible",
                          "use --device cpu or auto; `gradian doctor` lists the visible devices")
    if cuda.group(1) is None:  # plain "cuda": this rank's GPU, as auto picks it
        return f"cuda:{_rank_gpu(count)}"
    index = int(cuda.group(1))
    if index >= count:
        raise DeviceError(f"device {device!r} does not exist: {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})",
                          "pass one of the visible devices; `gradian doctor` lists them")
    return f"cuda:{index}"


def _rank_gpu(count: int) -> int:
    """This process's GPU: LOCAL_RANK under torchrun (0 otherwise); a launcher that shows each rank one GPU gives 0."""
    text = os.environ.get("LOCAL_RANK", "").strip() or "0"
    if not text.isdigit():
        raise DeviceError(f"LOCAL_RANK={text!r} is not a process number",
                          "unset LOCAL_RANK, or launch with torchrun, which sets it")
    rank = int(text)
    if rank < count:
        return rank
    if count == 1:
        return 0
    raise DeviceError(f"LOCAL_RANK={rank} but only {count} CUDA devices are visible",
                      "launch at most one process per GPU, or pass --device cuda:N")


def _resolve_dtype(dtype: str, device: str, machine: Accelerators) -> str:
    device_type, _, index = device.partition(":")
    bf16 = device_type == "cuda" and machine.cuda_bf16[int(index)]
    if dtype == AUTO:
        if device_type == "cuda":
            return "bfloat16" if bf16 else "float16"
        return "float16" if device_type == "mps" else "float32"
    if dtype not in DTYPES:
        raise DeviceError(f"unknown dtype {dtype!r}", "use auto, float32, bfloat16 or float16")
    if dtype == "float16" and device_type == "cpu":
        raise DeviceError("dtype float16 is refused on the CPU: its matmuls there are slow and lose precision",
                          "use --dtype bfloat16 (half the memory of float32) or float32")
    if dtype == "bfloat16" and device_type == "cuda" and not bf16:
        raise DeviceError(f"dtype bfloat16 is not supported on {device} ({machine.cuda_names[int(index)]})",
                          "use --dtype float16 or float32")
    return dtype
