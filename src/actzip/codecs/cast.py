"""A cast to a 16-bit float (``cast``), lossy: what a model trained in bf16 or fp16 sends and keeps anyway.

Format: ``data``, the tensor cast to ``dtype`` (round to nearest, ties to even). Decoding casts it back, which
is exact. This is the baseline a compressed boundary must beat on the wire: a float32 activation sent as
bfloat16 is half the bytes, and a bf16 model's activations are already that.

Guarantee, per element: ``|decode(encode(x)) - x| <= u * |x|`` with the unit roundoff ``u = 2**-8``
(bfloat16) or ``2**-11`` (float16), for every ``|x|`` in the target's normal range; below it (bfloat16: under
``2**-126``, as float32; float16: under ``2**-14``) the error is at most half the target's smallest subnormal
step. Not unbiased: nearest rounding has no random part.

Range: bfloat16 covers float32's range. float16's largest finite value is 65504; with ``check=True`` (default)
a finite input that would become inf raises :class:`InvalidValueError` (one host sync per encode, to read the
count); ``check=False`` syncs nothing and lets it become inf, as ``x.half()`` does. NaN and inf inputs are cast
as they are (a NaN stays NaN) and are refused by the check only for float16, where they cannot be told apart
from an overflow cheaply.
"""

from __future__ import annotations

import torch

from actzip.codecs.base import Codec
from actzip.core.checks import check_choice
from actzip.core.payload import Payload
from actzip.core.registry import register_codec
from actzip.errors import InvalidValueError

__all__ = ["CAST_DTYPES", "CastCodec", "unit_roundoff"]

CAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the gap between 1 and the next value of ``dtype``: the largest relative error of a nearest cast."""
    return torch.finfo(dtype).eps / 2


@register_codec("cast")
class CastCodec(Codec):
    """Casts to a 16-bit float. See the module docstring for the guarantee.

    Options:
      dtype: ``"bfloat16"`` (8 significant bits, float32's range) or ``"float16"`` (11 bits, up to 65504).
      check: with float16, raise on a finite value that would overflow (one host sync per encode).

    Payload: 2 bytes per element, no header.
    """

    lossless = False
    unbiased = False
    dtypes = (torch.float32, torch.float64)
    fixed_size = True

    def __init__(self, *, dtype: str = "bfloat16", check: bool = True) -> None:
        check_choice("cast", "dtype", dtype, tuple(CAST_DTYPES))
        check_choice("cast", "check", check, (True, False))
        self.dtype = dtype
        self.check_values = check

    def options(self) -> dict:
        return {"dtype": self.dtype, "check": self.check_values}

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        target = CAST_DTYPES[self.dtype]
        data = x.detach().to(target).contiguous()
        if self.check_values and target is torch.float16:
            n_bad = int((torch.isinf(data) & torch.isfinite(x)).sum())
            if n_bad:
                raise InvalidValueError(
                    f"cast: {name} has {n_bad} of {x.numel()} elements beyond float16's largest value (65504); "
                    f"use dtype='bfloat16', rescale the tensor, or check=False to let them become inf")
        return Payload(self.name, x.shape, x.dtype, x.device, {"data": data})

    def payload_layout(self, x: torch.Tensor) -> tuple[tuple[str, ...], dict]:
        return ("data",), {}

    def decode(self, payload: Payload) -> torch.Tensor:
        return self._own(payload).buffers["data"].to(payload.dtype)
