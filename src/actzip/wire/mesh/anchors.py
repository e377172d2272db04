"""The anchor circuit of a pipeline: every K steps an unmasked forward and backward through every stage, on
a snapshot of the parameters, in a background thread talking over its own process groups; its gradients are
handed to the spectral correction D steps later, and the fast circuit never waits for them.

Each stage keeps a copy of its module for the anchor passes, and a second :class:`~actzip.wire.Pipeline` over
it: dense codecs both ways (the anchors are what the masks would lose), on the mesh's anchor groups, so its
messages never mix with the fast circuit's. One thread per stage runs the launched anchors in launch order;
every stage launches at the same steps (``step % every == 0``), so the anchor pipeline's stages run the same
passes in the same order.

A launch while ``max_pending`` anchors are queued or running is skipped and counted (``skipped``). A stage may
then skip one that another stage of the replica takes; the anchor pipeline's sequence checks catch it, the
anchors from then on are lost (counted, said once) and the fast circuit goes on uncorrected. An anchor that is
due (launched ``delay`` steps ago) but not finished is counted ``late`` and handed over when it is.
"""

import copy
import queue
import threading
import warnings
from dataclasses import replace

import torch
import torch.nn as nn

from actzip.wire.anchor import AnchorConfig, SpectralCorrection
from actzip.wire.pipeline import Pipeline, PipelineConfig

__all__ = ["PipelineAnchors"]


class _Launch:
    def __init__(self, step: int, params: list[torch.Tensor], x, y) -> None:
        self.step, self.params, self.x, self.y = step, params, x, y
        self.done = threading.Event()
        self.grads: list | None = None
        self.error: BaseException | None = None
        self.counted_late = False


class PipelineAnchors:
    """Anchor passes of this rank's stage (see the module docstring)."""

    def __init__(self, module: nn.Module, fast_config: PipelineConfig, config: AnchorConfig,
                 correction: SpectralCorrection, group, down_group, loss_fn=None) -> None:
        self.config, self.correction = config, correction
        self.fast_params = [p for p in module.parameters() if p.requires_grad]
        self.module = copy.deepcopy(module)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        dense = replace(fast_config, codec="none", fwd_codec=None, bwd_codec=None)
        self.pipe = Pipeline(self.module, dense, loss_fn=loss_fn, distributed=True, group=group,
                             down_group=down_group)
        self.pending: list[_Launch] = []
        self.launched = self.delivered = self.late = self.lost = self.skipped = 0
        self._said_lost = False
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="actzip-pipeline-anchors", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        broken: BaseException | None = None
        while True:
            launch = self._queue.get()
            if launch is None:
                return
            try:
                if broken is not None:  # the anchor pipeline lost its place: every later anchor is lost too
                    raise broken
                with torch.no_grad():
                    for p, v in zip(self.params, launch.params):
                        p.copy_(v)
                        p.grad = None
                self.pipe.compute_grads(launch.x, launch.y)
                launch.grads = [p.grad.detach().clone() if p.grad is not None else None for p in self.params]
            except BaseException as e:  # noqa: BLE001 - reported by deliver(), on the fast circuit's thread
                broken = broken or e
                launch.error = e
            finally:
                launch.done.set()

    def maybe_launch(self, step: int, x, y) -> bool:
        """At every ``every``-th step queue an anchor on a snapshot of the parameters and this batch."""
        if step % self.config.every:
            return False
        if len(self.pending) >= self.config.max_pending:
            self.skipped += 1
            return False
        launch = _Launch(step, [p.detach().clone() for p in self.fast_params], x, y)
        self.pending.append(launch)
        self._queue.put(launch)
        self.launched += 1
        return True

    def deliver(self, step: int) -> int:
        """Hand the correction every anchor due by ``step`` that has finished; never waits."""
        given = 0
        for launch in list(self.pending):
            if step - launch.step < self.config.delay:
                continue
            if not launch.done.is_set():
                if not launch.counted_late:
                    launch.counted_late = True
                    self.late += 1
                continue
            self.pending.remove(launch)
            if launch.error is not None:
                self.lost += 1
                if not self._said_lost:
                    self._said_lost = True
                    warnings.warn(f"actzip pipeline anchors: the anchor launched at step {launch.step} failed "
                                  f"({type(launch.error).__name__}: {launch.error}); the fast circuit goes on with "
                                  "the anchors it has (counted in PipelineAnchors.lost)", stacklevel=2)
                continue
            self.correction.observe_anchor({p: g for p, g in zip(self.fast_params, launch.grads) if g is not None})
            self.delivered += 1
            given += 1
        return given

    def counts(self) -> dict[str, int]:
        return {"launched": self.launched, "delivered": self.delivered, "late": self.late, "lost": self.lost,
                "skipped": self.skipped}

    def close(self, timeout_s: float = 60.0) -> None:
        """Let the anchors in flight finish (bounded), then stop the thread."""
        for launch in self.pending:
            launch.done.wait(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)
