"""DiLoCo / SparseLoCo-style outer step: replicas train alone for H steps, then agree through a compressed
pseudo-gradient.

``sync = OuterSync(model, OuterConfig(local_steps=50, codec="mask:keep=0.03,mode=topk"))``, then
``sync.step()`` after every inner optimizer step. Every ``local_steps``-th call:

1. each replica's pseudo-gradient is ``global - local`` per parameter (what its H inner steps moved), plus the
   residual it kept from the last round when ``error_feedback`` is on;
2. it is encoded with ``codec`` (any registry codec spec: ``quant:bits=4``, ``mask:keep=0.03,mode=topk``, a
   chain is not taken here; ``none`` sends it raw) and the residual becomes what the decode lost;
3. the payloads are all-gathered (what is metered is exactly what each replica contributes: its payload's
   buffers; ``none`` is a plain all-reduce of the raw tensor), every replica decodes all of them and averages;
4. the outer optimizer (SGD with momentum, Nesterov by default, as DiLoCo) applies the mean to the global copy,
   and every replica's parameters are set to it: the replicas are identical again, bit for bit.

State: a float32 global copy, a momentum buffer and (with error feedback) a residual per parameter, three times
the parameters' float32 size.
"""

import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from actzip.core.registry import get
from actzip.errors import ConfigError
from actzip.wire.dp.agree import check_same_config
from actzip.wire.dp.gather import gathered_mean
from actzip.wire.dp.meter import DPMeter

__all__ = ["OuterConfig", "OuterMeter", "OuterSync"]


@dataclass
class OuterConfig:
    """How replicas that train alone agree every ``local_steps`` steps."""

    local_steps: int = 50  # inner steps between syncs (DiLoCo's H)
    outer_lr: float = 0.7  # learning rate of the outer SGD on the mean pseudo-gradient
    momentum: float = 0.9  # outer SGD momentum (0: none)
    nesterov: bool = True  # Nesterov momentum, as DiLoCo
    codec: str = "none"  # registry codec spec for the pseudo-gradient, or "none" (raw, all-reduced)
    error_feedback: bool = True  # add what compression lost to the next round's pseudo-gradient

    def __post_init__(self) -> None:
        if isinstance(self.local_steps, bool) or not isinstance(self.local_steps, int) or self.local_steps < 1:
            raise ConfigError(f"OuterConfig.local_steps must be an int >= 1, got {self.local_steps!r}")
        for name in ("outer_lr", "momentum"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"OuterConfig.{name} must be a finite number >= 0, got {v!r}")
        if "+" in str(self.codec):
            raise ConfigError(f"OuterConfig.codec takes one registry codec, not a chain: {self.codec!r}")
        if self.codec != "none":
            get(self.codec)  # a bad spec is named here, not at the first sync


@dataclass
class OuterMeter(DPMeter):
    """What one replica contributed to the outer syncs (``dense_bytes``: the pseudo-gradients raw, float32)."""

    syncs: int = 0  # outer steps run
    by_parameter: dict[str, int] = field(default_factory=dict)  # payload bytes per parameter name


class OuterSync:
    """The outer step over ``model``'s trainable parameters (see the module docstring)."""

    def __init__(self, model: nn.Module, config: OuterConfig, process_group=None) -> None:
        self.config = config
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("OuterSync: the model has no trainable parameters")
        self.world = dist.get_world_size(self.group)
        check_same_config("OuterSync", {"config": dataclasses.asdict(config),
                                        "parameters": [[n, list(p.shape)] for n, p in self.params]}, self.group)
        with torch.no_grad():  # start from one point: replica 0's parameters
            for _, p in self.params:
                t = p.data.cpu() if p.is_cuda and dist.get_backend(self.group) == "gloo" else p.data
                dist.broadcast(t, src=dist.get_global_rank(self.group, 0), group=self.group)
                if t is not p.data:
                    p.data.copy_(t)
        self.global_params = [p.detach().float().clone() for _, p in self.params]
        self.momenta = [torch.zeros_like(g) for g in self.global_params]
        self.residuals = [torch.zeros_like(g) for g in self.global_params] if config.error_feedback else None
        self.codecs = [None if config.codec == "none" else get(config.codec) for _ in self.params]
        self.meter = OuterMeter()
        self.inner_steps = 0

    @property
    def due(self) -> bool:
        """The next :meth:`step` runs the outer step."""
        return (self.inner_steps + 1) % self.config.local_steps == 0

    def step(self) -> bool:
        """Count one inner step; every ``local_steps``-th, run the outer step. True when it ran."""
        due = self.due
        self.inner_steps += 1
        if not due:
            return False
        self.sync()
        return True

    @torch.no_grad()
    def sync(self) -> None:
        """The outer step now (all replicas must call it together)."""
        cfg = self.config
        self.meter.syncs += 1
        for i, (name, p) in enumerate(self.params):
            delta = self.global_params[i] - p.detach().float()
            if self.residuals is not None:
                delta += self.residuals[i]
            mean, sent_bytes = self._mean(i, delta)
            self.meter.add("all_reduce" if self.codecs[i] is None else "all_gather", sent_bytes)
            self.meter.dense_bytes += delta.numel() * 4
            self.meter.by_parameter[name] = self.meter.by_parameter.get(name, 0) + sent_bytes
            m = self.momenta[i]
            m.mul_(cfg.momentum).add_(mean)
            update = mean.add(m, alpha=cfg.momentum) if cfg.nesterov else m
            self.global_params[i].sub_(update, alpha=cfg.outer_lr)
            p.copy_(self.global_params[i])

    def _mean(self, i: int, delta: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The mean over replicas of what each sends of ``delta``, and the bytes this replica sent."""
        codec = self.codecs[i]
        if codec is None:
            total = delta.cpu() if delta.is_cuda and dist.get_backend(self.group) == "gloo" else delta.clone()
            with self.meter.waiting():
                dist.all_reduce(total, group=self.group)
            total = total.to(delta.device)
            if self.residuals is not None:
                self.residuals[i].zero_()
            return total.div_(self.world), delta.numel() * 4
        payload = codec.encode(delta, name=self.params[i][0])
        if self.residuals is not None:
            self.residuals[i] = delta - codec.decode(payload).float()
        return gathered_mean(codec, payload, delta, self.group, self.meter), payload.nbytes
