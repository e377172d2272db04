"""The anchor circuit of a pipeline: every K steps an unmasked forward and backward through every stage, on
a snapshot of the parameters, in a background thread talking over its own process groups; its gradients are
handed to the spectral correction D steps later, and the fast circuit never waits for them.

Each stage keeps a copy of its module for the anchor passes, and a second :class:`~actzip.wire.Pipeline` over
it: ``AnchorConfig.codec`` both ways, float32 by default (the anchors are what the masks would lose), on the
mesh's anchor groups, so its messages never mix with the fast circuit's. One thread per stage runs the launched
anchors in launch order; every stage launches at the same steps (``step % every == 0``), so the anchor
pipeline's stages run the same passes in the same order.

A launch while ``max_pending`` anchors are queued or running is skipped and counted (``skipped``). A stage may
then skip one that another stage of the replica takes; the anchor pipeline's sequence checks catch it, the
anchors from then on are lost (counted, said once) and the fast circuit goes on uncorrected. An anchor that is
due (launched ``delay`` steps ago) but not finished is counted ``late`` and handed over when it is.
"""

import copy
import queue
import threading
from dataclasses import replace

import torch
import torch.nn as nn

from actzip.wire.anchor import AnchorConfig, AnchorDelivery, PendingAnchor, SpectralCorrection
from actzip.wire.pipeline import Pipeline, PipelineConfig

__all__ = ["PipelineAnchors"]


class QueuedAnchor(PendingAnchor):
    """An anchor waiting for the thread: the parameters it snapshots and its batch."""

    def __init__(self, step: int, params: list[torch.Tensor], x, y) -> None:
        super().__init__(step)
        self.params, self.x, self.y = params, x, y


class PipelineAnchors(AnchorDelivery):
    """Anchor passes of this rank's stage (see the module docstring)."""

    def __init__(self, module: nn.Module, fast_config: PipelineConfig, config: AnchorConfig,
                 correction: SpectralCorrection, group, down_group, loss_fn=None) -> None:
        super().__init__(correction, config, [p for p in module.parameters() if p.requires_grad], "pipeline anchors")
        self.module = copy.deepcopy(module)
        self.copy_params = [p for p in self.module.parameters() if p.requires_grad]  # the anchor passes' copy
        dense = replace(fast_config, codec=config.codec, fwd_codec=None, bwd_codec=None)
        self.pipe = Pipeline(self.module, dense, loss_fn=loss_fn, distributed=True, group=group,
                             down_group=down_group)
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
                    for p, v in zip(self.copy_params, launch.params):
                        p.copy_(v)
                        p.grad = None
                self.pipe.compute_grads(launch.x, launch.y)
                launch.grads = [p.grad.detach().clone() if p.grad is not None else None for p in self.copy_params]
            except BaseException as e:  # noqa: BLE001 - reported by deliver(), on the fast circuit's thread
                broken = broken or e
                launch.error = e
            finally:
                launch.done.set()

    def maybe_launch(self, step: int, x, y) -> bool:
        """At every ``every``-th step queue an anchor on a snapshot of the parameters and this batch."""
        if not self.launch_due(step):
            return False
        launch = QueuedAnchor(step, [p.detach().clone() for p in self.params], x, y)
        self.track(launch)
        self._queue.put(launch)
        return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Let the anchors in flight finish (bounded), then stop the thread."""
        for launch in self.pending:
            launch.done.wait(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)
