"""Compressed gradient sync of a bare module (no DDP wrapper): the same methods as the DDP hooks, on one flat
bucket holding every gradient, called after the backward and before the optimizer step.

A pipeline stage cannot be wrapped in ``DistributedDataParallel``: its forwards and backwards interleave across
microbatches (1F1B), and DDP would reduce after the wrong backward. :class:`GradSync` instead gathers the stage's
gradients into one bucket and runs the :class:`~actzip.wire.dp.hooks.DPConfig` method's hook on it, torch's own
``powerSGD_hook`` and ``bf16_compress_hook`` included; the bucket's gradient views are written back to each
``.grad``. One bucket per sync also keeps gloo's PowerSGD from the two-buckets-in-flight hang. CUDA gradients
synced with top-k over gloo (several ranks sharing one GPU) go through a CPU copy of the bucket.

    sync = GradSync(stage_module, DPConfig(method="topk", keep=0.01), process_group=replicas_of_this_stage)
    loss.backward(); sync.sync(); optimizer.step()
"""

import dataclasses

import torch
import torch.distributed as dist
import torch.nn as nn

from actzip.errors import ConfigError
from actzip.wire.dp.agree import check_same_config
from actzip.wire.dp.hooks import DPConfig, make_hook
from actzip.wire.dp.meter import DPMeter

__all__ = ["FlatBucket", "GradSync"]


class FlatBucket:
    """The parts of ``torch.distributed.GradBucket`` the hooks use, over one flat copy of ``params``' gradients
    (a gradient that is ``None`` counts as zeros)."""

    def __init__(self, params: list[nn.Parameter], index: int = 0, device: torch.device | None = None) -> None:
        self._params, self._index = params, index
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self._buffer = torch.cat([g.detach().reshape(-1) for g in grads])
        if device is not None:
            self._buffer = self._buffer.to(device)
        self._views = []
        offset = 0
        for p in params:
            self._views.append(self._buffer[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer.copy_(tensor)

    def gradients(self) -> list[torch.Tensor]:
        return self._views

    def parameters(self) -> list[nn.Parameter]:
        return self._params

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return True  # one bucket per sync: it is both the first and the last

    def is_first(self) -> bool:
        return True


class GradSync:
    """Averages ``module``'s gradients over the replicas of ``process_group`` with ``config``'s method."""

    def __init__(self, module: nn.Module, config: DPConfig, process_group=None) -> None:
        if not isinstance(config, DPConfig):
            raise ConfigError(f"GradSync: config must be a DPConfig, got {type(config).__name__}")
        self.config = config
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.params = [p for p in module.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("GradSync: the module has no trainable parameters")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ConfigError(f"GradSync: the module's trainable parameters have several dtypes {sorted(map(str, dtypes))}"
                              "; one flat bucket needs one dtype")
        check_same_config("GradSync", {"config": dataclasses.asdict(config),
                                       "parameters": [list(p.shape) for p in self.params]}, self.group)
        self.meter = DPMeter()
        self.state, self.hook = make_hook(config, self.group, self.meter)
        # gloo all-reduces CUDA tensors but all-gathers only CPU ones: top-k's CUDA gradients are staged there
        # (the all-reduce methods stay on the GPU: torch's PowerSGD hook expects the bucket on the GPU)
        cuda = self.params[0].is_cuda
        gather = config.method == "topk"
        self.staging = torch.device("cpu") if cuda and gather and dist.get_backend(self.group) == "gloo" else None
        self.syncs = 0

    @torch.no_grad()
    def sync(self) -> None:
        """Replace every ``.grad`` with the replicas' mean as the method delivers it."""
        bucket = FlatBucket(self.params, device=self.staging)
        fut = self.hook(self.state, bucket)  # quant and top-k time their own collectives inside
        with self.meter.waiting():  # the all-reduce methods' collectives run until this wait ends (for PowerSGD
            out = fut.wait()  # its compression's work between its two all-reduces too)
        if out.data_ptr() != bucket.buffer().data_ptr():
            bucket.buffer().copy_(out[:bucket.buffer().numel()])
        for p, g in zip(self.params, bucket.gradients()):
            if p.grad is None:
                p.grad = g.to(p.device, copy=True)
            else:
                p.grad.copy_(g)
        self.syncs += 1
