"""A preallocated device buffer for variable-size payloads, with device-side offsets.

The size of a sparse payload depends on the data. Allocating it exactly needs the size on the host, which
means waiting for the GPU (a host synchronization) for every tensor. The arena avoids that: one buffer is
allocated up front, and each payload reserves its bytes by moving a cursor that lives on the device, so the
whole reservation is a few device operations queued like any other kernel.

Overflow never loses data. A reservation that does not fit is refused on the device (the cursor is moved
back, the payload's ``ok`` flag is false and nothing is written); the refusal is counted on the device, and
the owner of the payload must keep a way to rebuild the tensor (the fused MLP recomputes it from its saved
input). ``ok`` is copied to pinned host memory behind an event, so the host learns the outcome without a
synchronization once the GPU has passed that point (in backward it always has).

Sizing: pass ``capacity_bytes``, or let :meth:`fit` size the buffer from the high-water mark of earlier steps
times ``margin``. ``reset()`` starts a new step (a device operation). Reading statistics (``used_bytes``,
``high_water_bytes``, ``overflows``) synchronizes: do it between steps, not inside one.
"""

from __future__ import annotations

import torch

from actzip.core.errors import ConfigError

ALIGN = 16  # bytes; every reservation starts on a 16-byte boundary (vector loads, any element type)


class Reservation:
    """One payload's share of an arena: ``start`` byte offset and ``ok`` flag, both on the device."""

    __slots__ = ("start", "ok", "_host_ok", "_event")

    def __init__(self, start: torch.Tensor, ok: torch.Tensor) -> None:
        self.start, self.ok = start, ok  # ok: bool, or an integer that is 1 if granted
        self._host_ok = None
        self._event = None
        if ok.is_cuda:
            self._host_ok = torch.empty(1, dtype=ok.dtype, pin_memory=True)
            self._host_ok.copy_(ok.view(1), non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def fits(self) -> bool:
        """Whether the reservation was granted. On CUDA this waits for the event only if the GPU has not
        reached it yet (never the case by the time backward needs the answer)."""
        if self._event is None:
            return bool(self.ok)
        self._event.synchronize()
        return bool(self._host_ok[0])


class Arena:
    """Preallocated device memory for payloads whose sizes are only known on the device."""

    def __init__(self, capacity_bytes: int | None = None, *, device: str | torch.device = "cuda", margin: float = 1.25) -> None:
        if margin < 1.0:
            raise ConfigError(f"Arena: margin must be >= 1.0, got {margin!r}")
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ConfigError(f"Arena: capacity_bytes must be >= 0, got {capacity_bytes!r}")
        self.device = torch.device(device)
        self.margin = margin
        # [cursor, wanted, high_water, overflows] in one tensor, so that a kernel can update them all
        # (actzip.kernels.sparse_encode_triton reserves inside the encoder). wanted: bytes asked for this step,
        # granted or not; high_water: most wanted in one step; overflows: refusals since creation.
        self.counters = torch.zeros(4, dtype=torch.int64, device=self.device)
        self._cursor, self._wanted, self._high_water, self._overflows = (self.counters[i:i + 1] for i in range(4))
        self.buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
        if capacity_bytes:
            self.buffer = torch.empty(_aligned(capacity_bytes), dtype=torch.uint8, device=self.device)

    @property
    def capacity_bytes(self) -> int:
        return self.buffer.numel()

    def reserve(self, nbytes: torch.Tensor) -> Reservation:
        """Reserve ``nbytes`` (an int64 device tensor of one element) without leaving the device."""
        size = (nbytes.view(1).to(torch.int64) + (ALIGN - 1)) // ALIGN * ALIGN
        start = self._cursor.clone()
        end = start + size
        ok = end <= self.capacity_bytes
        self._wanted += size
        self._cursor.copy_(torch.where(ok, end, start))  # refused: the cursor stays, later tensors may still fit
        torch.maximum(self._high_water, self._wanted, out=self._high_water)
        self._overflows += (~ok).to(torch.int64)
        return Reservation(start, ok)

    def view(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole buffer as ``dtype`` elements (capacity is a multiple of 16 bytes)."""
        return self.buffer.view(dtype)

    def reset(self) -> None:
        """Start a new step: every earlier reservation is released (device operations only)."""
        self.counters[:2].zero_()

    # -- between steps (these synchronize) -------------------------------------------------------------------

    def used_bytes(self) -> int:
        return int(self._cursor)

    def high_water_bytes(self) -> int:
        """Most bytes asked for in one step since creation (granted or not)."""
        return int(self._high_water)

    def overflows(self) -> int:
        """Reservations refused since creation."""
        return int(self._overflows)

    def fit(self) -> int:
        """Resize to ``margin`` times the high-water mark if that is more than the capacity; returns capacity.

        Call between steps (it synchronizes and may allocate). Existing payloads must not be in use.
        """
        want = _aligned(int(self.high_water_bytes() * self.margin))
        if want > self.capacity_bytes:
            self.buffer = torch.empty(0, dtype=torch.uint8, device=self.device)  # free first: no two buffers at once
            self.buffer = torch.empty(want, dtype=torch.uint8, device=self.device)
        return self.capacity_bytes

    def __repr__(self) -> str:
        return f"Arena(capacity_bytes={self.capacity_bytes}, device={self.device}, margin={self.margin})"


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
