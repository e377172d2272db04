"""Compressed gradient sync across data-parallel replicas, as DDP communication hooks, every byte metered.

``model = DistributedDataParallel(model); attach(model, DPConfig(method="topk", keep=0.01))`` registers one
hook on the DDP model; each gradient bucket then goes through it instead of a plain all-reduce:

- ``allreduce``: the plain float all-reduce of the bucket (the uncompressed baseline), mean over replicas;
- ``bf16``: torch's own ``bf16_compress_hook`` (the bucket cast to bf16, all-reduced, cast back);
- ``powersgd``: torch's own ``powerSGD_hook`` (rank-``rank`` factors of each weight matrix with error feedback
  and warm start, after ``start_iter`` plain iterations), metered from the state's own element counts. Its
  on gloo the gradients must fit one DDP bucket (``bucket_cap_mb``; else :func:`attach` refuses): the hook
  issues its later all-reduces from completion callbacks, whose order gloo does not keep the same across
  replicas once two buckets are in flight, and the replicas wait on each other forever. There, too, a bucket
  holding nothing to compress or nothing to send whole (no vector) would all-reduce an empty tensor, which
  gloo aborts on (pytorch/pytorch#58467): it is all-reduced plain instead, announced once and counted
  (``DPMeter.fallback_buckets``). NCCL has neither limit;
- ``topk``: each replica adds its residual to the bucket (error feedback), sends the ``keep`` fraction of
  largest magnitude as values and int32 indices (an all-gather), and keeps what it did not send as the next
  residual; the bucket becomes the mean of every replica's sent part. Sent + residual equals gradient +
  previous residual exactly (the residual is the difference, computed in the bucket's dtype);
- ``quant``: each replica adds its residual to the bucket (error feedback), encodes it with ``codec`` (a registry
  spec, ``quant:bits=4`` by default: 4-bit codes in groups, stochastic rounding), all-gathers the payloads and
  decodes every replica's; the bucket becomes their mean, and what the codes missed is the next residual. The
  quantized all-reduce a user would otherwise write, with the error kept rather than lost.

The meter counts what this replica contributes to each collective (its payload) against the bucket's own
bytes; a ring all-reduce moves about twice its payload per replica, an all-gather (replicas − 1) times it.
"""


import dataclasses
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from actzip.core.registry import get
from actzip.errors import ConfigError
from actzip.wire.dp.agree import check_same_config
from actzip.wire.dp.gather import gathered_mean
from actzip.wire.dp.meter import DPMeter

__all__ = ["DP_METHODS", "DPConfig", "DPMeter", "attach", "make_hook"]

DP_METHODS = ("allreduce", "bf16", "powersgd", "topk", "quant")


@dataclass
class DPConfig:
    """How a DDP model's gradients are synchronized."""

    method: str = "allreduce"  # one of DP_METHODS
    keep: float = 0.01  # topk: fraction of each bucket's elements sent per step
    rank: int = 4  # powersgd: rank of the factors
    start_iter: int = 10  # powersgd: plain all-reduce iterations before compressing (torch's start_powerSGD_iter)
    min_compression_rate: float = 2.0  # powersgd: compress a matrix only if it saves at least this factor
    seed: int = 0  # powersgd: the random initial factors' seed (the same on every replica)
    codec: str = "quant:bits=4"  # quant: registry codec spec each bucket is sent in (one codec, not a chain)

    def __post_init__(self) -> None:
        if self.method not in DP_METHODS:
            raise ConfigError(f"DPConfig.method must be one of {list(DP_METHODS)}, got {self.method!r}")
        if isinstance(self.keep, bool) or not isinstance(self.keep, (int, float)) or not 0.0 < self.keep <= 1.0:
            raise ConfigError(f"DPConfig.keep must be a fraction in (0, 1], got {self.keep!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"DPConfig.rank must be an int >= 1, got {self.rank!r}")
        if isinstance(self.start_iter, bool) or not isinstance(self.start_iter, int) or self.start_iter < 0:
            raise ConfigError(f"DPConfig.start_iter must be an int >= 0, got {self.start_iter!r}")
        if self.method == "quant":
            if not isinstance(self.codec, str) or "+" in self.codec:
                raise ConfigError(f"DPConfig.codec takes one registry codec spec, got {self.codec!r}")
            if get(self.codec).lossless:
                raise ConfigError(f"DPConfig.codec {self.codec!r} is lossless: its payload size depends on the "
                                  "data, which an all-gather cannot take; use method='allreduce'")


class _TopKState:
    def __init__(self, keep: float, group, meter: DPMeter) -> None:
        self.keep, self.group, self.meter = keep, group, meter
        # per parameter, not per bucket: DDP rebuilds its buckets after the first step
        self.residuals: dict[int, torch.Tensor] = {}


class _QuantState:
    def __init__(self, codec_spec: str, group, meter: DPMeter) -> None:
        self.codec, self.group, self.meter = get(codec_spec), group, meter
        self.residuals: dict[int, torch.Tensor] = {}  # per parameter, as top-k's


def _mean_allreduce(group, tensor: torch.Tensor) -> torch.futures.Future:
    world = dist.get_world_size(group)
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(world))


def _allreduce_hook(state: tuple, bucket) -> torch.futures.Future[torch.Tensor]:
    group, meter = state
    buf = bucket.buffer()
    meter.buckets += 1
    meter.dense_bytes += buf.numel() * buf.element_size()
    meter.add("all_reduce", buf.numel() * buf.element_size())
    return _mean_allreduce(group, buf)


def _bf16_hook(state: tuple, bucket) -> torch.futures.Future[torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    group, meter = state
    buf = bucket.buffer()
    meter.buckets += 1
    meter.dense_bytes += buf.numel() * buf.element_size()
    meter.add("all_reduce", buf.numel() * 2)
    return bf16_compress_hook(group, bucket)


def _powersgd_hook(state: tuple, bucket) -> torch.futures.Future[torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    ps, meter, gloo = state
    buf = bucket.buffer()
    meter.buckets += 1
    meter.dense_bytes += buf.numel() * buf.element_size()
    before = ps.total_numel_after_compression
    plain = ps.iter < ps.start_powerSGD_iter
    why = _gloo_refusal(ps, bucket) if gloo and not plain else None
    if why is not None:
        meter.fallback_buckets += 1
        if meter.fallback_buckets == 1:
            warnings.warn(f"actzip DP powersgd: {why}; such buckets are all-reduced plain (counted in "
                          "DPMeter.fallback_buckets); larger DDP buckets (bucket_cap_mb) or NCCL avoid it",
                          stacklevel=2)
        ps.maybe_increase_iter(bucket)
        meter.add("all_reduce", buf.numel() * buf.element_size())
        return _mean_allreduce(dist.group.WORLD if ps.process_group is None else ps.process_group, buf)
    fut = powerSGD_hook(ps, bucket)
    sent = buf.numel() if plain else ps.total_numel_after_compression - before
    meter.add("all_reduce", sent * buf.element_size())
    return fut


def _gloo_refusal(ps, bucket) -> str | None:
    """Why torch's hook cannot take this bucket on gloo (its compressed or whole part would be empty), or None."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    squeezed = [g.view(g.shape[0], -1) if g.dim() > 1 else None for g in bucket.gradients()]
    compressed = [m is not None and _should_compress(m.shape[0], m.shape[1], ps.matrix_approximation_rank,
                                                     ps.min_compression_rate)[0] for m in squeezed]
    if all(compressed) or not any(compressed):
        part = "nothing it sends whole (no vector)" if all(compressed) else "nothing it compresses"
        return (f"gradient bucket {bucket.index()} holds {part}: torch's powerSGD_hook would all-reduce an empty "
                "tensor, which gloo aborts on (pytorch/pytorch#58467)")
    return None


def _topk_hook(state: _TopKState, bucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    meter, group = state.meter, state.group
    world = dist.get_world_size(group)
    meter.buckets += 1
    meter.dense_bytes += buf.numel() * buf.element_size()
    params = bucket.parameters()
    sizes = [g.numel() for g in bucket.gradients()]
    if all(id(p) in state.residuals for p in params):
        corrected = buf + torch.cat([state.residuals[id(p)] for p in params])
    else:  # the first step: nothing left over yet
        corrected = buf.clone()
    k = max(1, round(state.keep * buf.numel()))
    idx = torch.topk(corrected.abs(), k, sorted=False).indices
    values = corrected[idx]
    corrected[idx] = 0  # what is sent leaves the residual exactly
    for p, r in zip(params, corrected.split(sizes)):
        state.residuals[id(p)] = r
    meter.add("all_gather", k * (values.element_size() + 4))
    all_idx = [torch.empty(k, dtype=torch.int32, device=buf.device) for _ in range(world)]
    all_val = [torch.empty_like(values) for _ in range(world)]
    with meter.waiting():
        dist.all_gather(all_idx, idx.to(torch.int32), group=group)
        dist.all_gather(all_val, values, group=group)
    buf.zero_()
    for i, v in zip(all_idx, all_val):
        buf.index_add_(0, i.long(), v)
    fut = torch.futures.Future()
    fut.set_result(buf.div_(world))
    return fut


def _quant_hook(state: _QuantState, bucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    meter = state.meter
    meter.buckets += 1
    meter.dense_bytes += buf.numel() * buf.element_size()
    params = bucket.parameters()
    corrected = buf.float()
    if all(id(p) in state.residuals for p in params):
        corrected = corrected + torch.cat([state.residuals[id(p)] for p in params])
    payload = state.codec.encode(corrected, name=f"gradient bucket {bucket.index()}")
    left = corrected - state.codec.decode(payload).float()
    for p, r in zip(params, left.split([g.numel() for g in bucket.gradients()])):
        state.residuals[id(p)] = r
    meter.add("all_gather", payload.nbytes)
    buf.copy_(gathered_mean(state.codec, payload, buf, state.group, meter))
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def _check_one_bucket(ddp_model) -> None:
    cap = ddp_model._get_ddp_logging_data().get("bucket_cap_bytes")
    grads = sum(p.numel() * p.element_size() for p in ddp_model.parameters() if p.requires_grad)
    if cap is not None and grads > cap:
        raise ConfigError(f"DPConfig(method='powersgd') on gloo needs every gradient in one DDP bucket: "
                          f"{grads:,} bytes of gradients against bucket_cap_mb={cap / 2**20:g}; torch's "
                          "powerSGD_hook issues all-reduces from callbacks whose order gloo does not keep across "
                          f"replicas with two buckets in flight (they hang). Use bucket_cap_mb>={grads / 2**20:.3g}"
                          " or NCCL")


def attach(ddp_model, config: DPConfig, process_group=None) -> DPMeter:
    """Register ``config``'s hook on ``ddp_model`` (a ``DistributedDataParallel``); return its meter."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(ddp_model, DistributedDataParallel):
        raise ConfigError(f"attach: takes a torch.nn.parallel.DistributedDataParallel model, got "
                          f"{type(ddp_model).__name__}")
    group = process_group if process_group is not None else dist.group.WORLD
    shapes = [list(p.shape) for p in ddp_model.parameters() if p.requires_grad]
    check_same_config("DP attach", {"config": dataclasses.asdict(config), "parameters": shapes}, group)
    meter = DPMeter()
    if config.method == "powersgd" and dist.get_backend(group) == "gloo":
        _check_one_bucket(ddp_model)
    state, hook = make_hook(config, group, meter)
    ddp_model.register_comm_hook(state, hook)
    return meter


def make_hook(config: DPConfig, group, meter: DPMeter) -> tuple:
    """``(state, hook)`` for ``config`` over ``group``, metered into ``meter``: what :func:`attach` registers on a
    DDP model, and what :class:`~actzip.wire.dp.grad_sync.GradSync` calls on one flat bucket of a bare module."""
    if config.method == "allreduce":
        return (group, meter), _allreduce_hook
    if config.method == "bf16":
        return (group, meter), _bf16_hook
    if config.method == "powersgd":
        if config.start_iter < 2:  # torch's PowerSGD needs plain steps before its error feedback and warm start
            raise ConfigError(f"DPConfig.start_iter must be >= 2 for powersgd, got {config.start_iter}")
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        ps = PowerSGDState(process_group=group, matrix_approximation_rank=config.rank,
                           start_powerSGD_iter=config.start_iter, min_compression_rate=config.min_compression_rate,
                           random_seed=config.seed)
        return (ps, meter, dist.get_backend(group) == "gloo"), _powersgd_hook
    if config.method == "quant":
        return _QuantState(config.codec, group, meter), _quant_hook
    return _TopKState(config.keep, group, meter), _topk_hook
