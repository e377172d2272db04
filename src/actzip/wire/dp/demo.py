"""DeMo-style decoupled momentum: replicas share only the fast components of their momentum, in the DCT domain.

``opt = DeMo(model.parameters(), lr=1e-3, chunk=64, topk=8)`` replaces both the optimizer and DDP's gradient
all-reduce (train the bare model, not a DDP wrapper). Each step, on every replica, per parameter:

1. the local momentum takes the local gradient: ``m = beta * m + g``;
2. ``m`` (flattened, zero-padded to whole chunks) is cut into chunks of ``chunk`` elements, each chunk goes
   through an orthonormal DCT-II, and its ``topk`` coefficients of largest magnitude are the chunk's fast
   components;
3. they are taken out of the local momentum (``m -= IDCT(q)``: what stays is the slow part, kept for later steps),
   all-gathered as values and in-chunk indices (uint8 for chunks of up to 256, else int32), and averaged over
   replicas;
4. the parameter moves by ``-lr * sign(IDCT(mean q))`` (with ``sign=False``: the averaged components themselves),
   the same update on every replica, so replicas that start equal stay bit-identical.

Each replica sends ``topk * (value bytes + index bytes)`` per chunk (metered in ``DeMo.meter``), against the
parameter's own float32 bytes for a plain all-reduce.
"""

import math

import torch
import torch.distributed as dist

from actzip.errors import ConfigError
from actzip.wire.dp.agree import check_same_config
from actzip.wire.dp.meter import DPMeter

__all__ = ["DeMo", "dct_matrix"]


def dct_matrix(n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """The orthonormal DCT-II matrix ``D`` (``n x n``): ``D @ x`` transforms, ``D.T @ y`` inverts."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    d = torch.cos(math.pi / n * (i + 0.5) * k) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.to(device=device, dtype=dtype)


class DeMo(torch.optim.Optimizer):
    """Decoupled momentum with DCT top-k sharing across replicas (see the module docstring)."""

    def __init__(self, params, lr: float = 1e-3, beta: float = 0.999, chunk: int = 64, topk: int = 8,
                 sign: bool = True, weight_decay: float = 0.0, process_group=None) -> None:  # fmt: skip
        for name, v, ok in (("lr", lr, lr > 0), ("beta", beta, 0 <= beta < 1), ("weight_decay", weight_decay,
                                                                                   weight_decay >= 0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok:
                raise ConfigError(f"DeMo: {name} out of range, got {v!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 2:
            raise ConfigError(f"DeMo: chunk must be an int >= 2, got {chunk!r}")
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= chunk:
            raise ConfigError(f"DeMo: topk must be an int in [1, chunk={chunk}], got {topk!r}")
        super().__init__(params, dict(lr=lr, beta=beta, chunk=chunk, topk=topk, sign=sign,
                                      weight_decay=weight_decay))
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.world = dist.get_world_size(self.group)
        options = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        check_same_config("DeMo", {"options": options,
                                   "parameters": [[list(p.shape) for p in g["params"]] for g in self.param_groups]},
                          self.group)
        self.meter = DPMeter()
        self._dct: dict[tuple, torch.Tensor] = {}

    def _matrix(self, n: int, device, dtype) -> torch.Tensor:
        key = (n, device, dtype)
        if key not in self._dct:
            self._dct[key] = dct_matrix(n, device, dtype)
        return self._dct[key]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict) -> None:
        n, s, k = p.numel(), group["chunk"], group["topk"]
        state = self.state[p]
        if "momentum" not in state:
            state["momentum"] = torch.zeros(-(-n // s) * s, dtype=torch.float32, device=p.device)
        m = state["momentum"]
        m.mul_(group["beta"])
        m[:n].add_(p.grad.reshape(-1).float())
        d = self._matrix(s, p.device, torch.float32)
        coeffs = m.view(-1, s) @ d.T  # each chunk in the DCT domain
        idx = coeffs.abs().topk(k, dim=1).indices
        values = coeffs.gather(1, idx)
        fast = torch.zeros_like(coeffs).scatter_(1, idx, values)
        m.view(-1, s).sub_(fast @ d)  # what stays is the slow part
        wire_idx = idx.to(torch.uint8 if s <= 256 else torch.int32)
        all_idx = [torch.empty_like(wire_idx) for _ in range(self.world)]
        all_val = [torch.empty_like(values) for _ in range(self.world)]
        dist.all_gather(all_idx, wire_idx, group=self.group)
        dist.all_gather(all_val, values, group=self.group)
        self.meter.buckets += 1
        self.meter.dense_bytes += n * 4
        self.meter.add("all_gather", values.numel() * (values.element_size() + wire_idx.element_size()))
        mean = torch.zeros_like(coeffs)
        for i, v in zip(all_idx, all_val):
            mean.scatter_add_(1, i.long(), v)
        update = (mean.div_(self.world) @ d).reshape(-1)[:n].view_as(p)
        if group["sign"]:
            update = update.sign()
        if group["weight_decay"]:
            p.mul_(1 - group["lr"] * group["weight_decay"])
        p.sub_(update.to(p.dtype), alpha=group["lr"])
