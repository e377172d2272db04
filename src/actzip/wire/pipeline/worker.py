"""One stage of a pipeline: its module, optimizer, byte codecs and transport; it runs and records actions.

A forward sends the stage's output through the forward codec (:mod:`actzip.wire.codecs`) to the next stage,
which decodes it into leaf tensors that require grad; a backward sends the gradients of those leaves through
the backward codec to the previous stage, which applies them to the outputs it kept (so a lossy forward codec
is a straight-through estimator: the gradient is taken at the decoded value). Gradients add up over
microbatches; then every stage steps its own optimizer and calls its module's ``after_optimizer_step()`` if it
has one (a projection's retraction, a codebook's sync).

Every action is recorded as a :class:`~actzip.wire.link.Action` with its measured compute time (decode and
encode included, waiting excluded) and the bytes of the message it sent, so :func:`~actzip.wire.link.simulate`
replays the schedule over any modelled link.

A codebook desync (a stage-boundary RVQ codebook whose checksum differs from the sender's, e.g. after a lost
update) does not stop training: the receiver decodes that message with its codebook as it is (an approximate
activation for one microbatch; announced once, counted by :func:`codebook_desyncs`), and the gradient it sends
back carries a request that makes the sender's next message carry its whole codebook.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from actzip.core.lr_schedule import lr_scheduler
from actzip.errors import CodebookDesyncError, ConfigError, WireDesyncError
from actzip.wire.codecs import WireCodec
from actzip.wire.link import Action
from actzip.wire.pipeline.config import PipelineConfig
from actzip.wire.stages import stage_optimizer
from actzip.wire.transport import VERSION, Transport

__all__ = ["StageWorker", "codebook_desyncs", "lm_loss"]

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
    if "stale_ok" not in inspect.signature(wire_decode).parameters:  # a user module: nothing to fall back on
        raise WireDesyncError(f"stage {stage}: {err}") from err
    out = wire_decode(msg, stale_ok=True)
    if _desyncs == 0:
        warnings.warn(f"actzip wire: stage {stage} found its codebook out of sync ({err}); it decodes with its "
                      "own codebook until the sender's snapshot arrives (requested with the gradient). Announced "
                      "once; see actzip.wire.pipeline.codebook_desyncs().", stacklevel=3)
    _desyncs += 1
    return out


def lm_loss(output, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of logits ``(B, T, V)`` (or ``output["logits"]``) against targets ``(B, T)``."""
    if isinstance(output, dict):
        if "logits" not in output:
            raise ConfigError(f"the last stage returned a dict without 'logits' (keys {sorted(output)})")
        output = output["logits"]
    return F.cross_entropy(output.float().reshape(-1, output.size(-1)), targets.reshape(-1))


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
        self.fwd_send = None if self.last else WireCodec(cfg.fwd_spec, direction="fwd", seed=base)
        self.bwd_recv = None if self.last else WireCodec(cfg.bwd_spec, direction="bwd")
        self.fwd_recv = None if self.first else WireCodec(cfg.fwd_spec, direction="fwd")
        self.bwd_send = None if self.first else WireCodec(cfg.bwd_spec, direction="bwd", seed=base + 1)
        own = getattr(module, "configure_optimizer", None)  # a stage may know better (e.g. Stiefel parameters)
        lr = cfg.stage_lr(stage, n_stages)
        kind = {} if cfg.optimizer == "adamw" else {"optimizer": cfg.optimizer}  # a user's method may lack it
        self.optimizer = (own(lr=lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas), **kind)
                          if callable(own) else stage_optimizer(module, lr=lr, weight_decay=cfg.weight_decay,
                                                                betas=cfg.betas, optimizer=cfg.optimizer))
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
        end = getattr(self.module, "sender" if peer > self.stage else "receiver", None)
        kind = getattr(getattr(end, "cfg", None), "name", "dense")  # no ends: the activation goes as it is
        return {"protocol": VERSION, "link": b, "n_stages": self.n_stages, "schedule": cfg.schedule,
                "microbatches": cfg.microbatches, "fwd_codec": fwd, "bwd_codec": bwd,
                "boundary": kind}

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
            self.losses.append(self.step_loss())

    def run(self, kind: str, mb: int) -> None:
        (self.forward if kind == "F" else self.backward)(mb)

    def step_loss(self) -> float:
        """The loss of this step's microbatches run so far, summed (the last stage; each is already divided by
        the number of microbatches)."""
        return float(torch.stack(self._step_loss).sum())

    def forget(self, actions_kept: int) -> None:
        """Drop what this step kept for a backward and the actions recorded after the first ``actions_kept``
        (after a forward-only evaluation pass)."""
        del self.actions[actions_kept:]
        self._saved.clear()

