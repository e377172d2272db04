"""What ``actzip bench wire`` trains: its config, the grammar of its entries, the batches every run sees, and
the pipeline stages and settings of an entry (see :mod:`actzip_bench.wire`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from actzip.core.lr_schedule import check_lr_schedule
from actzip.core.optim import OPTIMIZERS
from actzip.errors import ActzipError, ConfigError
from actzip.wire import PipelineConfig, Stage, WireCodec
from actzip.wire.boundaries import format_boundary, parse_boundary_options
from actzip_bench.data import Corpus
from actzip_bench.models import GPTConfig
from actzip_bench.models.gpt_stages import build_gpt_stages, gpt_boundary_config

__all__ = ["BYTE_CODECS", "QUICK", "Batches", "WireBenchConfig", "build_stages_for", "codec_specs", "entry_lr",
           "parse_entry", "pipeline_config"]

BYTE_CODECS = ("bf16", "quant", "mask", "topk", "delta")  # dense boundary, a byte codec on its tensors
# --quick: under 3 minutes on a 2-core CPU (about 8 to 15 s per entry).
QUICK = {"model": "tiny", "n_embd": 128, "n_head": 4, "n_layer": 2, "block_size": 64, "batch_size": 32,
         "steps": 50, "target_steps": 1.4, "dataset_windows": 768, "eval_batches": 2,
         "compressors": ("dense", "quant:8", "mask:8", "topk:8", "delta:8", "subspace:100", "bottleneck:100",
                         "stiefel:16", "stiefel-rvq:100")}


@dataclass
class WireBenchConfig:
    """What ``actzip bench wire`` trains and measures."""

    model: str = "small"  # model size (GPTConfig.of_size)
    n_layer: int | None = None  # override the preset's blocks (None: keep)
    n_embd: int | None = None  # override the preset's width
    n_head: int | None = None  # override the preset's heads
    block_size: int | None = None  # sequence length (None: the preset's)
    stages: int = 2  # pipeline stages (2-4)
    compressors: tuple[str, ...] = ("dense", "quant:8", "mask:8", "topk:8", "delta:8", "subspace:100",
                                    "bottleneck:100", "stiefel:16", "stiefel-rvq:100")
    # backward codec spec for the byte codecs and the stage compressors' code gradients (None: follow the
    # forward one; dense, the loss reference, stays raw)
    bwd_codec: str | None = None
    # byte codec on the code of the stage compressors, both directions unless bwd_codec says otherwise
    # (e.g. "quant:bits=8": stiefel:4 with 8-bit codes is about 16x); None: raw codes
    stage_codec: str | None = None
    bandwidths: tuple[float, ...] = (80.0, 200.0)  # Mbps of the simulated links
    latency_ms: float = 50.0  # one-way latency of every link
    schedule: str = "gpipe"  # "gpipe" or "1f1b"
    microbatches: int = 4  # per step
    batch_size: int = 16  # sequences per step
    steps: int = 600  # optimizer steps per run
    lr: float = 1e-3  # learning rate
    # "adamw", or "muon": Muon on the hidden matrices (boundary projections included), AdamW on the rest, at the
    # same rate (actzip.core.optim); the Subspace Networks reference and ResBM train with Muon
    optimizer: str = "adamw"
    # "constant", or "cosine" (5% warm-up, cosine decay to lr / 10 over `steps`; a run training on past them
    # keeps lr / 10)
    lr_schedule: str = "constant"
    seed: int = 0  # weights, batches and codec noise
    # fixed training set of this many windows (delta needs repeats); None (or 0): fresh windows every step
    dataset_windows: int | None = 4096
    corpus_bytes: int = 4_000_000  # bytes of the embedded corpus read
    eval_batches: int = 4  # validation batches, after `steps` steps (equal tokens)
    smooth: float = 0.1  # final loss = mean training loss of the last smooth * steps steps
    target_steps: float = 2.0  # a run short of dense's final loss at `steps` trains on, up to this many times steps
    # the loss to reach (and to measure gaps against) instead of the best dense run's: e.g. a dense run's final
    # loss from an earlier bench, so that long runs can be split over several invocations
    target_loss: float | None = None
    threads: int | None = 1  # CPU intra-op threads while training (None: leave torch's setting)
    mode: str = "simulated"  # "simulated": stages in one process; "processes": one per stage (torchrun);
    #                          "netns": 2 processes through a real netem-shaped link per bandwidth (root)
    timeout_s: float = 120.0  # longest wait for a peer's message (processes, netns)
    # boundary config overrides for every stage-compressor entry ("anchor_rank=256,lr=1e-4"; dense and the byte
    # codecs ignore them); a field some such entry lacks is an error
    boundary: str = ""
    # float32 matmul precision while training: "highest" (true float32), "high" (TF32 tensor cores on GPUs that
    # have them: several times faster, the usual training setting) or "medium"
    matmul_precision: str = "highest"
    # one learning-rate factor per stage (each stage's optimizer runs at lr * factor); None: 1 for every stage
    stage_lr_scale: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stages, int) or not 2 <= self.stages <= 8:
            raise ConfigError(f"WireBenchConfig.stages must be an int in [2, 8], got {self.stages!r}")
        if not self.compressors:
            raise ConfigError("WireBenchConfig.compressors is empty")
        for entry in self.compressors:
            parse_entry(entry)
        if self.dataset_windows == 0:  # the command line's way to say None
            self.dataset_windows = None
        if len(set(self.compressors)) < len(self.compressors):
            raise ConfigError(f"WireBenchConfig.compressors repeats an entry: {list(self.compressors)}")
        if self.mode not in ("simulated", "processes", "netns"):
            raise ConfigError(f"WireBenchConfig.mode must be simulated, processes or netns, got {self.mode!r}")
        if self.mode == "netns" and self.stages != 2:
            raise ConfigError("WireBenchConfig.mode='netns' joins 2 namespaces with one veth pair: use stages=2")
        if self.target_loss is not None and not (isinstance(self.target_loss, (int, float)) and self.target_loss > 0):
            raise ConfigError(f"WireBenchConfig.target_loss must be a positive number, got {self.target_loss!r}")
        if not 0 < self.smooth <= 1:
            raise ConfigError(f"WireBenchConfig.smooth must be in (0, 1], got {self.smooth!r}")
        check_lr_schedule("WireBenchConfig", self.lr_schedule, self.steps)
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"WireBenchConfig.optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.matmul_precision not in ("highest", "high", "medium"):
            raise ConfigError("WireBenchConfig.matmul_precision must be highest, high or medium, got "
                              f"{self.matmul_precision!r}")
        if self.stage_lr_scale is not None:  # the pipeline's own checks, now rather than after dense trains
            checked = PipelineConfig(stage_lr_scale=self.stage_lr_scale)
            checked.stage_lr(0, self.stages)
            self.stage_lr_scale = checked.stage_lr_scale
        for option, direction in (("stage_codec", "fwd"), ("bwd_codec", "bwd")):  # named errors before training
            if getattr(self, option):
                try:
                    WireCodec(getattr(self, option), direction=direction)
                except ActzipError as e:
                    raise ConfigError(f"WireBenchConfig.{option}: {e}") from None
        for name, ratio in map(parse_entry, self.compressors if self.boundary else ()):  # now, not after dense
            if name not in ("dense", *BYTE_CODECS):
                gpt_boundary_config(name, self.gpt_config(), ratio, self.seed, **self.boundary_options())

    def boundary_options(self) -> dict:  # ``boundary`` as overrides: {"anchor_rank": 256, "lr": 0.0001}
        return parse_boundary_options(self.boundary)

    def gpt_config(self) -> GPTConfig:
        over = {k: getattr(self, k) for k in ("n_layer", "n_embd", "n_head", "block_size")
                if getattr(self, k) is not None}
        return GPTConfig.of_size(self.model, **over)


def parse_entry(entry: str) -> tuple[str, float]:
    """``"name:ratio"`` (or ``"dense"``; either with an ``@lr`` suffix, see :func:`entry_lr`) as ``(name, ratio)``."""
    entry_lr(entry, 1.0)  # a malformed rate fails here, with the entry named
    name, _, r = entry.partition("@")[0].partition(":")
    name = name.strip().lower()
    try:
        ratio = float(r) if r else 1.0
    except ValueError:
        raise ConfigError(f"compressor entry {entry!r}: the ratio after ':' must be a number") from None
    known = ("dense", *BYTE_CODECS, "subspace", "bottleneck", "stiefel", "stiefel-rvq")
    if name not in known:
        raise ConfigError(f"compressor entry {entry!r}: unknown name {name!r}; choose one of {', '.join(known)}")
    if name == "bf16":  # a cast: always half of float32's bytes
        if r and ratio != 2:
            raise ConfigError(f"compressor entry {entry!r}: bf16 sends 2 bytes per value of 4; write 'bf16'")
        ratio = 2.0
    if ratio < 1:
        raise ConfigError(f"compressor entry {entry!r}: the ratio must be >= 1")
    if name in ("quant", "delta") and 32 / ratio not in (1, 2, 4, 8):
        raise ConfigError(f"compressor entry {entry!r}: {name} takes ratio 4, 8, 16 or 32 (8, 4, 2, 1 bits of 32)")
    return name, ratio


def entry_lr(entry: str, default: float) -> float:
    """The learning rate of ``"name:ratio@lr"``; ``default`` (the config's ``lr``) without the suffix."""
    _, at, raw = entry.partition("@")
    if not at:
        return default
    try:
        lr = float(raw)
    except ValueError:
        lr = float("nan")
    if not 0 < lr < 1:  # also rejects nan
        raise ConfigError(f"compressor entry {entry!r}: the learning rate after '@' must be a number in (0, 1)")
    return lr


def codec_specs(name: str, ratio: float, bwd: str | None = None, stage: str | None = None) -> tuple[str, str]:
    """Forward and backward codec specs of an entry: a byte codec's own, or ``stage`` (``"none"`` if not given)
    on a stage compressor's code; ``bwd`` replaces the backward one (dense, the loss reference, stays raw)."""
    if name not in BYTE_CODECS:
        if name == "dense":
            return "none", "none"
        return stage or "none", bwd or stage or "none"
    if name == "bf16":
        fwd = back = "cast:dtype=bfloat16"
    elif name in ("quant", "delta"):
        q = f"quant:bits={int(32 / ratio)}"
        fwd = q if name == "quant" else f"delta:bits={int(32 / ratio)}"
        back = q
    elif name == "mask":
        fwd = back = f"mask:keep={1 / ratio:.6g}"
    else:
        fwd = back = f"mask:keep={1 / (2 * ratio):.6g},mode=topk"
    return fwd, back if bwd is None else bwd


def pipeline_config(cfg: WireBenchConfig, entry: str) -> PipelineConfig:
    """The pipeline settings of one entry."""
    name, ratio = parse_entry(entry)
    fwd, bwd = codec_specs(name, ratio, cfg.bwd_codec, cfg.stage_codec)
    boundary = "dense" if name in BYTE_CODECS or name == "dense" else format_boundary(name, {"ratio": ratio})
    return PipelineConfig(schedule=cfg.schedule, microbatches=cfg.microbatches, fwd_codec=fwd, bwd_codec=bwd,
                          lr=entry_lr(entry, cfg.lr), lr_schedule=cfg.lr_schedule, lr_steps=cfg.steps, seed=cfg.seed,
                          boundary=boundary, timeout_s=cfg.timeout_s, stage_lr_scale=cfg.stage_lr_scale,
                          optimizer=cfg.optimizer)


def build_stages_for(cfg: GPTConfig, n_stages: int, name: str, ratio: float, seed: int,
                     options: dict | None = None) -> list[Stage]:  # fmt: skip
    """Stage modules of an entry: dense stages for dense and the byte codecs, else the boundary's stages
    (``options``: boundary config overrides)."""
    if name in ("dense", *BYTE_CODECS):
        return build_gpt_stages(cfg, n_stages, "dense", seed=seed)
    return build_gpt_stages(cfg, n_stages, name, ratio=ratio, seed=seed, **(options or {}))


class Batches:
    """The training batches every run sees: ``(x, y, ids)`` per step, the same for every compressor.

    With ``windows`` a fixed set of that many windows is drawn once and visited in a fresh random order each
    epoch (``ids`` are window indices: repeated samples, as when fine-tuning); otherwise every batch is fresh
    random windows and ``ids`` is ``None``.
    """

    def __init__(self, corpus: Corpus, batch_size: int, block_size: int, seed: int, windows: int | None) -> None:
        self.corpus, self.batch_size, self.block_size, self.seed = corpus, batch_size, block_size, seed
        self.windows = windows
        if windows is not None:
            if windows < batch_size:
                raise ConfigError(f"dataset_windows ({windows}) must be at least batch_size ({batch_size})")
            g = torch.Generator().manual_seed(seed)
            self.x, self.y = corpus.get_batch("train", windows, block_size, generator=g)

    def __call__(self, step: int):
        if self.windows is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            x, y = self.corpus.get_batch("train", self.batch_size, self.block_size, generator=g)
            return x, y, None
        per_epoch = self.windows // self.batch_size
        epoch, i = divmod(step, per_epoch)
        order = torch.randperm(self.windows, generator=torch.Generator().manual_seed(self.seed + 7 * epoch))
        ids = order[i * self.batch_size : (i + 1) * self.batch_size]
        return self.x[ids], self.y[ids], ids
