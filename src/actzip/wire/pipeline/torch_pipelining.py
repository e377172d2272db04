"""Stages on PyTorch's own ``torch.distributed.pipelining`` schedules, where they fit, with their bytes counted.

It fits stages whose boundary ends live inside the module and whose message is one tensor of fixed shape
(dense, a bottleneck or projection code): PyTorch's schedules (``ScheduleGPipe``, ``Schedule1F1B``, ...) then
run them unchanged. Dict messages, byte codecs and fault reporting need :class:`actzip.wire.Pipeline`.
"""

from __future__ import annotations

import torch
from torch import nn

from actzip.errors import ConfigError
from actzip.wire.transport import ByteMeter

__all__ = ["pipelining_stage"]


class _Metered(nn.Module):
    """A stage module whose boundary tensors are counted: its output (sent forward) and its input's gradient
    (sent backward). PyTorch's pipelining sends raw tensors, so the bytes are the tensors' bytes."""

    def __init__(self, module: nn.Module, stage: int, n_stages: int, meter) -> None:
        super().__init__()
        self.module, self.stage, self.n_stages, self.meter = module, stage, n_stages, meter
        self.counting = False  # on inside the schedule's forward_one_chunk: not during metadata inference

    def forward(self, x):
        if not self.counting:
            return self.module(x)
        if self.stage > 0 and isinstance(x, torch.Tensor) and x.requires_grad:
            x.register_hook(lambda g: self.meter.add("sent", "bwd", g.numel() * g.element_size(), 0) or None)
        out = self.module(x)
        if self.stage < self.n_stages - 1:
            if not isinstance(out, torch.Tensor):
                raise ConfigError(
                    f"stage {self.stage} returns a {type(out).__name__}; torch.distributed.pipelining moves single "
                    f"tensors of fixed shape, so messages with side channels, byte codecs (quant, mask, delta) and "
                    f"variable sizes need actzip.wire.Pipeline")
            self.meter.add("sent", "fwd", out.numel() * out.element_size(), 0)
        return out


def pipelining_stage(module: nn.Module, stage: int, n_stages: int, device: torch.device | str, meter=None,
                     group=None):
    """``module`` as a ``torch.distributed.pipelining.PipelineStage``, its boundary tensors counted in ``meter``
    (a :class:`~actzip.wire.transport.ByteMeter`; ``header_bytes`` stay 0: PyTorch sends raw tensors).

    See the module docstring for the stages it fits.
    """
    from torch.distributed.pipelining import PipelineStage  # loaded only by those who use it

    meter = meter if meter is not None else ByteMeter()
    wrapped = _Metered(module, stage, n_stages, meter)
    pipe_stage = PipelineStage(wrapped, stage, n_stages, torch.device(device), group=group)
    run_chunk = pipe_stage.forward_one_chunk

    def forward_one_chunk(*args, **kwargs):  # what the schedules call per microbatch, and then send
        wrapped.counting = True
        try:
            return run_chunk(*args, **kwargs)
        finally:
            wrapped.counting = False

    pipe_stage.forward_one_chunk = forward_one_chunk
    pipe_stage.actzip_meter = meter
    return pipe_stage
