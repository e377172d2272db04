"""Replicas that should hold the same parameters check it: a fingerprint of every bit, compared across them.

The fingerprint of a list of tensors is two int64 sums over their raw bits (as integers of their element size),
one plain and one weighted by position, so a swapped pair of elements changes it too. Any difference in any bit
changes it with near certainty; it costs one pass over the parameters and one all-gather of 16 bytes.
"""

import torch
import torch.distributed as dist

from actzip.errors import WireDesyncError

__all__ = ["check_replicas_agree", "fingerprint"]

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@torch.no_grad()
def fingerprint(tensors) -> torch.Tensor:
    """Two int64 numbers that change with any bit of ``tensors`` (a ``[2]`` int64 tensor on the CPU)."""
    plain = torch.zeros((), dtype=torch.int64)
    weighted = torch.zeros((), dtype=torch.int64)
    for i, t in enumerate(tensors):
        bits = t.detach().contiguous().reshape(-1).view(_INT[t.element_size()]).to(torch.int64).cpu()
        plain += bits.sum() + i
        weighted += (bits * torch.arange(1, bits.numel() + 1, dtype=torch.int64)).sum() * (2 * i + 1)
    return torch.stack([plain, weighted])


def check_replicas_agree(tensors, group, what: str, step: int) -> None:
    """Raise :class:`WireDesyncError` on every replica of ``group`` unless all hold bit-identical ``tensors``."""
    mine = fingerprint(tensors)
    world = dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    got = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(got, mine.to(device), group=group)
    odd = [r for r, f in enumerate(got) if not torch.equal(f, got[0])]
    if odd:
        raise WireDesyncError(f"replicas diverged at step {step}: {what} on replicas {odd} differ from replica 0's "
                              "(a lost update, a replica configured otherwise, or a nondeterministic sync)")
