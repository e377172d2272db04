"""The one pipeline entry: :class:`Pipeline` trains a model's stages with compressed boundaries, all stages in
this process or one stage per rank of a ``torch.distributed`` group (launched by torchrun).

Stages are ``nn.Module``\\ s, usually :class:`actzip.wire.Stage`\\ s. The first takes the batch input, the last
returns what ``loss_fn(output, targets)`` takes (default: logits and cross entropy); in between a stage takes
and returns a tensor or a dict of tensors (side channels such as token ids travel in the dict). A step splits
the batch into ``config.microbatches`` and runs them through the schedule (:mod:`~.schedule`), each stage
through a :class:`~actzip.wire.pipeline.worker.StageWorker`.

In one process the boundaries go through the same codecs and the same wire format over in-process queues as
between processes, so bytes and schedules are the same; the stages' actions interleave so that no stage waits.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.distributed as dist

from actzip.errors import ConfigError, WireDesyncError
from actzip.wire.backends import DistBackend, LoopbackHub
from actzip.wire.boundaries import parse_boundary
from actzip.wire.link import Action
from actzip.wire.pipeline.config import PipelineConfig
from actzip.wire.pipeline.schedule import schedule_actions
from actzip.wire.pipeline.worker import StageWorker
from actzip.wire.transport import Transport

__all__ = ["Pipeline"]


def _check_boundaries(stages, cfg: PipelineConfig) -> None:
    """Stages whose boundary ends are not the kind ``cfg.boundary`` names (if it does) are refused."""
    if cfg.boundary is None:
        return
    want = parse_boundary(cfg.boundary)[0]
    for i, s in enumerate(stages):
        have = getattr(s, "boundary", None)
        if isinstance(have, str) and have != want:
            raise ConfigError(f"Pipeline: stage {i} holds {have!r} boundary ends but PipelineConfig.boundary is "
                              f"{cfg.boundary!r}; give the config the stages' boundary")


class Pipeline:
    """Pipeline-parallel training of ``stages`` under ``config``.

    ``Pipeline(stages, config)`` runs every stage in this process (``stages`` already on ``device``).
    ``Pipeline(stages, config, distributed=True)`` runs this rank's stage (rank = stage in ``group``, an
    initialized ``torch.distributed`` process group): ``stages`` is either a list of every stage (this rank's
    is taken) or this rank's module alone. On an error a rank tells its neighbours why (they raise
    :class:`~actzip.errors.WirePeerError`) and re-raises.

    Example: two stages of ``nn.Sequential`` layers, 8-bit activations and gradients on the wire::

        >>> import torch
        >>> from torch import nn
        >>> from actzip.wire import Pipeline, PipelineConfig
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> stages = [nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8)), nn.Sequential(nn.ReLU(), nn.Linear(8, 16))]
        >>> pipe = Pipeline(stages, PipelineConfig(microbatches=2, codec="quant:bits=8", lr=1e-2))
        >>> x = torch.randint(0, 16, (4, 5))
        >>> losses = [pipe.train_step(x, x) for _ in range(20)]
        >>> losses[-1] < losses[0]
        True
        >>> pipe.meters()[0].total("sent", "fwd") > 0
        True
    """

    def __init__(self, stages, config: PipelineConfig, device: torch.device | str | None = None,
                 loss_fn: Callable | None = None, *, distributed: bool = False, group=None, down_group=None,
                 before_update: Callable | None = None) -> None:
        if not isinstance(config, PipelineConfig):
            raise ConfigError(f"Pipeline: config must be a PipelineConfig, got {type(config).__name__}")
        self.cfg, self.distributed, self.group, self.step = config, distributed, group, 0
        self.down_group = down_group  # distributed: the group of traffic towards lower ranks, if made already
        self.before_update = before_update  # called with each StageWorker after the backwards, before its update
        if distributed:
            self._init_rank(stages, device, loss_fn)
            return
        stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
        if len(stages) < 2:
            raise ConfigError(f"a pipeline needs at least 2 stages, got {len(stages)}")
        _check_boundaries(stages, config)
        device = torch.device(device) if device is not None else next(stages[0].parameters()).device
        self.device = device
        self.hub = LoopbackHub(device)
        n = len(stages)
        self.workers = [StageWorker(m, i, n, config, Transport(self.hub.backend(i), i, timeout_s=config.timeout_s),
                                    device, loss_fn) for i, m in enumerate(stages)]
        for w in self.workers:
            w.send_hellos()
        for w in self.workers:
            w.check_hellos()

    def _init_rank(self, stages, device, loss_fn) -> None:
        backend = DistBackend(self.group, down_group=self.down_group)
        self.rank, self.n_stages = dist.get_rank(self.group), dist.get_world_size(self.group)
        if isinstance(stages, (list, tuple)):
            if len(stages) != self.n_stages:
                raise ConfigError(f"Pipeline(distributed=True): {len(stages)} stages for {self.n_stages} ranks; "
                                  "give one stage per rank, or this rank's stage alone")
            module = stages[self.rank]
        else:
            module = stages
        _check_boundaries([module], self.cfg)
        self.transport = Transport(backend, self.rank, timeout_s=self.cfg.timeout_s)
        self.workers = [StageWorker(module, self.rank, self.n_stages, self.cfg, self.transport, device, loss_fn)]
        self.device = self.workers[0].device
        with self._reporting():
            self.workers[0].send_hellos()
            self.workers[0].check_hellos()

    @contextlib.contextmanager
    def _reporting(self):
        """On an error, tell the neighbouring ranks why before re-raising (in one process: just re-raise)."""
        try:
            yield
        except BaseException as e:
            if self.distributed:
                w = self.workers[0]
                self.transport.abort(w.neighbors(), f"rank {w.stage} (stage {w.stage}) failed: "
                                                    f"{type(e).__name__}: {e}")
            raise

    @property
    def actions(self) -> list[Action]:
        """Every action recorded so far (this rank's only, distributed), for :func:`~actzip.wire.link.simulate`."""
        return [a for w in self.workers for a in w.actions]

    @property
    def losses(self) -> list[float]:
        """Mean loss per step (on the last stage; empty on other ranks)."""
        return self.workers[-1].losses

    def meters(self) -> list:
        """Each stage's :class:`~actzip.wire.transport.ByteMeter` (this rank's only, distributed)."""
        return [w.transport.meter for w in self.workers]

    # -- steps --

    def _ready(self, s: int, kind: str) -> bool:
        if kind == "F":
            return s == 0 or self.hub.ready(s - 1, s)
        return s == len(self.workers) - 1 or self.hub.ready(s + 1, s)

    def _drive(self, plans: dict[int, deque]) -> None:
        if self.distributed:
            w = self.workers[0]
            # every forward but the first stage's takes one message from below, every backward but the last
            # stage's one from above: the transport receives them ahead while this stage computes
            w.transport.expect(w.stage - 1, 0 if w.first else sum(k == "F" for k, _ in plans[0]))
            w.transport.expect(w.stage + 1, 0 if w.last else sum(k == "B" for k, _ in plans[0]))
            for kind, mb in plans[0]:
                w.run(kind, mb)
            return
        while any(plans.values()):
            progressed = False
            for s, w in enumerate(self.workers):
                while plans[s] and self._ready(s, plans[s][0][0]):
                    w.run(*plans[s].popleft())
                    progressed = True
            if not progressed:
                stuck = {s: p[0] for s, p in plans.items() if p}
                raise WireDesyncError(f"in-process pipeline stalled: next actions {stuck}")

    def _n(self) -> int:
        return self.n_stages if self.distributed else len(self.workers)

    def _plans(self, forward_only: bool = False) -> dict[int, deque]:
        n, m = self._n(), self.cfg.microbatches
        stages = [self.workers[0].stage] if self.distributed else range(n)
        plans = {s: deque(("F", i) for i in range(m)) if forward_only
                 else deque(schedule_actions(self.cfg.schedule, n, s, m)) for s in stages}
        return {0: plans[stages[0]]} if self.distributed else plans

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None, ids: torch.Tensor | None = None):
        """One training step on inputs ``x`` and targets ``y`` (every rank may pass the same batch: the first
        stage uses ``x`` and ``ids``, the last ``y``); ``ids`` are sample ids for a per-sample codec cache.
        Returns the step's mean loss (``None`` on ranks other than the last)."""
        with self._reporting():
            for w in self.workers:
                w.begin_step(self.step, x, y, ids)
            self._drive(self._plans())
            for w in self.workers:
                if self.before_update is not None:
                    self.before_update(w)
                w.optimizer_step()
        self.step += 1
        return self.losses[-1] if self.workers[-1].last else None

    def compute_grads(self, x: torch.Tensor | None, y: torch.Tensor | None) -> float | None:
        """The forwards and backwards of a step, leaving the gradients in each stage's parameters (no update, no
        sample cache, nothing recorded); returns the loss on the last stage (``None`` elsewhere)."""
        kept = [len(w.actions) for w in self.workers]
        with self._reporting():
            for w in self.workers:
                w.begin_step(-1, x, y, None)
            self._drive(self._plans())
        last = self.workers[-1]
        loss = last.step_loss() if last.last else None
        for w, k in zip(self.workers, kept):
            w.forget(k)
        return loss

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor):
        """Mean loss of a forward pass (codecs applied, no sample cache), not recorded; ``None`` on ranks other
        than the last."""
        kept = [len(w.actions) for w in self.workers]
        with self._reporting():
            for w in self.workers:
                w.begin_step(-1, x, y, None)
            self._drive(self._plans(forward_only=True))
        last = self.workers[-1]
        loss = last.step_loss() if last.last else None
        for w, k in zip(self.workers, kept):
            w.forget(k)
        return loss

    def run(self, batches: Callable[[int], tuple], steps: int, *,
            progress: Callable[[int, float | None], None] | None = None,
            probe: Callable[[], dict] | None = None,
            until: Callable[[list[float]], bool] | None = None, max_steps: int | None = None) -> dict | None:
        """Train ``steps`` steps on ``batches(step) -> (x, y, ids)`` (the same batch on every rank) and return
        ``{"actions", "losses", "wall_step_end_s", "meters", "probes", "config"}``, gathered from every rank on
        rank 0 (``None`` on the other ranks).

        ``probe()``, if given, is called after the handshake and after the last step (distributed: on every
        rank, each behind a barrier, so the region holds the training traffic only; e.g. to read network
        interface counters); ``probes`` holds each stage's two results. With ``until`` and ``max_steps``,
        training goes on past ``steps`` (up to ``max_steps``) until ``until(losses)`` is true on the last stage
        (distributed: its answer is broadcast after each such step, so all ranks stop together).
        """
        probes, wall_end = [], []
        t_start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of a host
        limit = steps if until is None or max_steps is None else max(steps, max_steps)
        with self._reporting():
            if probe is not None:
                self._barrier()
                probes.append(probe())
            flag = torch.zeros(1, dtype=torch.int32, device=self.transport.device if self.distributed else "cpu")
            for step in range(limit):
                if step >= steps:
                    if self.workers[-1].last:
                        flag.fill_(int(bool(until(self.losses))))
                    if self.distributed:
                        dist.broadcast(flag, src=self.n_stages - 1, group=self.group)
                    if int(flag.item()):  # the stop test; not a training hot path
                        break
                x, y, ids = batches(step)
                loss = self.train_step(x, y, ids)
                wall_end.append(time.monotonic())
                if progress is not None:
                    progress(step, loss)
            if self.distributed:
                self.transport.flush()
            if probe is not None:
                self._barrier()
                probes.append(probe())
        if not self.distributed:
            return {"actions": self.actions, "losses": self.losses, "wall_step_end_s": [t - t_start for t in wall_end],
                    "meters": [m.as_dict() for m in self.meters()], "probes": [probes] * len(self.workers),
                    "config": asdict(self.cfg)}
        w = self.workers[0]
        mine = {"actions": [a.as_tuple() for a in w.actions], "losses": w.losses, "wall": wall_end,
                "start": t_start, "meter": self.transport.meter.as_dict(), "probes": probes}
        got = [None] * self.n_stages if self.rank == 0 else None
        dist.gather_object(mine, got, dst=0, group=self.group)
        if self.rank != 0:
            return None
        t0 = min(r["start"] for r in got)
        return {"actions": [Action.from_tuple(a) for r in got for a in r["actions"]], "losses": got[-1]["losses"],
                "wall_step_end_s": [max(r["wall"][i] for r in got) - t0 for i in range(len(got[0]["wall"]))],
                "meters": [r["meter"] for r in got], "probes": [r["probes"] for r in got], "config": asdict(self.cfg)}

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(self.group)
