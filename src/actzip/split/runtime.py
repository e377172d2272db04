"""Split learning over actzip's wire transport: clients hold the first layers (one encoder per modality), a server
holds the rest; activations go up and gradients come down compressed, every byte metered.

Each client step (:class:`SplitClient`) encodes its modalities, packs each at its keep-ratio through the
compressor of :class:`SplitConfig` (:mod:`actzip.split.uplink`), and sends them with the labels on the ``fwd``
channel; the server (:class:`SplitServer`) unpacks them into dense views, runs its model and loss, updates
itself, and sends each modality's gradient back on ``bwd`` with the keep-ratios the client is to use next
(ModalShare's, from Shapley scores of the batch it has just received, every ``refresh`` steps; or the equal
ones). With ``score_on="heldout"`` ModalShare scores only the batches a client sends with
:meth:`SplitClient.score`: samples the client keeps out of training, sent at the current keep-ratios like any
batch (or, with ``score_at="equal"``, at the equal ones: the same payload, and a modality kept low is not scored
low for it), which the server scores and does not train on (a stream the server has memorized from the training
samples earns nothing on them); the client sends one in place of a training batch every ``refresh`` steps.
Both ends derive every step's mask and rounding seeds from the config, the client's rank and the step, so only
values, indices and payloads travel. The server serves its clients in turn (sequential split learning,
one update a client) or in parallel (:meth:`SplitServer.serve_parallel`: every client's batch in one update, the
clients computing at the same time); :func:`fed_average` averages the clients' encoders (SplitFed), in one process
or over a process group.

The transport is :class:`~actzip.wire.transport.Transport`: on a :class:`~actzip.wire.backends.DistBackend`
under torchrun (gloo or NCCL), or on a :class:`~actzip.wire.backends.LoopbackBackend` with every party in one
process (:meth:`SplitClient.forward`, :meth:`SplitServer.serve` and :meth:`SplitClient.backward` in that order).
Both ends exchange the config first: a client built with other settings than its server is an error on both
(:class:`~actzip.errors.WireConfigMismatchError`), a silent peer a :class:`~actzip.errors.WireTimeoutError`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.codecs.lossy import ROUNDINGS
from actzip.errors import ConfigError
from actzip.split.allocation import equal_keep_ratios, keep_ratios
from actzip.split.coalitions import ABSENT, coalition_values
from actzip.split.shapley import shapley
from actzip.split.uplink import COMPRESSORS, Link, check_levels, least_ratio, pack, pack_grad, unpack, unpack_grad

__all__ = ["SCORE_AT", "SCORE_ON", "SPLIT_POLICIES", "SplitClient", "SplitConfig", "SplitServer", "fed_average",
           "scoring_ratios"]

SPLIT_POLICIES = ("equal", "modalshare")
SCORE_ON = ("received", "heldout")  # what ModalShare scores: every refresh-th batch received, or scoring batches
# the keep-ratios a scoring batch is sent at: the policy's own, the equal ones, or the policy's own each raised to
# at least the equal one and all scaled back to the budget (scoring_ratios)
SCORE_AT = ("current", "equal", "raised")


@dataclass
class SplitConfig:
    """What both ends of a split-learning link agree on."""

    sizes: tuple[int, ...]  # features the client sends per modality
    compressor: str = "random"  # one of actzip.split.uplink.COMPRESSORS
    compression: float = 1.0  # the modalities' dense payload / the payload sent (1: dense)
    policy: str = "equal"  # keep-ratios: "equal", or "modalshare" (the server's Shapley scores)
    refresh: int = 50  # steps between ModalShare's refreshes
    explore: float = 0.1  # share of its equal keep-ratio each modality keeps under ModalShare (see floor())
    value_bits: int = 16  # bits of a dense value (bf16): the budget's unit and the wire's dtype
    seed: int = 0  # the masks' and codecs' seeds derive from it
    # ModalShare's stand-in for a modality outside a coalition (actzip.split.coalitions.ABSENT): "zeros" or
    # "mean" (its features' batch mean)
    absent: str = "zeros"
    # what ModalShare scores (SCORE_ON): "received" (every refresh-th batch, after training on it) or "heldout"
    # (the batches a client sends with SplitClient.score, never trained on)
    score_on: str = "received"
    # with score_on="heldout", the keep-ratios a scoring batch is sent at (SCORE_AT): "current" (ModalShare's own),
    # "equal" (the same payload, every modality at the equal ratio, so that a modality ModalShare keeps low is not
    # scored low for being kept low) or "raised" (ModalShare's own, each at least the equal one, scaled to the
    # same payload)
    score_at: str = "current"
    # how dct and quant round their codes, both ways (actzip.split.uplink.Link.rounding): "stochastic" (unbiased
    # on what they send) or "nearest" (biased, less noise)
    rounding: str = "stochastic"
    # how dct codes its bands, both ways (actzip.split.uplink.Link.levels): "uniform" or "fitted"
    levels: str = "uniform"

    def __post_init__(self) -> None:
        self.sizes = tuple(int(s) for s in self.sizes)
        if not self.sizes or any(s < 1 for s in self.sizes):
            raise ConfigError(f"SplitConfig.sizes must be positive feature counts, one per modality, got {self.sizes}")
        if self.compressor not in COMPRESSORS:
            raise ConfigError(f"SplitConfig.compressor must be one of {COMPRESSORS}, got {self.compressor!r}")
        if self.rounding not in ROUNDINGS:
            raise ConfigError(f"SplitConfig.rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        check_levels("SplitConfig.levels", self.levels, self.compressor)
        if self.policy not in SPLIT_POLICIES:
            raise ConfigError(f"SplitConfig.policy must be one of {SPLIT_POLICIES}, got {self.policy!r}")
        if not self.compression >= 1:
            raise ConfigError(f"SplitConfig.compression must be >= 1, got {self.compression}")
        if self.absent not in ABSENT:
            raise ConfigError(f"SplitConfig.absent must be one of {ABSENT}, got {self.absent!r}")
        if self.score_on not in SCORE_ON:
            raise ConfigError(f"SplitConfig.score_on must be one of {SCORE_ON}, got {self.score_on!r}")
        if self.score_at not in SCORE_AT or (self.score_at != "current" and self.score_on != "heldout"):
            raise ConfigError(f"SplitConfig.score_at must be one of {SCORE_AT} ('equal' only with "
                              f"score_on='heldout'), got {self.score_at!r} with score_on={self.score_on!r}")
        if self.refresh < 1 or not 0 <= self.explore <= 1:
            raise ConfigError(f"SplitConfig: refresh must be >= 1 and explore in [0, 1], got {self.refresh}, "
                              f"{self.explore}")

    @property
    def budget(self) -> float:
        return sum(self.sizes) / self.compression

    def equal_ratios(self) -> list[float]:
        return list(equal_keep_ratios(self.sizes, self.budget).ratios)

    def floor(self, batch: int) -> list[float]:
        """ModalShare's least keep-ratio per modality: ``explore`` of the equal one, and at least the
        compressor's smallest sendable payload for a ``batch`` (a modality never sent is never scored again)."""
        return [max(self.explore * e, least_ratio(self.compressor, (batch, s), self.value_bits))
                for e, s in zip(self.equal_ratios(), self.sizes)]

    def scoring_ratios(self, current: Sequence[float]) -> list[float]:
        """The keep-ratios a scoring batch is sent and read at (``score_at``)."""
        return scoring_ratios(self.score_at, current, self.sizes, self.budget)

    def link(self, modality: int, ratio: float, client: int, step: int) -> Link:
        seed = ((self.seed * 1_000_003 + client) * 1_000_003 + step) * len(self.sizes) + modality
        return Link(self.compressor, ratio, seed % (1 << 62), self.value_bits, self.rounding, self.levels)


def scoring_ratios(score_at: str, current: Sequence[float], sizes: Sequence[float], budget: float) -> list[float]:
    """The keep-ratios a scoring batch goes at for ``score_at`` (:data:`SCORE_AT`), each payload ``budget``:
    ``current`` as they are, the equal ones, or (``raised``) each current ratio raised to at least the equal one
    and all scaled by the one factor that brings the payload back to the budget."""
    equal = list(equal_keep_ratios(sizes, budget).ratios)
    if score_at == "equal":
        return equal
    if score_at == "current":
        return list(current)
    raised = [max(c, e) for c, e in zip(current, equal)]  # each at least its equal share: payload >= budget
    scale = budget / sum(r * s for r, s in zip(raised, sizes))  # so scale <= 1 and every ratio stays <= 1
    return [r * scale for r in raised]


def _group(items: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in items.items() if k.startswith(prefix)}


class SplitClient:
    """One client: ``encoders`` (one module a modality, ``[batch, ...] -> [batch, size]``), its optimizer, the
    server's rank."""

    def __init__(self, encoders: Sequence[nn.Module], transport, server: int, config: SplitConfig,
                 optimizer: torch.optim.Optimizer) -> None:  # fmt: skip
        if len(encoders) != len(config.sizes):
            raise ConfigError(f"SplitClient: {len(encoders)} encoders for {len(config.sizes)} modalities")
        self.encoders = encoders if isinstance(encoders, nn.ModuleList) else nn.ModuleList(encoders)
        self.transport, self.server, self.config = transport, server, config
        self.optimizer = optimizer
        self.ratios = config.equal_ratios()
        self.step_count = 0
        self._pending: list | None = None
        transport.send_hello(server, asdict(config))

    def check(self) -> None:
        """Check the server's config (after it sent its own hello)."""
        self.transport.check_hello(self.server)

    def forward(self, xs: Sequence[torch.Tensor], labels: torch.Tensor, scoring: bool = False) -> int:
        """Encode and send one batch; the bytes sent. ``scoring``: a held-out batch for ModalShare's scores, not
        trained on (``score_on="heldout"``; :meth:`score`)."""
        if scoring and (self.config.policy != "modalshare" or self.config.score_on != "heldout"):
            raise ConfigError("SplitClient: a scoring batch needs policy='modalshare' and score_on='heldout', got "
                              f"policy={self.config.policy!r}, score_on={self.config.score_on!r}")
        if len(xs) != len(self.encoders):
            raise ConfigError(f"SplitClient.forward: {len(xs)} modality inputs for {len(self.encoders)} encoders")
        acts, sent, items = [], [], {}
        ratios = self.config.scoring_ratios(self.ratios) if scoring else self.ratios
        for i, (enc, x, r) in enumerate(zip(self.encoders, xs, ratios)):
            with torch.set_grad_enabled(torch.is_grad_enabled() and not scoring):
                a = enc(x)
            if a.dim() != 2 or a.shape[1] != self.config.sizes[i]:
                raise ConfigError(f"SplitClient: modality {i}'s encoder gave shape {tuple(a.shape)}; expected "
                                  f"[batch, {self.config.sizes[i]}]")
            link = self.config.link(i, r, self.transport.rank, self.step_count)
            packed = pack(a, link)
            items.update({f"m{i}/{k}": v for k, v in packed.items.items()})
            acts.append(a)
            sent.append((link, packed))
        items["labels"] = labels
        if scoring:
            items["scoring"] = torch.ones(1, dtype=torch.uint8)
        self._pending = [acts, sent, scoring]
        return self.transport.send(self.server, items, channel="fwd")

    def backward(self) -> None:
        """Receive the gradients of the batch sent last, update the encoders, take the next keep-ratios."""
        if self._pending is None:
            raise ConfigError("SplitClient.backward: no batch sent (call forward first)")
        acts, sent, scoring = self._pending
        self._pending = None
        back = self.transport.recv(self.server, channel="bwd").items
        if scoring:  # no gradients come back for a scoring batch: only the new keep-ratios
            self.ratios = [float(r) for r in back["ratios"]]
            self.step_count += 1
            return
        pairs = []
        for i, (a, (link, packed)) in enumerate(zip(acts, sent)):
            g = unpack_grad(_group(back, f"m{i}/"), link, packed, tuple(a.shape), a.dtype, a.device)
            if g is not None:
                pairs.append((a, g))
        self.optimizer.zero_grad()
        if pairs:
            torch.autograd.backward([a for a, _ in pairs], [g for _, g in pairs])
        self.optimizer.step()
        self.ratios = [float(r) for r in back["ratios"]]
        self.step_count += 1

    def step(self, xs: Sequence[torch.Tensor], labels: torch.Tensor) -> None:
        """One step against a server in another process."""
        self.forward(xs, labels)
        self.backward()

    def score(self, xs: Sequence[torch.Tensor], labels: torch.Tensor) -> None:
        """Send a held-out batch for ModalShare's scores (``score_on="heldout"``) against a server in another
        process, and take the keep-ratios it sets; nothing is trained on it."""
        self.forward(xs, labels, scoring=True)
        self.backward()


class SplitServer:
    """The server: ``model`` takes the modalities' views concatenated, ``loss_fn(output, labels)``; serves the
    clients of ranks ``clients`` in turn."""

    def __init__(self, model: nn.Module, transport, clients: Sequence[int], config: SplitConfig,
                 optimizer: torch.optim.Optimizer, loss_fn: Callable = F.cross_entropy) -> None:  # fmt: skip
        self.model, self.transport, self.clients, self.config = model, transport, list(clients), config
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self.ratios = {c: config.equal_ratios() for c in self.clients}
        self.steps = {c: 0 for c in self.clients}
        self.history: list[dict] = []  # ModalShare's refreshes: client, step, scores, ratios
        for c in self.clients:
            transport.send_hello(c, asdict(config))

    def check(self) -> None:
        """Check every client's config (after each sent its own hello)."""
        for c in self.clients:
            self.transport.check_hello(c)

    def _loss(self, views: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(torch.cat(views, dim=1)), labels)

    def _receive(self, client: int) -> tuple:
        msg = self.transport.recv(client, channel="fwd")
        labels = msg.items["labels"]
        step, cfg = self.steps[client], self.config
        scoring = "scoring" in msg.items
        ratios = cfg.scoring_ratios(self.ratios[client]) if scoring else self.ratios[client]
        links, views, kept = [], [], []
        for i, (size, r) in enumerate(zip(cfg.sizes, ratios)):
            link = cfg.link(i, r, client, step)
            v, k = unpack(_group(msg.items, f"m{i}/"), link, (labels.shape[0], size), torch.float32, labels.device)
            links.append(link)
            views.append(v.requires_grad_())
            kept.append(k)
        if scoring and (cfg.policy != "modalshare" or cfg.score_on != "heldout"):
            raise ConfigError(f"SplitServer: client {client} sent a scoring batch; this server scores none "
                              f"(policy={cfg.policy!r}, score_on={cfg.score_on!r})")
        return views, links, kept, labels, scoring

    def _reply(self, client: int, got: tuple) -> None:
        views, links, kept, labels, scoring = got
        out = {}
        if not scoring:
            for i, (v, link, k) in enumerate(zip(views, links, kept)):
                out.update({f"m{i}/{n}": t for n, t in pack_grad(v.grad, link, k).items()})
        self.steps[client] += 1
        cfg = self.config
        if scoring or (cfg.policy == "modalshare" and cfg.score_on == "received"
                       and self.steps[client] % cfg.refresh == 0):
            self._refresh(client, [v.detach() for v in views], labels)
        out["ratios"] = torch.tensor(self.ratios[client], dtype=torch.float64)
        self.transport.send(client, out, channel="bwd")

    def serve(self, client: int) -> float:
        """One batch of ``client``: receive, update, send the gradients back; the loss. A scoring batch is scored
        and not trained on (its loss is returned all the same)."""
        got = self._receive(client)
        if got[4]:
            with torch.no_grad():
                loss = self._loss([v.detach() for v in got[0]], got[3])
            self._reply(client, got)
            return float(loss)
        loss = self._loss(got[0], got[3])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self._reply(client, got)
        return float(loss.detach())

    def serve_parallel(self) -> float:
        """One batch of every client at once (the clients computed theirs in parallel): one forward and backward
        of the server on all of them together, one update, each client's gradients sent back; the mean loss."""
        got = [self._receive(c) for c in self.clients]
        train = [g for g in got if not g[4]]  # scoring batches are scored, not trained on
        if train:
            views = [torch.cat([g[0][i] for g in train]) for i in range(len(self.config.sizes))]
            loss = self._loss(views, torch.cat([g[3] for g in train]))
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        else:
            with torch.no_grad():
                loss = torch.stack([self._loss([v.detach() for v in g[0]], g[3]) for g in got]).mean()
        for c, g in zip(self.clients, got):
            self._reply(c, g)
        return float(loss.detach())

    def _refresh(self, client: int, views: list[torch.Tensor], labels: torch.Tensor) -> None:
        cfg = self.config
        scores = shapley(coalition_values(self.model, views, labels, self.loss_fn, cfg.absent), len(views))
        self.ratios[client] = list(keep_ratios(scores.values, cfg.sizes, cfg.budget,
                                               floor=cfg.floor(labels.shape[0])).ratios)
        self.history.append({"client": client, "step": self.steps[client], "scores": list(scores.values),
                             "ratios": list(self.ratios[client])})

    def step(self, parallel: bool = False) -> list[float]:
        """One batch of every client (clients in other processes): in turn, one update each, or ``parallel``:
        all batches in one update (:meth:`serve_parallel`); the losses."""
        for c in self.clients:  # every client's batch received ahead (gloo), so one's upload need not wait on
            self.transport.expect(c, 1)  # the server's work on another's
        if parallel:
            return [self.serve_parallel()]
        return [self.serve(c) for c in self.clients]

    def finish(self) -> None:
        """Wait until the last gradients have left (call it before the process ends)."""
        self.transport.flush()


def fed_average(modules: Sequence[nn.Module] | nn.Module, group=None) -> int:
    """SplitFed's averaging of the clients' encoders: every parameter replaced by its mean over the clients.

    Given a list of modules (every client in one process), averages them in place; given one module, averages it
    with the same module of every rank of the ``torch.distributed`` process ``group`` (each client process calls
    it). Returns the bytes one client sends for it (its parameters, once)."""
    if isinstance(modules, nn.Module):
        import torch.distributed as dist

        params = list(modules.parameters())
        world = dist.get_world_size(group)
        with torch.no_grad():
            for p in params:
                dist.all_reduce(p.data, group=group)
                p.data.div_(world)
        return sum(p.numel() * p.element_size() for p in params)
    mods = list(modules)
    if not mods:
        raise ConfigError("fed_average: no modules")
    groups = list(zip(*(list(m.parameters()) for m in mods)))
    with torch.no_grad():
        for ps in groups:
            mean = torch.stack([p.data for p in ps]).mean(0)
            for p in ps:
                p.data.copy_(mean)
    return sum(p.numel() * p.element_size() for p in mods[0].parameters())
