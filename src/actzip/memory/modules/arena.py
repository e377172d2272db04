"""A preallocated device buffer for variable-size payloads, with device-side offsets.

The size of a sparse payload depends on the data. Allocating it exactly needs the size on the host, which
means waiting for the GPU (a host synchronization) for every tensor. The arena avoids that: one buffer is
allocated up front, and each payload reserves its bytes by moving a cursor that lives on the device, so the
whole reservation is a few device operations queued like any other kernel.

A reservation that does not fit is refused on the device (the cursor is moved back, the payload's ``ok``
flag is false and nothing is written); the refusal is counted on the device. What happens next depends on
who decides:

- the host (the default, eagerly): ``ok`` is copied to pinned host memory behind an event, so the host
  learns the outcome without a synchronization once the GPU has passed that point (in backward it always
  has), and the owner rebuilds the tensor another way (the fused MLP recomputes it from its saved input);
- the device (``Arena(capturable=True)``, or whenever a CUDA graph is being captured: a captured graph
  cannot ask the host): nothing goes to the host; consumers read ``ok`` on the device and, for a refused
  payload, produce NaN (the fused MLP's gradients), never wrong numbers. :attr:`Arena.step_overflow` is then
  1.0, ready to be a fused optimizer's ``found_inf``, which skips the step.

Sizing: pass ``capacity_bytes``, or let :meth:`fit` size the buffer from the high-water mark of earlier steps
times ``margin``. ``margin="adaptive"`` fits with :data:`WARMUP_MARGIN` until :data:`SETTLE_STEPS` steps in a row
have fit, then holds at most :data:`SETTLED_MARGIN` times the largest of those steps: each ``reset()`` queues a
copy of the step's counters to pinned host memory behind an event and reads the ones whose event has passed,
so the arena learns its steps' sizes without a synchronization, and shrinks (a new, smaller buffer, made at a
step's start) once it has settled. A later step that outgrows it is refused, recomputed exactly and counted,
and the arena grows again (to :data:`SETTLED_MARGIN` times the new high-water mark). ``reset()`` starts a new step (a device operation). Reading statistics (``used_bytes``,
``high_water_bytes``, ``overflows``) synchronizes: do it between steps, not inside one. :class:`GraphedStep`
runs a training step as a CUDA graph and re-captures it when the arena has to grow.

Stepping: either the caller calls ``reset()`` once per step (and ``fit()`` after the first), or the arena
does it itself (``Arena(auto_reset=True)``, what ``SparseMLPConfig(arena="auto")`` makes): its consumers
open a :class:`PayloadTicket` per payload and close it in backward, and the first payload opened while no
ticket is open starts a new step, after a ``fit()`` if backward saw a refusal since the last one (the only
synchronization, in the steps after the arena had to grow). Either way a payload reserved before the latest
``reset()`` is stale (:meth:`Reservation.stale`, known on the host) and its consumers rebuild it another way,
so a late backward (over a retained graph) never reads values a later step overwrote.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from actzip.errors import ConfigError

ALIGN = 16  # bytes; every reservation starts on a 16-byte boundary (vector loads, any element type)

# The counters, one int64 tensor so that a kernel can update them all (actzip.kernels.sparse_encode
# reserves inside the encoder): cursor; wanted (bytes asked for this step, granted or not); high water (most
# wanted in one step); overflows (refusals since creation); step overflows (refusals this step); and the step
# flag, 0 or ONE_F32_BITS: its low-order four bytes are the float32 ``step_overflow``, 0.0 or 1.0.
CURSOR, WANTED, HIGH_WATER, OVERFLOWS, STEP_OVERFLOWS, STEP_FLAG = range(6)
N_COUNTERS = 6
ONE_F32_BITS = 0x3F800000  # float32 1.0
_KEPT_BY_RESET = (0, 0, 1, 1, 0, 0)
_FLAG_AS_F32 = 2 * STEP_FLAG + (sys.byteorder == "big")  # the float32 holding the word's low-order bytes

ADAPTIVE = "adaptive"  # the margin that starts wide and settles tight (see the module docstring)
WARMUP_MARGIN = 1.25  # while the steps' payload sizes still move (the first steps of training)
SETTLED_MARGIN = 1.05  # once they have settled: held at most this times the largest recent step
SETTLE_STEPS = 8  # steps in a row without a refusal that make the arena settled
PENDING_STEPS = 4  # counter copies in flight at most (pinned buffers reused once their copy has landed)


class Reservation:
    """One payload's share of an arena: ``start`` byte offset and ``ok`` flag, both on the device.

    ``device_only``: no host copy of ``ok`` was made (capturable arena, or made during graph capture); its
    consumers must read ``ok`` on the device instead of asking :meth:`fits`.
    """

    __slots__ = ("start", "ok", "device_only", "arena", "generation", "_host_ok", "_event")

    def __init__(self, start: torch.Tensor, ok: torch.Tensor, *, device_only: bool = False,
                 arena: "Arena | None" = None) -> None:
        self.start, self.ok = start, ok  # ok: bool, or an integer that is 1 if granted
        self.device_only = device_only
        self.arena = arena  # the arena reserved from, whose resets make this reservation stale
        self.generation = arena.generation if arena is not None else 0
        self._host_ok = None
        self._event = None
        if ok.is_cuda and not device_only:
            self._host_ok = torch.empty(1, dtype=ok.dtype, pin_memory=True)
            self._host_ok.copy_(ok.view(1), non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def fits(self) -> bool:
        """Whether the reservation was granted. On CUDA this waits for the event only if the GPU has not
        reached it yet (never the case by the time backward needs the answer); a ``device_only`` reservation
        synchronizes (never inside a captured graph)."""
        if self._event is None:
            return bool(self.ok)
        self._event.synchronize()
        return bool(self._host_ok[0])

    def stale(self) -> bool:
        """Whether the arena was reset since this reservation (its bytes may hold a later payload now)."""
        return self.arena is not None and self.arena.generation != self.generation


class PayloadTicket:
    """A payload of an ``auto_reset`` arena that backward has not consumed yet.

    :meth:`close` it once the payload is no longer needed (the end of its backward); one dropped unclosed (its
    autograd graph freed without a backward) closes itself.
    """

    __slots__ = ("arena",)

    def __init__(self, arena: "Arena") -> None:
        self.arena: Arena | None = arena
        arena._open += 1

    def close(self) -> None:
        if self.arena is not None:
            self.arena._open -= 1
            self.arena = None

    def __del__(self) -> None:
        self.close()


class Arena:
    """Preallocated device memory for payloads whose sizes are only known on the device.

    Args:
      capacity_bytes: initial size (rounded up to 16 bytes); None or 0: unsized until :meth:`fit`.
      device: where the buffer and the counters live.
      margin: :meth:`fit` sizes the buffer to ``margin`` (>= 1) times the high-water mark; ``"adaptive"``:
        :data:`WARMUP_MARGIN` at first, then at most :data:`SETTLED_MARGIN` times what recent steps used.
      capturable: never ask the host whether a reservation fit, even eagerly: a refused payload gives NaN
        gradients in the fused MLPs (and sets :attr:`step_overflow`) instead of being recomputed. False:
        the host decides (exact recompute) except while a CUDA graph is being captured, where it cannot.
      auto_reset: reset (and grow, after a refusal) by itself, at the first payload of a forward pass made
        while every earlier payload has been through backward (see the module docstring): no ``reset()`` /
        ``fit()`` calls needed in eager training. Not with ``capturable`` (the host never learns of a refusal
        there) and not inside a captured graph (:class:`GraphedStep` resets it there).
    """

    def __init__(
        self,
        capacity_bytes: int | None = None,
        *,
        device: str | torch.device = "cuda",
        margin: float | str = 1.25,
        capturable: bool = False,
        auto_reset: bool = False,
    ) -> None:
        if margin != ADAPTIVE and (not isinstance(margin, (int, float)) or isinstance(margin, bool) or margin < 1.0):
            raise ConfigError(f"Arena: margin must be a number >= 1.0 or 'adaptive', got {margin!r}")
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ConfigError(f"Arena: capacity_bytes must be >= 0, got {capacity_bytes!r}")
        if not isinstance(capturable, bool):
            raise ConfigError(f"Arena: capturable must be True or False, got {capturable!r}")
        if not isinstance(auto_reset, bool):
            raise ConfigError(f"Arena: auto_reset must be True or False, got {auto_reset!r}")
        if auto_reset and capturable:
            raise ConfigError(
                "Arena: auto_reset=True needs the host to learn of refusals, which a capturable arena never tells "
                "it; reset a capturable arena yourself (GraphedStep does)"
            )
        self.device = torch.device(device)
        self.margin = margin
        self.capturable = capturable
        self.auto_reset = auto_reset
        self.generation = 0  # resets so far: a reservation made before the latest one is stale
        self._open = 0  # auto_reset: payloads opened and not yet closed (PayloadTicket)
        self._refused_seen = False  # auto_reset: backward met a refused payload since the last reset
        self._pending: list = []  # adaptive: (event or None, pinned counters) of finished steps, in order
        self._free_host: list[torch.Tensor] = []  # adaptive, CUDA: pinned counter copies free for reuse
        self._recent: list[int] = []  # adaptive: bytes wanted by the latest steps without a refusal
        self.settled = False  # adaptive: SETTLE_STEPS steps in a row fit; fit() then uses SETTLED_MARGIN
        self.shrinks = 0  # adaptive: times the buffer was made smaller
        self.counters = torch.zeros(N_COUNTERS, dtype=torch.int64, device=self.device)
        self._cursor, self._wanted, self._high_water, self._overflows, self._step_overflows, _ = (
            self.counters[i:i + 1] for i in range(N_COUNTERS)
        )
        # 0-dim like GradScaler's found_inf: fused optimizers subtract it from their 0-dim step counts.
        self.step_overflow = self.counters.view(torch.float32)[_FLAG_AS_F32]
        self._kept_by_reset = torch.tensor(_KEPT_BY_RESET, dtype=torch.int64, device=self.device)
        self.buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
        if capacity_bytes:
            self.buffer = torch.empty(_aligned(capacity_bytes), dtype=torch.uint8, device=self.device)

    @property
    def capacity_bytes(self) -> int:
        return self.buffer.numel()

    def device_policy(self) -> bool:
        """Whether reservations made now are decided on the device only (see the module docstring)."""
        return self.capturable or (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing())

    def reserve(self, nbytes: torch.Tensor) -> Reservation:
        """Reserve ``nbytes`` (an int64 device tensor of one element) without leaving the device."""
        size = (nbytes.view(1).to(torch.int64) + (ALIGN - 1)) // ALIGN * ALIGN
        start = self._cursor.clone()
        end = start + size
        ok = end <= self.capacity_bytes
        self._wanted += size
        self._cursor.copy_(torch.where(ok, end, start))  # refused: the cursor stays, later tensors may still fit
        torch.maximum(self._high_water, self._wanted, out=self._high_water)
        self.counters[OVERFLOWS:STEP_OVERFLOWS + 1] += (~ok).to(torch.int64)
        torch.maximum(self.step_overflow, (~ok).to(torch.float32).view(()), out=self.step_overflow)
        return Reservation(start, ok, device_only=self.device_policy(), arena=self)

    def view(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole buffer as ``dtype`` elements (capacity is a multiple of 16 bytes)."""
        return self.buffer.view(dtype)

    def reset(self) -> None:
        """Start a new step: every earlier reservation is released and :attr:`step_overflow` cleared (one
        device operation; inside a captured step, capture it too). An adaptive arena first notes the finished
        step's size (no synchronization) and may shrink (see the module docstring)."""
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if self.margin == ADAPTIVE and not capturing:
            self._note_step()
        self.counters.mul_(self._kept_by_reset)
        self.generation += 1

    def _note_step(self) -> None:
        """Queue the finished step's counters to the host; take in those that arrived; shrink when settled."""
        if self.device.type == "cuda":
            if len(self._pending) < PENDING_STEPS:  # else skip this step's note: never wait for the device
                if not self._free_host:
                    self._free_host.append(torch.empty(N_COUNTERS, dtype=torch.int64, pin_memory=True))
                host = self._free_host.pop()
                host.copy_(self.counters, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                self._pending.append((event, host))
        else:
            self._pending.append((None, self.counters.clone()))
        while self._pending and (self._pending[0][0] is None or self._pending[0][0].query()):
            event, host = self._pending.pop(0)
            wanted, refused = int(host[WANTED]), int(host[STEP_OVERFLOWS])
            if event is not None:
                self._free_host.append(host)  # its copy has landed: reusable
            if wanted == 0:
                continue  # a reset with no step before it
            if refused:
                self._recent.clear()
                continue
            self._recent = (self._recent + [wanted])[-SETTLE_STEPS:]
        if len(self._recent) == SETTLE_STEPS:
            self.settled = True
            want = _aligned(int(max(self._recent) * SETTLED_MARGIN))
            if want < self.capacity_bytes:
                self._resize(want)
                self.shrinks += 1

    # -- auto_reset ------------------------------------------------------------------------------------------

    def open_payload(self) -> PayloadTicket | None:
        """Call before reserving a payload's bytes; close the ticket when backward is done with the payload.

        For an ``auto_reset`` arena, the first payload opened while none is open starts a new step: ``fit()``
        first if a refusal was met since the last step (a synchronization, and a new buffer), then ``reset()``.
        ``None`` for other arenas, and while a CUDA graph is being captured (whoever captures resets).
        """
        if not self.auto_reset or (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return None
        if self._open == 0:
            if self._refused_seen:
                self.fit()
                self._refused_seen = False
            self.reset()
        return PayloadTicket(self)

    def note_refusal(self) -> None:
        """Backward met a payload this arena had no room for: an ``auto_reset`` arena grows at its next step."""
        self._refused_seen = True

    # -- between steps (these synchronize) -------------------------------------------------------------------

    def used_bytes(self) -> int:
        return int(self._cursor)

    def high_water_bytes(self) -> int:
        """Most bytes asked for in one step since creation (granted or not)."""
        return int(self._high_water)

    def overflows(self) -> int:
        """Reservations refused since creation."""
        return int(self._overflows)

    def step_overflows(self) -> int:
        """Reservations refused since the last :meth:`reset`."""
        return int(self._step_overflows)

    def fit(self) -> int:
        """Resize to ``margin`` times the high-water mark if that is more than the capacity; returns capacity.

        Call between steps (it synchronizes and may allocate). Existing payloads must not be in use, and a
        captured graph that uses the old buffer must be captured again (:class:`GraphedStep` does).
        """
        margin = self.margin if self.margin != ADAPTIVE else SETTLED_MARGIN if self.settled else WARMUP_MARGIN
        want = _aligned(int(self.high_water_bytes() * margin))
        if want > self.capacity_bytes:
            self._resize(want)
        return self.capacity_bytes

    def _resize(self, nbytes: int) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8, device=self.device)  # free first: no two buffers at once
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def __repr__(self) -> str:
        return (f"Arena(capacity_bytes={self.capacity_bytes}, device={self.device}, margin={self.margin}, "
                f"capturable={self.capturable}, auto_reset={self.auto_reset})")


class GraphedStep:
    """A training step run as a CUDA graph, captured again whenever the arena has to grow.

    ``step()`` runs forward, backward and the optimizer step on static tensors (copy each batch into them,
    then call this object), and returns what the caller wants back (e.g. the loss). Start it with
    ``optimizer.zero_grad(set_to_none=True)`` so that backward allocates the gradients in the graph's memory,
    as torch's whole-network capture recipe wants; do not call ``arena.reset()`` in it (this does).

    Each call is one step. The first ``warmup`` calls run ``step()`` eagerly on a side stream (torch's
    warm-up before capture; a refused payload is recomputed there, exactly) and size the arena after each
    (:meth:`Arena.fit`). The next call captures the step and replays it; later calls replay it. In a replay a
    refused payload cannot be recomputed: its gradients are NaN, and ``optimizer`` (torch's Adam, AdamW or
    SGD with ``fused=True``; for capture also ``capturable=True``) skips the step, as it reads
    :attr:`Arena.step_overflow` as its ``found_inf``. That is set here for replays; for eager steps only with a
    capturable arena (otherwise an eager step with a refusal is exact: nothing to skip). :meth:`refit`,
    between steps, then grows the arena and drops the graph; the next call runs eagerly (call it on the same
    batch to redo the skipped step; it also warms up the kernels for the new capacity), the one after
    captures again. Returns ``step()``'s result; a replay returns the captured one, which the next replay
    overwrites.
    """

    def __init__(self, step: Callable[[], Any], arena: Arena, optimizer: torch.optim.Optimizer | None = None,
                 *, warmup: int = 3) -> None:
        if not isinstance(warmup, int) or warmup < 1:
            raise ConfigError(f"GraphedStep: warmup must be an int >= 1, got {warmup!r}")
        if optimizer is not None and not getattr(optimizer, "_step_supports_amp_scaling", False):
            raise ConfigError(
                "GraphedStep: optimizer must take found_inf (torch's Adam, AdamW or SGD with fused=True), got "
                f"{type(optimizer).__name__}"
            )
        if arena.device.type != "cuda":
            raise ConfigError(f"GraphedStep: arena must be on a CUDA device (graphs are CUDA's), not {arena.device}")
        self.step, self.arena, self.optimizer, self.warmup = step, arena, optimizer, warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0  # statistics: steps run eagerly, captures made
        self.captures = 0
        self._warm_left = warmup  # eager steps still to run before the next capture
        self._side = torch.cuda.Stream(arena.device)
        self._output = None
        self._buffer_ptr = None
        self._overflows = 0

    def __call__(self) -> Any:
        if self.graph is not None and self.arena.buffer.data_ptr() != self._buffer_ptr:
            self.graph = self._output = None  # the arena was resized: the graph would write into freed memory
            self._warm_left = 1
        if self.graph is None and self._warm_left == 0:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
            return self._output
        # Eagerly a non-capturable arena recomputes refused payloads: nothing to skip.
        self._set_found_inf(self.arena.step_overflow if self.arena.capturable else None)
        main = torch.cuda.current_stream(self.arena.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            self.arena.reset()
            out = self.step()
        main.wait_stream(self._side)
        self.arena.fit()
        self.eager_steps += 1
        self._warm_left = max(self._warm_left - 1, 0)
        return out

    def refit(self) -> bool:
        """Between steps (synchronizes): if a replay had a payload refused since the capture (its optimizer
        step was skipped), grow the arena, drop the graph and return True."""
        if self.graph is None or self.arena.overflows() == self._overflows:
            return False
        self.arena.fit()
        self.graph = self._output = None
        self._warm_left = 1
        return True

    def _capture(self) -> None:
        self._set_found_inf(self.arena.step_overflow)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.arena.reset()
            self._output = self.step()
        self.graph, self._buffer_ptr, self._overflows = graph, self.arena.buffer.data_ptr(), self.arena.overflows()
        self.captures += 1

    def _set_found_inf(self, flag: torch.Tensor | None) -> None:
        if self.optimizer is not None:
            self.optimizer.found_inf = flag


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
