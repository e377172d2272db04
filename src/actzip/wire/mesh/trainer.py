"""Two-circuit training of S stages x R replicas: the fast circuit (a pipeline with masked or compressed
boundaries, its stages' gradients synchronized across replicas with a compressed method) and, optionally, the
slow anchor circuit feeding the spectral correction.

Each step on each rank: launch an anchor (every K steps) and hand over those due; run the pipeline's
forwards and backwards; correct the stage's gradients with the anchors' subspace; average them over the
stage's replicas (``DPConfig``: every step, on one flat bucket; ``"factored"``: sketched layers' left factors);
step the optimizer; with an ``OuterConfig``, every H steps the outer sync instead of a per-step one. Every
``check_every`` steps (and after every outer sync) the replicas compare parameter fingerprints and raise on every
rank if they differ. Bytes are metered per axis and per step.
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from actzip.errors import ConfigError
from actzip.wire.anchor import AnchorConfig, SpectralConfig, SpectralCorrection
from actzip.wire.dp import DPConfig, DPMeter, GradSync, OuterConfig, OuterSync, sync_factored_grads
from actzip.wire.dp.agree import check_same_config
from actzip.wire.link import Action, LinkSpec
from actzip.wire.replay import dp_sync_seconds
from actzip.wire.mesh.anchors import PipelineAnchors
from actzip.wire.mesh.fingerprint import check_replicas_agree
from actzip.wire.mesh.groups import Mesh
from actzip.wire.pipeline import Pipeline, PipelineConfig

__all__ = ["TwoCircuit", "TwoCircuitConfig"]


@dataclass
class TwoCircuitConfig:
    """How the two circuits run, besides the pipeline's own :class:`PipelineConfig`."""

    # data-parallel sync across each stage's replicas: a DPConfig (every step), an OuterConfig (every H steps),
    # "factored" (sketched layers' factors every step), or None (replicas train alone: no sync, no check)
    dp: DPConfig | OuterConfig | str | None = dataclasses.field(default_factory=DPConfig)
    anchor: AnchorConfig | None = None  # the anchor circuit's cadence and delay; None: no anchor circuit
    spectral: SpectralConfig | None = None  # the correction of the masked gradients; None: mode "off"
    check_every: int = 50  # steps between two parameter-fingerprint checks across replicas (0: never)

    def __post_init__(self) -> None:
        if not (self.dp is None or self.dp == "factored" or isinstance(self.dp, (DPConfig, OuterConfig))):
            raise ConfigError(f"TwoCircuitConfig.dp must be a DPConfig, an OuterConfig, 'factored' or None, got "
                              f"{self.dp!r}")
        if self.anchor is not None and not isinstance(self.anchor, AnchorConfig):
            raise ConfigError(f"TwoCircuitConfig.anchor must be an AnchorConfig or None, got {self.anchor!r}")
        if self.spectral is not None and not isinstance(self.spectral, SpectralConfig):
            raise ConfigError(f"TwoCircuitConfig.spectral must be a SpectralConfig or None, got {self.spectral!r}")
        if self.spectral is not None and self.spectral.mode != "off" and self.anchor is None:
            raise ConfigError(f"TwoCircuitConfig.spectral mode {self.spectral.mode!r} needs anchors: give "
                              "TwoCircuitConfig.anchor an AnchorConfig")
        c = self.check_every
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ConfigError(f"TwoCircuitConfig.check_every must be an int >= 0, got {c!r}")


class TwoCircuit:
    """This rank's stage in the two circuits (see the module docstring).

    ``stages`` is every stage's module (this rank's is taken) or this rank's alone, as for :class:`Pipeline`.
    """

    def __init__(self, stages, mesh: Mesh, pipeline: PipelineConfig, config: TwoCircuitConfig | None = None,
                 *, device: torch.device | str | None = None, loss_fn: Callable | None = None) -> None:
        if not isinstance(mesh, Mesh):
            raise ConfigError(f"TwoCircuit: mesh must be a Mesh, got {type(mesh).__name__}")
        self.mesh, self.cfg = mesh, config if config is not None else TwoCircuitConfig()
        module = stages[mesh.stage] if isinstance(stages, (list, tuple)) else stages
        self.module = module
        dp = self.cfg.dp
        if dp is not None:  # before any pipeline traffic: a refused rank leaves no message half-sent behind it
            check_same_config("TwoCircuit", {
                "dp": dataclasses.asdict(dp) if dataclasses.is_dataclass(dp) else dp, "kind": type(dp).__name__,
                "parameters": [[n, list(p.shape)] for n, p in module.named_parameters() if p.requires_grad]},
                mesh.dp_group)
        self.pipe = Pipeline(module, pipeline, device=device, loss_fn=loss_fn, distributed=True,
                             group=mesh.pipe_group, down_group=mesh.pipe_down_group, before_update=self._before_update)
        self.worker = self.pipe.workers[0]
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.grad_sync = GradSync(module, dp, mesh.dp_group) if isinstance(dp, DPConfig) else None
        self.outer = OuterSync(module, dp, mesh.dp_group) if isinstance(dp, OuterConfig) else None
        self.factored_meter = DPMeter() if dp == "factored" else None
        if self.grad_sync is not None or self.factored_meter is not None:
            self._broadcast_parameters()  # per-step sync keeps replicas equal only if they start equal
        spectral = self.cfg.spectral or SpectralConfig(mode="off")
        self.correction = SpectralCorrection(self.worker.optimizer, spectral)
        self.anchors = None if self.cfg.anchor is None else PipelineAnchors(
            module, pipeline, self.cfg.anchor, self.correction, mesh.anchor_group, mesh.anchor_down_group, loss_fn)
        self.step = 0
        self._anchored = False  # an anchor was launched at this step
        self.dp_bytes: list[dict[str, int]] = []  # per step: this rank's data-parallel payload per collective
        self.dp_seconds: list[float] = []  # per step: time spent in the data-parallel sync (measured)
        # per step: the part of that time outside the collectives: the host's own work (the correction, encoding,
        # decoding, staging copies), which the link model adds to its wire time
        self.dp_host_seconds: list[float] = []
        self.step_walls: list[tuple[float, float]] = []  # per step: time.monotonic() at its start and end
        # a software link latency (tbf-shaped namespaces): the pipeline's sends are held that long by its backend,
        # the data-parallel collectives hold as many one-way latencies as their hops (see dp_sync_seconds)
        self._dp_latency = LinkSpec(latency_ms=1e3 * getattr(self.pipe.transport.backend, "send_delay_s", 0.0))
        self._pending_dp: dict[str, int] = {}
        self._dp_time = 0.0  # this step's sync so far (seconds)
        self._held = 0.0  # of it, the first hop's latency held before the collectives (a software-latency link)

    @torch.no_grad()
    def _broadcast_parameters(self) -> None:
        src = dist.get_global_rank(self.mesh.dp_group, 0)
        stage = dist.get_backend(self.mesh.dp_group) == "gloo"  # gloo: through a CPU copy (ranks sharing a GPU)
        for p in self.module.parameters():
            t = p.data.cpu() if stage and p.is_cuda else p.data
            dist.broadcast(t, src=src, group=self.mesh.dp_group)
            if t is not p.data:
                p.data.copy_(t)

    def _meter(self) -> DPMeter | None:
        if self.grad_sync is not None:
            return self.grad_sync.meter
        if self.outer is not None:
            return self.outer.meter
        return self.factored_meter

    def _hold_first_hop(self) -> float:
        """On a software-latency link, hold a sync's first one-way latency before its collectives start, as the
        pipeline's delay line holds a message before it enters the shaped uplink: a real link sends the
        stage's last messages first and the sync's bytes after them, not the other way round. The seconds held."""
        hold = self._dp_latency.latency_ms / 1e3
        if hold > 0:
            time.sleep(hold)
        return hold

    def _before_update(self, worker) -> None:
        t0 = time.perf_counter()
        if self._anchored:  # this step's own gradient, to pair with its anchor's (the wiener correction)
            self.correction.stash_fast(self.step)
        self.correction.correct()
        held = 0.0
        if self.grad_sync is not None:
            held = self._hold_first_hop()
            self.grad_sync.sync()
        elif self.factored_meter is not None:
            held = self._hold_first_hop()
            sync_factored_grads(self.module, self.mesh.dp_group, self.factored_meter)
        self._dp_time = time.perf_counter() - t0
        self._held = held

    def train_step(self, x, y, ids=None) -> float | None:
        """One step of both circuits on inputs ``x`` and targets ``y`` (``ids``: sample ids, for a per-sample
        codec cache); the mean loss on the last stage (``None`` elsewhere)."""
        start = time.monotonic()
        meter = self._meter()
        before = dict(meter.by_collective) if meter is not None else {}
        waited = meter.wait_s if meter is not None else 0.0
        self._dp_time = self._held = 0.0
        self._anchored = False
        if self.anchors is not None:
            self._anchored = self.anchors.maybe_launch(self.step, x, y)
            self.anchors.deliver(self.step)
        loss = self.pipe.train_step(x, y, ids)
        synced = False
        if self.outer is not None:
            t0 = time.perf_counter()
            if self.outer.due:
                self._held += self._hold_first_hop()
            synced = self.outer.step()
            self._dp_time += time.perf_counter() - t0
        now = dict(meter.by_collective) if meter is not None else {}
        self.dp_bytes.append({k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)})
        self.dp_host_seconds.append(max(0.0, self._dp_time - self._held
                                        - ((meter.wait_s - waited) if meter is not None else 0.0)))
        if self._dp_latency.latency_ms > 0 and self.dp_bytes[-1]:
            # the collectives' other one-way latencies (their hops), after them
            hold = max(0.0, dp_sync_seconds(self.dp_bytes[-1], self.mesh.replicas, self._dp_latency) - self._held)
            time.sleep(hold)
            self._dp_time += hold
        self.dp_seconds.append(self._dp_time)
        self.step += 1
        self.step_walls.append((start, time.monotonic()))
        every = self.cfg.check_every
        if self.cfg.dp is not None and (synced or (every and self.outer is None and self.step % every == 0)):
            check_replicas_agree(self.params, self.mesh.dp_group, f"stage {self.mesh.stage}'s parameters",
                                 self.step)
        return loss

    @property
    def losses(self) -> list[float]:
        return self.pipe.losses

    def record(self) -> dict:
        """This rank's record: its stage's actions, pipeline meter, per-step data-parallel bytes and times,
        losses (last stage) and anchor counts."""
        return {"rank": self.mesh.rank, "stage": self.mesh.stage, "replica": self.mesh.replica,
                "actions": [a.as_tuple() for a in self.pipe.actions], "pp_meter": self.pipe.meters()[0].as_dict(),
                "dp_bytes": self.dp_bytes, "dp_seconds": self.dp_seconds, "dp_host_seconds": self.dp_host_seconds,
                # seconds inside the data-parallel collectives in all (the meter's wait_s)
                "dp_wait_s": self._meter().wait_s if self._meter() is not None else 0.0,
                "losses": list(self.losses),
                "step_walls": list(self.step_walls),
                "anchors": self.anchors.counts() if self.anchors is not None else None,
                # the anchor passes' own traffic (AnchorConfig.codec, over the anchor groups): the same links
                "anchor_meter": self.anchors.pipe.meters()[0].as_dict() if self.anchors is not None else None,
                "uncorrected_steps": self.correction.uncorrected_steps,
                "spectral_state_bytes": self.correction.state_bytes()}

    def gather(self) -> list[dict] | None:
        """Every rank's :meth:`record`, in global rank order, on global rank 0 (``None`` elsewhere)."""
        got = [None] * dist.get_world_size() if self.mesh.rank == 0 else None
        dist.gather_object(self.record(), got, dst=0)
        return got

    def close(self) -> None:
        """Finish the anchors in flight and the pipeline's sends."""
        if self.anchors is not None:
            self.anchors.close()
        self.pipe.transport.flush()

    @staticmethod
    def actions_of(records: list[dict], replica: int = 0) -> list[Action]:
        """The recorded actions of ``replica``'s stages (for :func:`~actzip.wire.link.simulate`)."""
        return [Action.from_tuple(a) for r in records if r["replica"] == replica for a in r["actions"]]
