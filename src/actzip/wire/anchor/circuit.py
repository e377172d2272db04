"""The anchor circuit: every K steps an unmasked forward and backward on a snapshot of the model, in a
background thread (and, on CUDA, its own stream), its gradients handed to the spectral correction D steps
later; the fast circuit never waits for it.

``anchor = AnchorCircuit(model, correction, AnchorConfig(every=8, delay=2))``, then each fast step::

    anchor.maybe_launch(step, lambda m: unmasked_loss(m, batch))   # every `every` steps: starts one
    anchor.deliver(step)                                            # hands over those due and finished
    correction.step()

A launched anchor copies the model's parameters as they are (a snapshot: the fast circuit goes on changing the
originals) and runs ``loss_fn(snapshot).backward()`` in a daemon thread; PyTorch's kernels release the GIL, so it
overlaps the fast steps on the CPU, and on CUDA it runs on a side stream. :meth:`AnchorCircuit.deliver` at step
``t`` gives the correction every anchor launched at or before ``t - delay`` that has finished; one that has not
finished by then is counted ``late`` and given when it is (never waited for); one whose thread failed is
counted ``lost``, said once, and the fast circuit goes on with the anchors it has (uncorrected if none).
"""

import contextlib
import copy
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from actzip.errors import ConfigError
from actzip.wire.anchor.spectral import SpectralCorrection

__all__ = ["AnchorCircuit", "AnchorConfig", "AnchorDelivery", "PendingAnchor"]


@dataclass
class AnchorConfig:
    """When the anchor circuit runs and how late its gradients may arrive."""

    every: int = 8  # fast steps between two anchor launches (K)
    delay: int = 2  # fast steps after its launch at which an anchor is handed over (D), if finished
    max_pending: int = 2  # anchors in flight at once; a launch beyond this is skipped and counted
    # a pipeline's anchor passes, both ways: "none" sends float32 (the exact unmasked gradients); a registry
    # codec such as "cast:dtype=bfloat16" halves their traffic on the same links as the fast circuit's
    codec: str = "none"

    def __post_init__(self) -> None:
        for name, low in (("every", 1), ("delay", 0), ("max_pending", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"AnchorConfig.{name} must be an int >= {low}, got {v!r}")
        if not isinstance(self.codec, str) or not self.codec:
            raise ConfigError(f"AnchorConfig.codec must be a codec spec string, got {self.codec!r}")


class PendingAnchor:
    """One launched anchor: done when its pass has ended, with its gradients (or the error it raised)."""

    def __init__(self, launched: int) -> None:
        self.launched = launched  # the fast step it was launched at
        self.done = threading.Event()
        self.grads: list | None = None  # one per parameter handed over (None: that one had no gradient)
        self.error: BaseException | None = None
        self.counted_late = False


class AnchorDelivery:
    """What every anchor circuit shares: the anchors in flight, their hand-over to the correction once due and
    finished (never waited for), and the counts of those launched, delivered, late, lost and skipped."""

    def __init__(self, correction: SpectralCorrection, config: AnchorConfig, params: list, who: str) -> None:
        self.correction, self.config, self.params, self.who = correction, config, params, who
        self.pending: list[PendingAnchor] = []
        self.launched = self.delivered = self.late = self.lost = self.skipped = 0
        self.said_lost = False

    def launch_due(self, step: int) -> bool:
        """Whether an anchor is launched at ``step``: every ``every``-th step, unless ``max_pending`` are in flight
        (then skipped, and counted)."""
        if step % self.config.every:
            return False
        if len(self.pending) >= self.config.max_pending:
            self.skipped += 1
            return False
        return True

    def track(self, anchor: PendingAnchor) -> None:
        """Count ``anchor`` as launched and in flight."""
        self.pending.append(anchor)
        self.launched += 1

    def deliver(self, step: int) -> int:
        """Hand the correction every anchor due by ``step`` (launched at or before ``step - delay``) that has
        finished; return how many were handed over. Never waits."""
        given = 0
        for anchor in list(self.pending):
            if step - anchor.launched < self.config.delay:
                continue
            if not anchor.done.is_set():
                if not anchor.counted_late:  # due, not finished: handed over when it is
                    anchor.counted_late = True
                    self.late += 1
                continue
            self.pending.remove(anchor)
            if anchor.error is not None:
                self.lost += 1
                if not self.said_lost:
                    self.said_lost = True
                    warnings.warn(f"actzip {self.who}: the anchor launched at step {anchor.launched} failed "
                                  f"({type(anchor.error).__name__}: {anchor.error}); the fast circuit goes on "
                                  f"with the anchors it has (counted in {type(self).__name__}.lost)", stacklevel=2)
                continue
            self.correction.observe_anchor({p: g for p, g in zip(self.params, anchor.grads) if g is not None},
                                           launched=anchor.launched)
            self.delivered += 1
            given += 1
        return given

    def counts(self) -> dict[str, int]:
        return {"launched": self.launched, "delivered": self.delivered, "late": self.late, "lost": self.lost,
                "skipped": self.skipped}


class AnchorCircuit(AnchorDelivery):
    """Launches anchors and hands their gradients to ``correction`` (see the module docstring)."""

    def __init__(self, model: nn.Module, correction: SpectralCorrection, config: AnchorConfig) -> None:
        super().__init__(correction, config, [p for p in model.parameters() if p.requires_grad], "anchor circuit")
        self.model = model

    def maybe_launch(self, step: int, loss_fn: Callable[[nn.Module], torch.Tensor]) -> bool:
        """Start an anchor at every ``every``-th step (``loss_fn(snapshot)`` is the unmasked loss). True if one
        was started."""
        if not self.launch_due(step):
            return False
        snapshot = copy.deepcopy(self.model)  # the fast circuit goes on changing the originals
        anchor = PendingAnchor(step)
        stream = torch.cuda.Stream() if self.params and self.params[0].is_cuda else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())  # the snapshot's copies are made before it runs

        def run() -> None:
            try:
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    loss_fn(snapshot).backward()
                    grads = [p.grad.detach() if p.grad is not None else None for p in snapshot.parameters()
                             if p.requires_grad]
                if stream is not None:
                    stream.synchronize()  # in this thread: the fast circuit's does not wait
                anchor.grads = grads
            except BaseException as e:  # noqa: BLE001 - reported by deliver(), on the fast circuit's thread
                anchor.error = e
            finally:
                anchor.done.set()

        threading.Thread(target=run, name=f"actzip-anchor-{step}", daemon=True).start()
        self.track(anchor)
        return True

    def wait_all(self, timeout_s: float = 60.0) -> None:
        """Wait for the anchors in flight (at the end of training, or in tests)."""
        for anchor in self.pending:
            anchor.done.wait(timeout_s)
