"""What the lossy group codecs (``quant``, ``fp8``) share: options, padding into groups, the value check, and the
choice between the PyTorch code and the Triton kernels.

Both work over the tensor's elements in memory order (so a transposed or channels-last tensor is grouped the
way it lies in memory, and comes back with its strides; a view with gaps is taken in its order of strides and
comes back dense in that order: copied, or read in place by the Triton kernels when it is rows of whole groups,
like attention's q, k and v cut from one projection), split into groups of ``group_size`` elements; the last
group is padded by repeating the last element, which leaves its range unchanged. Arithmetic runs in float32
(float64 for float64 tensors) and per-group parameters are stored in that precision.

Non-finite input: with ``check=True`` (default) encoding a tensor with inf or NaN raises
:class:`InvalidValueError` (one host sync per encode, to read the count). With ``check=False`` nothing is
synchronized and every group holding a non-finite value decodes to NaN in all its elements: never to finite
numbers. ``quant(scale="minmax")`` also needs ``max - min`` of each group to be finite in the working
precision (values below half the largest float32, or float64, in magnitude always are); a group that
overflows is refused, or becomes NaN, the same way.

Stochastic rounding draws from the counter-based generator of :mod:`actzip.codecs.counter_rng`, the same in
the PyTorch code and in the Triton kernels, so both make identical payloads.

Implementations (option ``kernel``, see :mod:`actzip.codecs.kernel_choice`): the PyTorch code of the codecs,
which is the reference, and the Triton kernels (:mod:`actzip.kernels.quant`, :mod:`actzip.kernels.fp8`), which
make identical buffers for float32, float16 and bfloat16 tensors with groups of at most
:data:`KERNEL_MAX_GROUP` elements. Both compute every step in the same IEEE float32 operations (a division by a
tensor, never by a Python number, which PyTorch on CUDA replaces by a multiplication with the reciprocal; no
fused multiply-add), mirror each integer step, store a +0.0 for a -0.0 group parameter, and write zero codes
and NaN parameters for the groups of a non-finite input.
"""

from __future__ import annotations

import torch

from actzip.codecs.base import Codec
from actzip.codecs.counter_rng import stream_keys
from actzip.codecs.kernel_choice import KERNELS, use_triton
from actzip.core.checks import check_choice, check_seed
from actzip.core.dtypes import LOSSY_DTYPES, work_dtype
from actzip.core.layout import memory_perm
from actzip.core.payload import Payload
from actzip.errors import InvalidValueError

__all__ = ["DEFAULT_GROUP_SIZE", "KERNEL_DTYPES", "KERNEL_MAX_GROUP", "ROUNDINGS", "LossyCodec", "group_rows"]

ROUNDINGS = ("stochastic", "nearest")
DEFAULT_GROUP_SIZE = 128
KERNEL_MAX_GROUP = 4096  # largest group the Triton kernels take (one group must fit one program's registers)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # dtypes the Triton kernels take


def group_rows(flat: torch.Tensor, group_size: int, work: torch.dtype) -> torch.Tensor:
    """``flat`` as a (groups, group_size) tensor of ``work`` dtype, the tail padded with its last element.

    May be a view of ``flat``: never modify it in place.
    """
    n = flat.numel()
    v = flat.to(work)
    pad = -n % group_size
    if pad:
        v = torch.cat([v, v[-1:].expand(pad)])
    return v.view(-1, group_size)


class LossyCodec(Codec):
    """Base of the lossy group codecs: options checked alike, the random stream of each encode, the value
    check, and which implementation runs."""

    lossless = False
    fixed_size = True  # payload sizes follow from the tensor's shape and dtype: a compiled graph can hold them
    unbiased = False  # set per instance from ``rounding``
    dtypes = LOSSY_DTYPES

    def _init_common(self, rounding: str, seed, check: bool, kernel: str) -> None:
        check_choice(self.name, "rounding", rounding, ROUNDINGS)
        check_seed(self.name, seed)
        check_choice(self.name, "kernel", kernel, KERNELS)
        self.rounding = rounding
        self.seed = seed
        self.check_values = bool(check)
        self.kernel = kernel
        self.unbiased = rounding == "stochastic"
        self._draws = 0  # stochastic encodes so far: the stream of the next one

    def _next_keys(self) -> tuple[int, int]:
        """The keys of this encode's random stream (host-side counter: no device work, no synchronization)."""
        if self.rounding != "stochastic":
            return (0, 0)
        keys = stream_keys(0 if self.seed is None else self.seed, self._draws)
        self._draws += 1
        return keys

    @staticmethod
    def _kernel_problem(dtype: torch.dtype, group_size: int | None) -> str | None:
        """Why the Triton kernels cannot encode/decode such a tensor, or ``None``."""
        if dtype not in KERNEL_DTYPES:
            return f"{dtype} has no Triton kernel (they take float32, float16 and bfloat16)"
        if group_size is not None and group_size > KERNEL_MAX_GROUP:
            return f"group_size={group_size} is above the kernels' largest group ({KERNEL_MAX_GROUP})"
        return None

    def uses_triton(self, device: torch.device, dtype: torch.dtype, group_size: int | None) -> bool:
        """Whether this codec runs its Triton kernels for such a tensor (announces a fallback once).

        ``group_size``: elements per group, or ``None`` for one scale per tensor.
        """
        return use_triton(self.name, self.kernel, device, self._kernel_problem(dtype, group_size))

    def _refuse_non_finite(self, bad_groups: torch.Tensor, flat: torch.Tensor, name: str, what: str) -> None:
        """Raise if any group is flagged (the one host sync of a checked encode)."""
        if not int(bad_groups.sum()):
            return
        n_bad = int((~torch.isfinite(flat)).sum())  # only on the error path: a second sync is fine
        if n_bad:
            raise InvalidValueError(
                f"{self.name}: {name} has {n_bad} of {flat.numel()} elements non-finite (inf or NaN); {what} "
                f"cannot encode them (check=False encodes their groups as NaN)"
            )
        raise InvalidValueError(
            f"{self.name}: {name} has a group whose max - min overflows {work_dtype(flat.dtype)}; "
            f"use scale='absmax' or rescale the tensor"
        )

    def _payload(self, x: torch.Tensor, perm, buffers: dict) -> Payload:
        return Payload(self.name, x.shape, x.dtype, x.device, buffers=buffers, meta={**self._meta(x), "perm": perm})

    def _meta(self, x: torch.Tensor) -> dict:
        """The payload's meta for ``x`` but its ``perm``."""
        raise NotImplementedError

    def buffer_names(self) -> tuple[str, ...]:
        """The names of the payload's buffers, in the order a compiled graph carries them."""
        raise NotImplementedError

    def payload_layout(self, x: torch.Tensor) -> tuple[tuple[str, ...], dict]:
        """The buffer names (:meth:`buffer_names`) and the meta of the payload ``encode(x)`` makes, from ``x``'s
        shape, strides and dtype alone (a meta tensor will do)."""
        return self.buffer_names(), {**self._meta(x), "perm": memory_perm(x)}
