"""What ``actzip bench decentralized`` runs: the methods (fixed), the model, the tasks and the links."""

from __future__ import annotations

from dataclasses import dataclass

from actzip.errors import ConfigError
from actzip.wire.anchor import AnchorConfig, SpectralConfig
from actzip.wire.dp import DPConfig, OuterConfig
from actzip.wire.link import LinkSpec
from actzip.wire.mesh import TwoCircuitConfig
from actzip_bench.models.gpt import GPTConfig

__all__ = ["BOUNDARY", "MASK", "METHODS", "method_boundary", "TOPK_MASK", "TASKS", "TRIVIAL", "DecentralizedBenchConfig", "method_codecs", "method_circuits"]

MASK_KEEP = 0.125  # the masks' default keep (DecentralizedBenchConfig.mask_keep sets another)
MASK = f"mask:keep={MASK_KEEP},mode=random+quant:bits=8"  # the fast circuit's boundary mask, both ways
TOPK_MASK = f"mask:keep={MASK_KEEP},mode=topk+quant:bits=8"  # the largest eighth, positions as a bitmask
# half the kept elements the largest, half drawn from the rest and rescaled: unbiased, less variance than random
SPLIT_MASK = f"mask:keep={MASK_KEEP},mode=topk-random+quant:bits=8"
# method -> (forward codec, backward codec, data-parallel sync, anchors + correction)
METHODS = {
    "dense": ("none", "none", "allreduce", None),  # float32 everywhere: the loss reference
    "bf16": ("cast:dtype=bfloat16", "cast:dtype=bfloat16", "bf16", None),
    "int8": ("quant:bits=8", "quant:bits=8", "bf16", None),
    "int4": ("quant:bits=4", "quant:bits=4", "bf16", None),
    "delta": ("delta:bits=4", "quant:bits=4", "bf16", None),  # AQ-SGD: 4-bit change against a per-sample cache
    "powersgd": ("cast:dtype=bfloat16", "cast:dtype=bfloat16", "powersgd", None),
    "mask": (MASK, MASK, "bf16", None),  # pipeline masking alone
    "mask+topk": (MASK, MASK, "topk", None),  # the fast circuit: masking + top-k data-parallel sync
    "mask+diloco": (MASK, MASK, "diloco", None),
    "two-circuit": (MASK, MASK, "topk", "shrinkage"),  # + anchors and the spectral correction
    "two-circuit-projection": (MASK, MASK, "topk", "projection"),
    # added after the first results (the random mask's loss): the same circuits with a top-k mask
    "topk-mask": (TOPK_MASK, TOPK_MASK, "bf16", None),
    "topk-mask+topk": (TOPK_MASK, TOPK_MASK, "topk", None),
    "two-circuit-topk-mask": (TOPK_MASK, TOPK_MASK, "topk", "shrinkage"),
    # added after those: the mask on the gradients only (the forward in 8 bits), so that the model's function is
    # what it computes unmasked and only its gradients are noisier
    "mask-backward": ("quant:bits=8", MASK, "bf16", None),
    # and after the keep sweep: the gradient-only mask with the largest half kept exactly
    "split-mask-backward": ("quant:bits=8", SPLIT_MASK, "bf16", None),
    # and after both: the gradient mask under a cheaper forward, 2-bit or AQ-SGD's delta in 4 or 2 bits
    "int2-mask-backward": ("quant:bits=2", MASK, "bf16", None),
    "delta-mask-backward": ("delta:bits=4", MASK, "bf16", None),
    "delta2-mask-backward": ("delta:bits=2", MASK, "bf16", None),
    # and with the wiener correction (the noise of each matrix's gradient measured on every anchor's batch): the
    # gradient-only mask's circuit with anchors under each correction, and the two-circuit one with it
    "mask-backward-shrinkage": ("quant:bits=8", MASK, "bf16", "shrinkage"),
    "mask-backward-wiener": ("quant:bits=8", MASK, "bf16", "wiener"),
    "two-circuit-wiener": (MASK, MASK, "topk", "wiener"),
    # and after the held-out loss of the trained models (codecs off) joined the records: the correction that adds
    # the anchors' measured bias (the masked function's gradient against the model's own), on both circuits
    "two-circuit-debias": (MASK, MASK, "topk", "debias"),
    "mask-backward-debias": ("quant:bits=8", MASK, "bf16", "debias"),
    # and after all of those: the principal-subspace boundary (the sender's top principal directions, as many
    # values a token as the masks keep), its codes and their gradients in 8 bits
    "pca": ("quant:bits=8", "quant:bits=8", "bf16", None),
    "pca+topk": ("quant:bits=8", "quant:bits=8", "topk", None),
    "pca+diloco": ("quant:bits=8", "quant:bits=8", "diloco", None),
    # and after the pca runs: its boundary with torch's PowerSGD (rank 4, error feedback) on the replicas
    "pca+powersgd": ("quant:bits=8", "quant:bits=8", "powersgd", None),
    # and after those: DiLoCo's schedule with the outer step a plain average of the replicas (outer rate 1, no
    # momentum: local SGD), since in a short adaptation the outer momentum multiplies a few outer steps
    "pca+average": ("quant:bits=8", "quant:bits=8", "average", None),
    # and after those: every step's gradient in 4-bit codes with error feedback (an all-gather), beside the
    # trivial pipeline wire with the same data-parallel sync (a baseline a user could assemble)
    "pca+quant": ("quant:bits=8", "quant:bits=8", "quant", None),
    "int4+quant": ("quant:bits=4", "quant:bits=4", "quant", None),
}
BOUNDARY = {m: "pca" for m in ("pca", "pca+topk", "pca+diloco", "pca+powersgd", "pca+average", "pca+quant")}  # method -> boundary kind (others: dense)
TRIVIAL = ("bf16", "int8", "int4", "delta", "int4+quant")  # the baselines a user would otherwise pick
TASKS = {"domain": "prose", "continual": "code_late"}  # task -> corpus trained on after pretraining on code_early


@dataclass
class DecentralizedBenchConfig:
    """One run of the benchmark (see docs/wire.md)."""

    model: str = "tiny"  # GPT size (GPTConfig.of_size)
    n_layer: int = 2  # blocks
    n_embd: int = 64  # width
    block_size: int = 64  # sequence length
    stages: int = 2  # pipeline stages (2-4)
    replicas: int = 2  # data-parallel replicas of each stage
    batch_size: int = 16  # sequences per replica per step
    microbatches: int = 4  # per step
    schedule: str = "1f1b"  # the pipeline's microbatch order ("gpipe" or "1f1b")
    pretrain_steps: int = 300  # dense steps on code_early before the tasks
    steps: int = 150  # steps of each task
    lr: float = 1e-3  # AdamW learning rate of the tasks (pretraining: the same)
    methods: tuple[str, ...] = tuple(METHODS)
    tasks: tuple[str, ...] = tuple(TASKS)
    seeds: tuple[int, ...] = (0, 1, 2)
    links: tuple[tuple[float, float], ...] = ((200.0, 50.0), (80.0, 50.0))  # (Mbps, one-way ms) of every link
    topk_keep: float = 0.01  # top-k data-parallel sync: fraction sent
    mask_keep: float = 0.125  # fraction of the elements the boundary masks keep (the random and the top-k one)
    diloco_steps: int = 10  # DiLoCo outer step every this many steps (4-bit pseudo-gradient)
    anchor_every: int = 8  # anchor launches every this many steps
    anchor_delay: int = 2  # steps after launch at which an anchor is due
    spectral_rank: int = 4  # anchor subspace rank per matrix
    anchor_codec: str = "none"  # the anchor passes' wire codec both ways (AnchorConfig.codec; "none": float32)
    spectral_decay: float | None = None  # weight of the correction's old averages (SpectralConfig.decay; None: its own)
    corpus_bytes: int = 1_000_000  # bytes of each domain's corpus
    dataset_windows: int = 1024  # fixed windows per replica (the delta codec's per-sample cache needs repeats)
    eval_batches: int = 4  # validation batches of batch_size after each task
    smooth: float = 0.1  # final loss: mean training loss of the last smooth * steps steps
    # time to target: a method other than dense that has not reached dense's final loss after `steps` trains on
    # until its smoothed loss does, up to until_target * steps steps in all (1: never past `steps`); its final
    # loss is still the one at `steps` (equal tokens)
    until_target: float = 1.0
    timeout_s: float = 120.0  # longest wait for a peer before every rank stops with an error
    # (Mbps, one-way ms): every rank in a network namespace of its own, each one's uplink shaped to this link
    # (root; tbf with the latency added by the senders where the kernel has no netem), and every run's step
    # times measured on it beside the link model's ("shaped ..." in the links); None: all ranks on this host
    shaped_link: tuple[float, float] | None = None
    # with shaped_link: dense (the loss reference, float32 both axes, the slowest on a slow link) trains with every
    # rank on this host first, the other methods then on the shaped link; a run's values do not depend on its
    # link, only its times, and dense's measured time on the shaped link is then the model's (marked so)
    dense_off_link: bool = False
    # keep replica 0's measured schedule in each row ("replay": its stages' actions, data-parallel bytes and
    # host work), so the link model can replay the run again later (about a megabyte per 50 rows)
    keep_replay: bool = False
    # ``actzip bench link``'s all-gathers on the machine that ran (bytes a rank, measured seconds) at exchange_mbps:
    # each modelled link of that rate is replayed again with its syncs priced at them ("... calibrated" links)
    exchange: tuple[tuple[int, float], ...] = ()
    exchange_mbps: float | None = None

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"bench decentralized: unknown methods {unknown}; known: {list(METHODS)}")
        if "dense" not in self.methods:
            raise ConfigError("bench decentralized: the methods must include dense (the loss reference)")
        bad = [t for t in self.tasks if t not in TASKS]
        if bad:
            raise ConfigError(f"bench decentralized: unknown tasks {bad}; known: {list(TASKS)}")
        if not 2 <= self.stages <= self.n_layer:
            raise ConfigError(f"bench decentralized: stages must be in [2, n_layer={self.n_layer}], got {self.stages}")
        if self.replicas < 1:
            raise ConfigError(f"bench decentralized: replicas must be >= 1, got {self.replicas}")
        if isinstance(self.mask_keep, bool) or not 0.0 < self.mask_keep <= 1.0:
            raise ConfigError(f"bench decentralized: mask_keep must be a fraction in (0, 1], got {self.mask_keep!r}")
        if isinstance(self.until_target, bool) or not isinstance(self.until_target, (int, float)) \
                or not self.until_target >= 1.0:
            raise ConfigError(f"bench decentralized: until_target must be a number >= 1 (a multiple of steps), got "
                              f"{self.until_target!r}")
        if self.shaped_link is not None:
            link = tuple(self.shaped_link)
            if len(link) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in link) \
                    or not link[0] > 0 or not link[1] >= 0:
                raise ConfigError(f"bench decentralized: shaped_link must be (Mbps > 0, one-way ms >= 0), got "
                                  f"{self.shaped_link!r}")
            self.shaped_link = (float(link[0]), float(link[1]))
            if self.shaped_link not in [tuple(map(float, x)) for x in self.links]:  # the model of the same link
                self.links = (*self.links, self.shaped_link)
        if self.dense_off_link and self.shaped_link is None:
            raise ConfigError("bench decentralized: dense_off_link takes a shaped_link (it runs dense off it)")
        self.exchange = tuple((int(n), float(t)) for n, t in self.exchange)
        if bool(self.exchange) != (self.exchange_mbps is not None):
            raise ConfigError("bench decentralized: exchange and exchange_mbps come together (a bench link record's "
                              f"all-gathers and its rate), got {len(self.exchange)} sizes at {self.exchange_mbps!r}")
        if self.exchange:
            LinkSpec(self.exchange_mbps, exchange=self.exchange)  # its own check of the table
            if self.exchange_mbps not in [float(bw) for bw, _ in self.links]:
                raise ConfigError(f"bench decentralized: the link calibration was measured at {self.exchange_mbps:g}"
                                  f" Mbit/s; no modelled link has that rate ({[bw for bw, _ in self.links]})")
        if self.batch_size % self.microbatches:
            raise ConfigError(f"bench decentralized: batch_size {self.batch_size} is not a multiple of microbatches "
                              f"{self.microbatches}")

    @classmethod
    def quick(cls) -> DecentralizedBenchConfig:
        """A run for a 2-core CPU in a few minutes: one seed, both tasks, every method, a 2-block model."""
        return cls(block_size=32, batch_size=8, microbatches=2, pretrain_steps=60, steps=40,
                   seeds=(0,), corpus_bytes=300_000, dataset_windows=256, eval_batches=2, lr=2e-3)

    def modelled_links(self) -> dict[str, LinkSpec]:
        """The links the model replays each run on, by name: every link, then those of the calibration's rate
        again with the syncs at the measured exchange times."""
        links = {f"{bw:g}mbps-{lat:g}ms": LinkSpec(bandwidth_mbps=bw, latency_ms=lat) for bw, lat in self.links}
        for bw, lat in self.links:
            if self.exchange and float(bw) == self.exchange_mbps:
                links[f"{bw:g}mbps-{lat:g}ms calibrated"] = LinkSpec(bw, lat, exchange=self.exchange)
        return links

    @property
    def link_names(self) -> list[str]:
        """The links' names in records: each modelled link, then the shaped one's measured times."""
        names = list(self.modelled_links())
        return names + ([f"shaped {self.shaped_link[0]:g}mbps-{self.shaped_link[1]:g}ms"] if self.shaped_link else [])

    @property
    def window(self) -> int:
        """Steps the final loss and the time to target average over."""
        return max(1, round(self.smooth * self.steps))

    def gpt_config(self) -> GPTConfig:
        return GPTConfig.of_size(self.model, n_layer=self.n_layer, n_embd=self.n_embd, block_size=self.block_size,
                                 n_head=max(1, self.n_embd // 32))


def method_codecs(method: str, cfg: DecentralizedBenchConfig | None = None) -> tuple[str, str]:
    """The forward and backward codec specs of ``method``'s pipeline boundaries (masks at ``cfg.mask_keep``)."""
    fwd, bwd, _, _ = METHODS[method]
    keep = MASK_KEEP if cfg is None else cfg.mask_keep
    at = lambda spec: spec.replace(f"keep={MASK_KEEP}", f"keep={keep:g}")  # noqa: E731
    return at(fwd), at(bwd)


def method_boundary(method: str, cfg: DecentralizedBenchConfig) -> str:
    """The boundary spec of ``method``'s stages: ``dense``, or ``pca`` keeping ``cfg.mask_keep`` of the width."""
    kind = BOUNDARY.get(method, "dense")
    return kind if kind == "dense" else f"{kind}:{1 / cfg.mask_keep:g}"


def method_circuits(method: str, cfg: DecentralizedBenchConfig) -> TwoCircuitConfig:
    """``method``'s data-parallel sync and anchor circuit."""
    _, _, dp, spectral = METHODS[method]
    if dp == "diloco":
        sync = OuterConfig(local_steps=cfg.diloco_steps, codec="quant:bits=4")
    elif dp == "average":
        sync = OuterConfig(local_steps=cfg.diloco_steps, outer_lr=1.0, momentum=0.0, codec="quant:bits=4")
    elif dp == "topk":
        sync = DPConfig(method="topk", keep=cfg.topk_keep)
    elif dp == "powersgd":
        sync = DPConfig(method="powersgd", rank=4, start_iter=10)
    elif dp == "quant":
        sync = DPConfig(method="quant", codec="quant:bits=4")
    else:
        sync = DPConfig(method=dp)
    anchor = None if spectral is None else AnchorConfig(every=cfg.anchor_every, delay=cfg.anchor_delay,
                                                        codec=cfg.anchor_codec)
    correction = None if spectral is None else SpectralConfig(mode=spectral, rank=cfg.spectral_rank,
                                                                   decay=cfg.spectral_decay)
    return TwoCircuitConfig(dp=sync, anchor=anchor, spectral=correction, check_every=25)
