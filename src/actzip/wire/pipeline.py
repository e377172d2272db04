"""Pipeline-parallel training with compressed stage boundaries: one stage per process, or all in one.

Each stage is an ``nn.Module``; stage 0 takes token ids, the last returns logits, and in between a stage
takes and returns a tensor or a dict of tensors (side channels such as token ids travel in the dict). A step
splits the batch into ``microbatches`` and runs them through a schedule:

- ``"gpipe"``: every stage runs all forwards, then all backwards;
- ``"1f1b"``: stage ``s`` of ``S`` runs ``S - s - 1`` warm-up forwards, then alternates one forward and one
  backward, then drains the backwards: fewer activations held at once, the same result.

A forward sends the stage's output through the boundary's forward codec (:mod:`actzip.wire.codecs`) to the next
stage, which decodes it into leaf tensors that require grad; a backward sends the gradients of those leaves
through the backward codec to the previous stage, which applies them to the outputs it kept (so a lossy
forward codec is a straight-through estimator: the gradient is taken at the decoded value). Gradients add up
over microbatches; then every stage steps its own optimizer and calls its module's ``after_optimizer_step()``
if it has one (a projection's retraction, a codebook's sync).

Every action is recorded as a :class:`~actzip.wire.link.Action` with its measured compute time (decode and
encode included, waiting excluded) and the bytes of the message it sent, so :func:`~actzip.wire.link.simulate`
replays the schedule over any modelled link.

A codebook desync (a stage-boundary RVQ codebook whose checksum differs from the sender's, e.g. after a lost
update) does not stop training: the receiver decodes that message with its codebook as it is (an approximate
activation for one microbatch; announced once, counted by :func:`codebook_desyncs`), and the gradient it sends
back carries a request that makes the sender's next message carry its whole codebook.

:func:`run_stage` runs one stage in a process of an initialized ``torch.distributed`` group (rank = stage),
launched by torchrun; :class:`SimulatedPipeline` runs all stages in one process (one GPU), the boundaries going
through the same codecs and the same wire format over in-process queues, so bytes and schedules are the same.
:func:`pipelining_stage` hands a stage whose compressor lives inside the module and whose message is one tensor
of fixed shape to PyTorch's own ``torch.distributed.pipelining`` schedules instead, with its bytes counted.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from actzip.codecs.rvq import CodebookDesyncError
from actzip.errors import ConfigError
from actzip.core.lr_schedule import check_lr_schedule, lr_scheduler
from actzip.wire.codecs import BoundaryCodec
from actzip.wire.link import Action
from actzip.wire.transport import (
    VERSION,
    DistBackend,
    LoopbackHub,
    Transport,
    WireDesyncError,
)

__all__ = [
    "SCHEDULES",
    "PipelineConfig",
    "SimulatedPipeline",
    "StageWorker",
    "codebook_desyncs",
    "lm_loss",
    "pipelining_stage",
    "run_stage",
    "schedule_actions",
]

SCHEDULES = ("gpipe", "1f1b")
_TENSOR = "_"  # item name of a stage output that is a single tensor
_IDS = "_ids"  # item name of the sample ids, sent when the forward codec keeps a per-sample cache
_RESYNC = "_resync"  # item of a gradient message: the receiver's codebook was out of sync, send a snapshot
_UP = "_up:"  # prefix of items of a step's last gradient message for the sender's module (wire_backward_items)
_desyncs = 0  # codebook desyncs met by receivers in this process (each decoded stale, then resynchronized)


def codebook_desyncs() -> int:
    """How many messages receivers in this process decoded with an out-of-sync codebook (then resynced)."""
    return _desyncs


def _decode_stale(wire_decode, msg, stage: int, err: Exception):
    global _desyncs
    import inspect

    if "stale_ok" not in inspect.signature(wire_decode).parameters:  # a user module: nothing to fall back on
        raise WireDesyncError(f"stage {stage}: {err}") from err
    out = wire_decode(msg, stale_ok=True)
    if _desyncs == 0:
        import warnings

        warnings.warn(f"actzip wire: stage {stage} found its codebook out of sync ({err}); it decodes with its "
                      "own codebook until the sender's snapshot arrives (requested with the gradient). Announced "
                      "once; see actzip.wire.pipeline.codebook_desyncs().", stacklevel=3)
    _desyncs += 1
    return out


@dataclass
class PipelineConfig:
    """How a pipeline runs; every stage must be given the same one (the handshake checks)."""

    schedule: str = "1f1b"  # microbatch order: "gpipe" or "1f1b"
    microbatches: int = 4  # microbatches per step; the batch size must be a multiple
    fwd_codec: str = "none"  # codec spec for activations sent forward (see actzip.wire.codecs)
    bwd_codec: str = "none"  # codec spec for gradients sent backward
    timeout_s: float = 60.0  # longest wait for a message from a peer before a WireTimeoutError
    lr: float = 1e-3  # AdamW learning rate (each stage has its own optimizer)
    # "constant", or "cosine": 5% linear warm-up, then cosine decay to lr / 10 over lr_steps optimizer steps
    # (see actzip.core.lr_schedule); a stage's own optimizer (configure_optimizer) follows it too
    lr_schedule: str = "constant"
    lr_steps: int | None = None  # length of the cosine schedule in steps (needed for "cosine")
    # one factor per stage: stage i trains at lr * stage_lr_scale[i] (each stage owns its optimizer, so the stages
    # on either side of a narrow boundary can learn at different rates); None: lr everywhere
    stage_lr_scale: tuple[float, ...] | None = None
    weight_decay: float = 0.1  # AdamW weight decay on matrices and embeddings (>= 2 dims)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas
    seed: int = 0  # base seed of the codecs' random draws
    compressor: str = "dense"  # the stage modules' own boundary compressor (recorded; both ends must agree)
    ratio: float = 1.0  # its compression ratio (recorded; both ends must agree)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"PipelineConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        m = self.microbatches
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ConfigError(f"PipelineConfig.microbatches must be a positive int, got {m!r}")
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
            raise ConfigError(f"PipelineConfig.timeout_s must be a positive number of seconds, got {t!r}")
        check_lr_schedule("PipelineConfig", self.lr_schedule, self.lr_steps)
        BoundaryCodec(self.fwd_codec, direction="fwd")  # raises a ConfigError naming a bad spec now, not later
        BoundaryCodec(self.bwd_codec, direction="bwd")
        if self.stage_lr_scale is not None:
            scale = self.stage_lr_scale
            if not isinstance(scale, (tuple, list)) or not scale or not all(
                    isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < math.inf for f in scale):
                raise ConfigError(f"PipelineConfig.stage_lr_scale must be positive finite numbers, one per stage, "
                                  f"got {scale!r}")
            self.stage_lr_scale = tuple(float(f) for f in scale)

    def stage_lr(self, stage: int, n_stages: int) -> float:
        """The learning rate of ``stage`` of ``n_stages``."""
        if self.stage_lr_scale is None:
            return self.lr
        if len(self.stage_lr_scale) != n_stages:
            raise ConfigError(f"PipelineConfig.stage_lr_scale has {len(self.stage_lr_scale)} factors for "
                              f"{n_stages} stages: give one per stage")
        return self.lr * self.stage_lr_scale[stage]


def schedule_actions(schedule: str, n_stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """The ("F" | "B", microbatch) actions of ``stage`` in one step, in order."""
    m = microbatches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule != "1f1b":
        raise ConfigError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")
    warm = min(n_stages - stage - 1, m)
    out = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        out += [("F", warm + i), ("B", i)]
    return out + [("B", i) for i in range(m - warm, m)]


def lm_loss(output, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of logits ``(B, T, V)`` (or ``output["logits"]``) against targets ``(B, T)``."""
    if isinstance(output, dict):
        if "logits" not in output:
            raise ConfigError(f"the last stage returned a dict without 'logits' (keys {sorted(output)})")
        output = output["logits"]
    return F.cross_entropy(output.float().reshape(-1, output.size(-1)), targets.reshape(-1))


def make_optimizer(module: nn.Module, cfg: PipelineConfig, lr: float | None = None) -> torch.optim.Optimizer:
    """AdamW with weight decay on parameters of >= 2 dims only (as the reference GPT configures it), at ``lr``
    (default ``cfg.lr``)."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr if lr is None else lr, betas=tuple(cfg.betas))


def _split(t: torch.Tensor | None, m: int, what: str) -> list:
    if t is None:
        return [None] * m
    if t.shape[0] % m:
        raise ConfigError(f"{what} has {t.shape[0]} rows, not a multiple of microbatches={m}")
    return list(t.chunk(m))


class StageWorker:
    """One stage: its module, optimizer, boundary codecs and transport; runs actions and records them."""

    def __init__(self, module: nn.Module, stage: int, n_stages: int, cfg: PipelineConfig, transport: Transport,
                 device: torch.device | str | None = None, loss_fn: Callable | None = None) -> None:
        if not 0 <= stage < n_stages:
            raise ConfigError(f"stage {stage} is outside 0..{n_stages - 1}")
        self.module, self.stage, self.n_stages, self.cfg = module, stage, n_stages, cfg
        self.transport = transport
        self.device = torch.device(device) if device is not None else next(module.parameters()).device
        self.first, self.last = stage == 0, stage == n_stages - 1
        base = cfg.seed * 7919 + 4 * stage
        self.fwd_send = None if self.last else BoundaryCodec(cfg.fwd_codec, direction="fwd", seed=base)
        self.bwd_recv = None if self.last else BoundaryCodec(cfg.bwd_codec, direction="bwd")
        self.fwd_recv = None if self.first else BoundaryCodec(cfg.fwd_codec, direction="fwd")
        self.bwd_send = None if self.first else BoundaryCodec(cfg.bwd_codec, direction="bwd", seed=base + 1)
        own = getattr(module, "configure_optimizer", None)  # a stage may know better (e.g. Stiefel parameters)
        lr = cfg.stage_lr(stage, n_stages)
        self.optimizer = (own(lr=lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas)) if callable(own)
                          else make_optimizer(module, cfg, lr))
        self.lr_scheduler = lr_scheduler(self.optimizer, cfg.lr_schedule, cfg.lr_steps, "PipelineConfig")
        self.loss_fn = loss_fn or lm_loss
        self.actions: list[Action] = []
        self.losses: list[float] = []  # per step, last stage only
        self._saved: dict[int, tuple] = {}
        self._resync: set[int] = set()  # microbatches decoded with an out-of-sync codebook: ask for a snapshot
        self._step = 0
        self._x = self._y = self._ids = None
        self._step_loss: list[torch.Tensor] = []
        self._backwards = 0  # backward actions done in this step: the last one returns the module's items
        self._exact = frozenset(getattr(module, "wire_exact_keys", ()))  # state items no lossy codec may touch

    # -- handshake --

    def neighbors(self) -> list[int]:
        return [s for s in (self.stage - 1, self.stage + 1) if 0 <= s < self.n_stages]

    def link_config(self, peer: int) -> dict:
        """What both ends of the boundary with ``peer`` must agree on."""
        b = min(peer, self.stage)
        fwd = (self.fwd_send if peer > self.stage else self.fwd_recv).describe()
        bwd = (self.bwd_recv if peer > self.stage else self.bwd_send).describe()
        cfg = self.cfg
        return {"protocol": VERSION, "boundary": b, "n_stages": self.n_stages, "schedule": cfg.schedule,
                "microbatches": cfg.microbatches, "fwd_codec": fwd, "bwd_codec": bwd,
                "compressor": cfg.compressor, "ratio": cfg.ratio}

    def send_hellos(self) -> None:
        for p in self.neighbors():
            self.transport.send_hello(p, self.link_config(p))

    def check_hellos(self) -> None:
        for p in self.neighbors():
            self.transport.check_hello(p)

    # -- a step --

    def begin_step(self, step: int, x=None, y=None, ids=None) -> None:
        m = self.cfg.microbatches
        self._step = step
        self._x = _split(x, m, "the input batch") if self.first else None
        self._y = _split(y, m, "the target batch") if self.last else None
        self._ids = _split(ids, m, "the sample ids") if self.first else None
        self._step_loss = []
        self._backwards = 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _record(self, kind, mb, t0, recv=None, send=None, nbytes=0) -> None:
        self._sync()
        self.actions.append(Action(self.stage, self._step, kind, mb, time.perf_counter() - t0, recv, send, nbytes))

    def _receive_input(self, mb: int, train: bool):
        msg = self.transport.recv(self.stage - 1, channel="fwd", state=self.fwd_recv.state_digest(),
                                  device=self.device)
        t0 = time.perf_counter()
        items = dict(msg.items)
        ids = items.pop(_IDS, None)
        dec = self.fwd_recv.decode(items, ids, exact=self._exact)
        msg = dec[_TENSOR] if set(dec) == {_TENSOR} else dec
        wire_decode = getattr(self.module, "wire_decode", None)
        if callable(wire_decode):
            try:
                msg = wire_decode(msg)  # the stage rebuilds what its sender left off the link (e.g. RVQ codes)
            except CodebookDesyncError as e:
                msg = _decode_stale(wire_decode, msg, self.stage, e)
                self._resync.add(mb)
        if isinstance(msg, torch.Tensor):
            msg = {_TENSOR: msg}
        leaves = {k: (v.detach().requires_grad_(True) if train and v.is_floating_point() else v)
                  for k, v in msg.items()}
        inp = leaves[_TENSOR] if set(leaves) == {_TENSOR} else leaves
        return inp, leaves, ids, t0

    def _items(self, out, what: str) -> dict[str, torch.Tensor]:
        if isinstance(out, torch.Tensor):
            return {_TENSOR: out}
        if isinstance(out, dict) and all(isinstance(v, torch.Tensor) for v in out.values()):
            bad = [k for k in out if not isinstance(k, str) or k.startswith("_")]
            if bad:
                raise ConfigError(f"stage {self.stage}'s {what} has dict keys {bad}: keys must be strings not "
                                  f"starting with '_' (reserved for the wire)")
            return dict(out)
        raise ConfigError(f"stage {self.stage}'s {what} is a {type(out).__name__}; a stage returns a tensor or a "
                          f"dict of tensors")

    def _send_output(self, out, ids) -> tuple[int, dict]:
        items = self._items(out, "output")  # kept for the backward
        wire_encode = getattr(self.module, "wire_encode", None)
        wire = self._items(wire_encode(out), "wire message") if callable(wire_encode) else items
        enc = self.fwd_send.encode(wire, ids if self.fwd_send.needs_ids else None, exact=self._exact)
        if self.fwd_send.needs_ids and ids is not None:
            enc[_IDS] = ids.to(torch.int32) if ids.max() < 2**31 else ids
        state = self.fwd_send.state_digest()
        return self.transport.send(self.stage + 1, enc, channel="fwd", state=state, clock=time.monotonic()), items

    def forward(self, mb: int) -> None:
        train = torch.is_grad_enabled()
        recv_key = None
        if self.first:
            t0 = time.perf_counter()
            inp, leaves = self._x[mb].to(self.device), {}
            ids = self._ids[mb]
        else:
            inp, leaves, ids, t0 = self._receive_input(mb, train)
            recv_key = (self.stage - 1, "fwd", self._step, mb)
        out = self.module(inp)
        if self.last:
            loss = self.loss_fn(out, self._y[mb].to(self.device)) / self.cfg.microbatches
            self._step_loss.append(loss.detach())
            self._saved[mb] = (leaves, loss)
            self._record("F", mb, t0, recv_key)
            return
        nbytes, items = self._send_output(out, ids)
        if train:
            self._saved[mb] = (leaves, items)
        self._record("F", mb, t0, recv_key, (self.stage, "fwd", self._step, mb), nbytes)

    def backward(self, mb: int) -> None:
        leaves, saved = self._saved.pop(mb)
        recv_key = None
        if self.last:
            t0 = time.perf_counter()
            saved.backward()
        else:
            msg = self.transport.recv(self.stage + 1, channel="bwd", state=self.bwd_recv.state_digest(),
                                      device=self.device)
            t0 = time.perf_counter()
            items = dict(msg.items)
            if items.pop(_RESYNC, None) is not None and callable(getattr(self.module, "request_resync", None)):
                self.module.request_resync()  # the next forward message carries the whole codebook
            up = {k[len(_UP):]: items.pop(k) for k in [k for k in items if k.startswith(_UP)]}
            if up:
                accept = getattr(self.module, "wire_backward_accept", None)
                if not callable(accept):
                    raise WireDesyncError(f"stage {self.stage}: the gradient message carries {sorted(up)} for a "
                                          f"module without wire_backward_accept")
                accept(up)
            grads = self.bwd_recv.decode(items)
            unknown = sorted(set(grads) - set(saved))
            if unknown:
                raise WireDesyncError(f"stage {self.stage}: gradients arrived for {unknown}, which stage "
                                      f"{self.stage} did not send (it sent {sorted(saved)})")
            keys = [k for k in grads if saved[k].requires_grad]
            if keys:
                torch.autograd.backward([saved[k] for k in keys], [grads[k].to(saved[k].dtype) for k in keys])
            recv_key = (self.stage, "bwd", self._step, mb)
        send_key, nbytes = None, 0
        self._backwards += 1
        if not self.first:
            g = {k: v.grad for k, v in leaves.items() if isinstance(v, torch.Tensor) and v.grad is not None}
            enc = self.bwd_send.encode(g)
            items_up = getattr(self.module, "wire_backward_items", None)
            if self._backwards == self.cfg.microbatches and callable(items_up):  # the step's backward is done
                enc.update({_UP + k: v for k, v in items_up().items()})
            if mb in self._resync:
                self._resync.discard(mb)
                enc[_RESYNC] = torch.ones(1, dtype=torch.uint8, device=self.device)
            nbytes = self.transport.send(self.stage - 1, enc, channel="bwd", state=self.bwd_send.state_digest(),
                                         clock=time.monotonic())
            send_key = (self.stage - 1, "bwd", self._step, mb)
        self._record("B", mb, t0, recv_key, send_key, nbytes)

    def optimizer_step(self) -> None:
        t0 = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.lr_scheduler.step()
        hook = getattr(self.module, "after_optimizer_step", None)
        if callable(hook):
            hook()
        self._record("O", -1, t0)
        if self.last:
            self.losses.append(float(torch.stack(self._step_loss).sum()))

    def run(self, kind: str, mb: int) -> None:
        (self.forward if kind == "F" else self.backward)(mb)


class SimulatedPipeline:
    """All stages in one process; boundaries go through the same codecs, wire format and meter.

    ``stages``: the stage modules, already on ``device``. Each step runs every stage's schedule, interleaved
    so that no stage waits; :attr:`actions` holds the measured trace for :func:`~actzip.wire.link.simulate`.
    """

    def __init__(self, stages: list[nn.Module], cfg: PipelineConfig, device: torch.device | str | None = None,
                 loss_fn: Callable | None = None) -> None:
        if len(stages) < 2:
            raise ConfigError(f"a pipeline needs at least 2 stages, got {len(stages)}")
        device = torch.device(device) if device is not None else next(stages[0].parameters()).device
        self.cfg, self.device = cfg, device
        self.hub = LoopbackHub(device)
        n = len(stages)
        self.workers = [StageWorker(m, i, n, cfg, Transport(self.hub.backend(i), i, timeout_s=cfg.timeout_s),
                                    device, loss_fn) for i, m in enumerate(stages)]
        for w in self.workers:
            w.send_hellos()
        for w in self.workers:
            w.check_hellos()
        self.step = 0

    @property
    def actions(self) -> list[Action]:
        return [a for w in self.workers for a in w.actions]

    @property
    def losses(self) -> list[float]:
        return self.workers[-1].losses

    def meters(self) -> list:
        return [w.transport.meter for w in self.workers]

    def _ready(self, s: int, kind: str) -> bool:
        if kind == "F":
            return s == 0 or self.hub.ready(s - 1, s)
        return s == len(self.workers) - 1 or self.hub.ready(s + 1, s)

    def _drive(self, plans: dict[int, deque]) -> None:
        while any(plans.values()):
            progressed = False
            for s, w in enumerate(self.workers):
                while plans[s] and self._ready(s, plans[s][0][0]):
                    w.run(*plans[s].popleft())
                    progressed = True
            if not progressed:
                stuck = {s: p[0] for s, p in plans.items() if p}
                raise WireDesyncError(f"simulated pipeline stalled: next actions {stuck}")

    def train_step(self, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor | None = None) -> float:
        """One training step on batch ``x`` (token ids), ``y`` (targets); returns its mean loss."""
        n = len(self.workers)
        for w in self.workers:
            w.begin_step(self.step, x, y, ids)
        self._drive({s: deque(schedule_actions(self.cfg.schedule, n, s, self.cfg.microbatches)) for s in range(n)})
        for w in self.workers:
            w.optimizer_step()
        self.step += 1
        return self.losses[-1]

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Mean loss of a forward pass through the pipeline (codecs applied, no sample cache); not recorded."""
        n = len(self.workers)
        kept = [len(w.actions) for w in self.workers]
        for w in self.workers:
            w.begin_step(-1, x, y, None)
        self._drive({s: deque(("F", i) for i in range(self.cfg.microbatches)) for s in range(n)})
        last = self.workers[-1]
        loss = float(torch.stack(last._step_loss).sum())
        for w, k in zip(self.workers, kept):
            del w.actions[k:]
            w._saved.clear()
        return loss


def run_stage(module: nn.Module, cfg: PipelineConfig, batches: Callable[[int], tuple], steps: int, *,
              device: torch.device | str | None = None, group=None, loss_fn: Callable | None = None,
              progress: Callable[[int, float | None], None] | None = None,
              probe: Callable[[], dict] | None = None,
              until: Callable[[list[float]], bool] | None = None, max_steps: int | None = None) -> dict | None:
    """Run this process's stage (stage = rank in ``group``) for ``steps`` steps; torchrun starts one per stage.

    ``batches(step)`` returns ``(x, y, ids)`` for a step and must give every rank the same batch (stage 0 uses
    ``x`` and ``ids``, the last stage ``y``). Returns, on rank 0, ``{"actions", "losses", "wall_step_end_s",
    "meters", "probes"}`` gathered from every rank; ``None`` elsewhere. ``probe()``, if given, is called on every
    rank after the handshake and after the last step (each behind a barrier, so the region holds the training
    traffic only; e.g. to read network interface counters); ``probes`` holds each rank's two results. On any
    error the rank tells its neighbors why (they raise :class:`~actzip.wire.transport.WirePeerError`) and
    re-raises.

    With ``until`` and ``max_steps``, training goes on past ``steps`` (up to ``max_steps``) until ``until(losses)``
    is true on the last stage; its answer is broadcast to every rank after each such step (one small collective
    per extra step, so all ranks stop together).
    """
    import torch.distributed as dist

    backend = DistBackend(group)
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    transport = Transport(backend, rank, timeout_s=cfg.timeout_s)
    worker = StageWorker(module, rank, n, cfg, transport, device, loss_fn)
    try:
        worker.send_hellos()
        worker.check_hellos()
        probes = []
        if probe is not None:
            dist.barrier(group)
            probes.append(probe())
        wall_end = []
        t_start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of a host
        limit = steps if until is None or max_steps is None else max(steps, max_steps)
        flag = torch.zeros(1, dtype=torch.int32, device=backend.device)
        for step in range(limit):
            if step >= steps:
                if worker.last:
                    flag.fill_(int(bool(until(worker.losses))))
                dist.broadcast(flag, src=n - 1, group=group)
                if int(flag.item()):  # the benchmark's stop test; not a training hot path
                    break
            x, y, ids = batches(step)
            worker.begin_step(step, x, y, ids)
            for kind, mb in schedule_actions(cfg.schedule, n, rank, cfg.microbatches):
                worker.run(kind, mb)
            worker.optimizer_step()
            wall_end.append(time.monotonic())
            if progress is not None:
                progress(step, worker.losses[-1] if worker.last else None)
        transport.flush()
        if probe is not None:
            dist.barrier(group)
            probes.append(probe())
    except BaseException as e:
        transport.abort(worker.neighbors(), f"rank {rank} (stage {rank}) failed: {type(e).__name__}: {e}")
        raise
    mine = {"actions": [a.as_tuple() for a in worker.actions], "losses": worker.losses, "wall": wall_end,
            "start": t_start, "meter": transport.meter.as_dict(), "probes": probes}
    got = [None] * n if rank == 0 else None
    dist.gather_object(mine, got, dst=0, group=group)
    if rank != 0:
        return None
    t0 = min(r["start"] for r in got)
    return {"actions": [Action.from_tuple(a) for r in got for a in r["actions"]], "losses": got[-1]["losses"],
            "wall_step_end_s": [max(r["wall"][i] for r in got) - t0 for i in range(len(got[0]["wall"]))],
            "meters": [r["meter"] for r in got], "probes": [r["probes"] for r in got], "config": asdict(cfg)}


# ---- torch.distributed.pipelining, where it fits -------------------------------------------------------------


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
                    f"variable sizes need actzip's runner (run_stage)")
            self.meter.add("sent", "fwd", out.numel() * out.element_size(), 0)
        return out


def pipelining_stage(module: nn.Module, stage: int, n_stages: int, device: torch.device | str, meter=None,
                     group=None):
    """``module`` as a ``torch.distributed.pipelining.PipelineStage``, its boundary tensors counted in ``meter``
    (a :class:`~actzip.wire.transport.ByteMeter`; ``header_bytes`` stay 0: PyTorch sends raw tensors).

    It fits stages whose compressor lives inside the module and whose message is one tensor of fixed shape
    (dense, a bottleneck or projection code): PyTorch's schedules (``ScheduleGPipe``, ``Schedule1F1B``, ...) then
    run them unchanged. Dict messages, byte codecs and fault reporting need :func:`run_stage`.
    """
    from torch.distributed.pipelining import PipelineStage

    from actzip.wire.transport import ByteMeter

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
