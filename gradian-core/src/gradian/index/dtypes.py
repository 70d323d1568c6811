"""Storage dtypes of index rows: float32, float16, and bfloat16 kept as uint16 bit patterns.

numpy has no bfloat16, so a bfloat16 row is stored as the upper 16 bits of its float32 value
(rounded to nearest even) and widened back by a shift. Zero stays exactly zero in every dtype,
so a zero gradient (an example with no supervised tokens) never becomes NaN downstream.
"""

from __future__ import annotations

import warnings

import numpy as np

STORAGE_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),  # bit patterns
}


def storage_numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype a shard of the named storage dtype is written with."""
    try:
        return STORAGE_DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown storage dtype {name!r}; expected one of {', '.join(STORAGE_DTYPES)}") from None


def encode_rows(rows: np.ndarray, name: str) -> np.ndarray:
    """float32 rows -> the stored representation of the named dtype."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if name == "float32":
        return rows.astype("<f4", copy=False)
    if name == "float16":
        with np.errstate(over="ignore"):
            return rows.astype("<f2")
    if name == "bfloat16":
        bits = rows.view(np.uint32)
        # Round to nearest even on the 16 dropped bits (what torch's float32 -> bfloat16 cast does).
        rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
        nan = np.isnan(rows)
        if nan.any():
            rounded = np.where(nan, np.uint32(0x7FC0), rounded)
        return rounded.astype("<u2")
    raise ValueError(f"unknown storage dtype {name!r}")


def decode_rows(stored: np.ndarray, name: str) -> np.ndarray:
    """Stored rows of the named dtype -> a new float32 array (never a view of a memory map)."""
    if name not in STORAGE_DTYPES:
        raise ValueError(f"unknown storage dtype {name!r}")
    out = np.empty(np.shape(stored), dtype=np.float32)
    decode_rows_into(stored, name, out)
    return out


def decode_rows_into(stored: np.ndarray, name: str, out: np.ndarray) -> None:
    """Stored rows of the named dtype decoded straight into the float32 array ``out`` (no temporary copy)."""
    if name == "float32":
        out[...] = stored
    elif name in ("float16", "bfloat16"):
        # torch's half -> float cast is vectorized and threaded: ~8x numpy's on 2 cores, bit for bit the same.
        import torch  # here only: opening and scoring an index (gradian.attribution) stays torch-free

        half = np.ascontiguousarray(stored).view(np.uint16)
        with warnings.catch_warnings():  # a read-only memory map: torch only reads it here
            warnings.simplefilter("ignore", UserWarning)
            source = torch.from_numpy(half).view(torch.float16 if name == "float16" else torch.bfloat16)
        torch.from_numpy(out).copy_(source)
    else:
        raise ValueError(f"unknown storage dtype {name!r}")


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, computed in float64; an all-zero row stays all zero (never NaN)."""
    rows64 = np.asarray(rows, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", rows64, rows64))
    safe = np.where(norms > 0.0, norms, 1.0)
    return (rows64 / safe[:, None]).astype(np.float32)
