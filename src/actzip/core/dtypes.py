"""dtype helpers: which float formats actzip codecs take, and their bit-level integer views.

Codecs that must be lossless move raw bits, never float values, so -0.0, subnormals, inf and NaN payloads
survive untouched. Each supported float dtype maps to an integer dtype of the same width to view it as.
"""

from __future__ import annotations

import torch

from actzip.errors import UnsupportedDtypeError, UnsupportedLayoutError

# float dtype -> same-width integer dtype used to move its bits.
_BIT_VIEW: dict[torch.dtype, torch.dtype] = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _BIT_VIEW[getattr(torch, _name)] = torch.uint8

FLOAT_DTYPES: tuple[torch.dtype, ...] = tuple(_BIT_VIEW)
# What the lossy codecs take: the dtypes they can compute in float32 (float64 for float64).
LOSSY_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def bit_width(dtype: torch.dtype) -> int:
    """Bits per element of ``dtype``."""
    return dtype.itemsize * 8


def bit_view_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of the same width as the float ``dtype``."""
    try:
        return _BIT_VIEW[dtype]
    except KeyError:
        raise UnsupportedDtypeError(f"dtype {dtype} has no bit view; supported: {dtype_names(FLOAT_DTYPES)}") from None


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision lossy codecs compute in: float64 for float64 tensors, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def dtype_names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_dense_tensor(x: object, name: str, dtypes: tuple[torch.dtype, ...], codec: str) -> torch.Tensor:
    """Raise a clear actzip error unless ``x`` is a strided tensor of one of ``dtypes``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{codec}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided or x.is_nested:
        raise UnsupportedLayoutError(
            f"{codec}: {name} has layout {x.layout}{' (nested)' if x.is_nested else ''}; only dense "
            f"(torch.strided) tensors are supported: call .to_dense() first"
        )
    if x.dtype not in dtypes:
        raise UnsupportedDtypeError(
            f"{codec}: {name} has dtype {x.dtype}, which this codec cannot take; supported: {dtype_names(dtypes)}"
        )
    return x
