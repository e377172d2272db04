"""The replicas' mean of a codec's payloads: every replica all-gathers every other's payload and decodes them.

A codec's payload has buffers whose sizes follow from the tensor's shape (the codecs the data-parallel methods
take: quantization, masks with a fixed keep), so one all-gather of their bytes moves them. gloo all-gathers CPU
tensors only: CUDA payloads (ranks sharing a GPU) are staged through the CPU.
"""

import contextlib

import torch
import torch.distributed as dist

from actzip.codecs.base import Codec
from actzip.core.payload import Payload

__all__ = ["gathered_mean"]


def gathered_mean(codec: Codec, payload: Payload, like: torch.Tensor, group, meter=None) -> torch.Tensor:
    """The float32 mean over ``group``'s replicas of what each one's ``payload`` decodes to (``like``: this
    replica's tensor, for its shape and device). The payload's buffers travel as one byte tensor, one
    all-gather (one latency), as the link model counts it; ``meter`` (a ``DPMeter``) times it."""
    world = dist.get_world_size(group)
    keys = sorted(payload.buffers)
    bufs = [payload.buffers[k].contiguous() for k in keys]
    mine = torch.cat([b.reshape(-1).view(torch.uint8) for b in bufs])
    stage = mine.is_cuda and dist.get_backend(group) == "gloo"
    mine = mine.cpu() if stage else mine
    parts = [torch.empty_like(mine) for _ in range(world)]
    with meter.waiting() if meter is not None else contextlib.nullcontext():
        dist.all_gather(parts, mine, group=group)
    sizes = [b.numel() * b.element_size() for b in bufs]
    total = torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    for part in parts:
        pieces = part.to(like.device).split(sizes)
        # a copy starts at offset 0: a wider dtype cannot view bytes at an odd offset
        buffers = {k: p.clone().view(b.dtype).reshape(b.shape) for k, p, b in zip(keys, pieces, bufs)}
        total += codec.decode(Payload(payload.codec, payload.shape, payload.dtype, payload.device,
                                      buffers=buffers, meta=payload.meta)).float()
    return total.div_(world)
