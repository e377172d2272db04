"""Co-compression: layers that sketch their saved input already hold their weight gradient as rank-k factors;
replicas average the small factor and nothing else.

A :class:`~actzip.memory.modules.SketchedLinear` with ``factored_grad=True`` leaves, after backward,
``weight.actzip_factors = (left, right)`` with ``weight.grad == left @ right``: ``left = G^T (x S)`` is
``[out x k]`` and ``right = S^T`` is rebuilt from the sketch's seed. Replicas that draw the same ``S`` (the same
seed, the same number of calls) share ``right``, so the mean of their weight gradients is
``mean(left) @ right``: one all-reduce of ``out x k`` numbers instead of ``out x in``, with no error beyond the
sketch's own. :func:`sync_factored_grads` does that for every such layer, and a plain mean all-reduce for every
other gradient, after ``backward()`` and before the optimizer step (train the bare model, not a DDP wrapper).
Replicas whose sketches differ (another seed or call count) are refused on every replica, before any gradient
is averaged.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

from actzip.errors import ConfigError
from actzip.wire.dp.meter import DPMeter

__all__ = ["sync_factored_grads"]


@torch.no_grad()
def sync_factored_grads(model: nn.Module, process_group=None, meter: DPMeter | None = None) -> DPMeter:
    """Average ``model``'s gradients over the replicas: sketched layers through their left factor, the rest
    whole. Returns ``meter`` (a fresh :class:`DPMeter` if none is given) with what this replica sent."""
    group = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    meter = meter if meter is not None else DPMeter()
    # SketchedLinear layers by what they publish (the wire does not import the memory layer)
    layers = [m for m in model.modules() if getattr(m, "factored_grad", False) and hasattr(m, "last_seed")
              and getattr(m.weight, "actzip_factors", None) is not None and m.weight.grad is not None]
    _check_same_sketches(layers, group, world)
    factored = {id(m.weight) for m in layers}
    for m in layers:
        left, right = m.weight.actzip_factors
        total = left.contiguous()
        with meter.waiting():
            dist.all_reduce(total, group=group)
        left = total.div_(world)
        m.weight.actzip_factors = (left, right)
        m.weight.grad.copy_((left @ right).to(m.weight.grad.dtype))
        meter.add("all_reduce", left.numel() * left.element_size())
        meter.dense_bytes += m.weight.grad.numel() * m.weight.grad.element_size()
        meter.buckets += 1
    for p in model.parameters():
        if p.grad is None or id(p) in factored:
            continue
        with meter.waiting():
            dist.all_reduce(p.grad, group=group)
        p.grad.div_(world)
        meter.add("all_reduce", p.grad.numel() * p.grad.element_size())
        meter.dense_bytes += p.grad.numel() * p.grad.element_size()
        meter.buckets += 1
    return meter


def _check_same_sketches(layers: list, group, world: int) -> None:
    """Every replica drew the same sketches: the same layers, seeds and factor widths (one all-gather)."""
    mine = torch.tensor([[m.last_seed if m.last_seed is not None else -1, m.weight.actzip_factors[0].shape[1]]
                         for m in layers] or [[-2, 0]], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.shape[0]], dtype=torch.int64), group=group)
    if len({int(s) for s in sizes}) > 1:
        raise ConfigError(f"sync_factored_grads: replicas hold factors for different numbers of layers "
                          f"({[int(s) for s in sizes]}); every replica must run the same sketched layers")
    theirs = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(theirs, mine, group=group)
    bad = [i for i in range(mine.shape[0]) if any(not torch.equal(t[i], mine[i]) for t in theirs)]
    if bad:
        raise ConfigError(f"sync_factored_grads: the replicas' sketches differ at sketched layer(s) {bad} (seed or "
                          "factor width): their right factors differ, so the left ones cannot be averaged. Give "
                          "every replica the same SketchedLinear seed and the same number of forward calls")
