"""Pipeline training over slow links: dense vs each boundary compressor (``actzip bench wire``).

The reference GPT is split into ``stages`` pipeline stages and trained from the same initial weights on the
same batches once per compressor entry: ``dense``, the byte codecs applied to the dense boundary (``quant``,
``mask``, ``topk``, ``delta``) and the stage-boundary compressors built into the stages
(:func:`actzip.wire.stages.build_stages`: ``subspace``, ``bottleneck``, ``stiefel``, ``stiefel-rvq``). An entry is
``name:ratio`` (``quant:8``, ``stiefel:16``); the ratio is the nominal forward compression of float32
activations, and the measured one is reported next to it. ``name:ratio@lr`` trains that entry at its own AdamW
learning rate, so one run can sweep rates and compare each entry at its best: with several dense entries the
target and every gap are the best dense run's.

Every run records each stage's actions with measured compute times and exact bytes on the wire, then
:func:`actzip.wire.link.simulate` replays the schedule over links of each bandwidth (same latency each way):
bytes per token each way, step time, loss at equal tokens, and the time to reach the dense run's final loss,
the fair metric (a compressor that steps faster but needs more steps shows it there).

Byte codecs per entry (float32 activations; the backward codec follows the forward one unless ``bwd_codec`` is
given): ``quant:r`` k-bit stochastic quantization with ``k = 32 / r`` (4, 8, 16, 32) both ways;
``mask:r`` random keep ``1 / r`` with ``r`` rescale both ways; ``topk:r`` top-k keep ``1 / (2 r)`` (values plus
int32 indices) both ways; ``delta:r`` AQ-SGD delta at ``k = 32 / r`` bits forward, k-bit quantization backward.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from dataclasses import asdict, dataclass

import torch
from torch import nn

from actzip.errors import ActzipError, ConfigError
from actzip.core.lr_schedule import check_lr_schedule
from actzip_bench.data import Corpus
from actzip_bench.models import GPT, GPTConfig
from actzip.wire.codecs import BoundaryCodec
from actzip.wire.link import LinkSpec, Timeline, simulate
from actzip.wire.pipeline import PipelineConfig, SimulatedPipeline
from actzip.wire.stages import boundary_config, parse_boundary_options

BYTE_CODECS = ("quant", "mask", "topk", "delta")
# --quick: under 3 minutes on a 2-core CPU (about 8 to 15 s per entry).
QUICK = {"model": "tiny", "n_embd": 128, "n_head": 4, "n_layer": 2, "block_size": 64, "batch_size": 32,
         "steps": 50, "target_steps": 1.4, "dataset_windows": 768, "eval_batches": 2,
         "compressors": ("dense", "quant:8", "mask:8", "topk:8", "delta:8", "subspace:100", "bottleneck:100",
                         "stiefel:16", "stiefel-rvq:100")}


@dataclass
class WireBenchConfig:
    """What ``actzip bench wire`` trains and measures."""

    model: str = "small"  # GPTConfig preset
    n_layer: int | None = None  # override the preset's blocks (None: keep)
    n_embd: int | None = None  # override the preset's width
    n_head: int | None = None  # override the preset's heads
    block_size: int | None = None  # sequence length (None: the preset's)
    stages: int = 2  # pipeline stages (2-4)
    compressors: tuple[str, ...] = ("dense", "quant:8", "mask:8", "topk:8", "delta:8", "subspace:100",
                                    "bottleneck:100", "stiefel:16", "stiefel-rvq:100")
    bwd_codec: str | None = None  # backward codec spec for the byte codecs (None: follow the forward one)
    # byte codec on the code of the stage compressors, both directions unless bwd_codec says otherwise
    # (e.g. "quant:bits=8": stiefel:4 with 8-bit codes is about 16x); None: raw codes
    stage_codec: str | None = None
    bandwidths: tuple[float, ...] = (80.0, 200.0)  # Mbps of the simulated links
    latency_ms: float = 50.0  # one-way latency of every link
    schedule: str = "gpipe"  # "gpipe" or "1f1b"
    microbatches: int = 4  # per step
    batch_size: int = 16  # sequences per step
    steps: int = 600  # optimizer steps per run
    lr: float = 1e-3  # AdamW learning rate
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
                    BoundaryCodec(getattr(self, option), direction=direction)
                except ActzipError as e:
                    raise ConfigError(f"WireBenchConfig.{option}: {e}") from None
        for name, ratio in map(parse_entry, self.compressors if self.boundary else ()):  # now, not after dense
            if name not in ("dense", *BYTE_CODECS):
                boundary_config(name, self.gpt_config(), ratio, self.seed, **self.boundary_options())

    def boundary_options(self) -> dict:  # ``boundary`` as overrides: {"anchor_rank": 256, "lr": 0.0001}
        return parse_boundary_options(self.boundary)

    def gpt_config(self) -> GPTConfig:
        over = {k: getattr(self, k) for k in ("n_layer", "n_embd", "n_head", "block_size")
                if getattr(self, k) is not None}
        return GPTConfig.preset(self.model, **over)


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
    on a stage compressor's code; ``bwd`` replaces the backward one."""
    if name not in BYTE_CODECS:
        if name == "dense" or not stage:
            return "none", "none"
        return stage, bwd or stage
    if name in ("quant", "delta"):
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
    return PipelineConfig(schedule=cfg.schedule, microbatches=cfg.microbatches, fwd_codec=fwd, bwd_codec=bwd,
                          lr=entry_lr(entry, cfg.lr), lr_schedule=cfg.lr_schedule, lr_steps=cfg.steps, seed=cfg.seed,
                          compressor="dense" if name in BYTE_CODECS else name, ratio=ratio, timeout_s=cfg.timeout_s,
                          stage_lr_scale=cfg.stage_lr_scale)


class _First(nn.Module):
    def __init__(self, gpt: GPT, blocks) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop, self.blocks = gpt.wte, gpt.wpe, gpt.drop, nn.ModuleList(blocks)

    def forward(self, idx):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for b in self.blocks:
            x = b(x)
        return x


class _Middle(nn.Module):
    def __init__(self, blocks, head=None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        if head is not None:
            self.ln_f, self.lm_head = head

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x)) if hasattr(self, "lm_head") else x


def split_gpt(cfg: GPTConfig, n_stages: int, seed: int = 0) -> list[nn.Module]:
    """``GPT(cfg)`` built under ``seed`` and split by blocks into dense stages (the head untied)."""
    if not 2 <= n_stages <= cfg.n_layer:
        raise ConfigError(f"split_gpt: n_stages must be in [2, n_layer={cfg.n_layer}], got {n_stages}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gpt = GPT(cfg)
    if cfg.tie_weights:
        gpt.lm_head.weight = nn.Parameter(gpt.lm_head.weight.detach().clone())
    base, extra = divmod(cfg.n_layer, n_stages)
    sizes = [base + (i < extra) for i in range(n_stages)]
    starts = [sum(sizes[:i]) for i in range(n_stages)]
    blocks = [list(gpt.h[s : s + n]) for s, n in zip(starts, sizes)]
    out: list[nn.Module] = [_First(gpt, blocks[0])]
    out += [_Middle(b) for b in blocks[1:-1]]
    return out + [_Middle(blocks[-1], (gpt.ln_f, gpt.lm_head))]


def build_stages_for(cfg: GPTConfig, n_stages: int, name: str, ratio: float, seed: int,
                     options: dict | None = None) -> list[nn.Module]:  # fmt: skip
    """Stage modules of an entry: dense stages for dense and the byte codecs, else the compressor's stages
    (``options``: boundary config overrides)."""
    try:
        from actzip.wire.stages import build_stages
    except ImportError as e:
        if name in ("dense", *BYTE_CODECS):
            return split_gpt(cfg, n_stages, seed)
        raise ConfigError(f"compressor {name!r} needs actzip.wire.stages, which cannot be imported: {e}") from None
    if name in ("dense", *BYTE_CODECS):
        return build_stages(cfg, n_stages, "dense", ratio, seed)
    return build_stages(cfg, n_stages, name, ratio, seed, **(options or {}))


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


def first_reach(losses: list[float], window: int, target: float | None) -> int | None:
    """Index of the first loss whose trailing mean over ``window`` values (fewer at the start) is at most
    ``target``: when a run reaches the target loss. None if it never does, or without a target."""
    acc = 0.0
    for i, v in enumerate(losses):
        acc += v
        if i >= window:
            acc -= losses[i - window]
        if target is not None and acc / min(i + 1, window) <= target + 1e-12:
            return i
    return None


def train_entry(cfg: WireBenchConfig, entry: str, device: torch.device, corpus: Corpus, progress=None,
                target: float | None = None) -> dict:
    """Train one entry for ``steps`` steps, then on (up to ``target_steps * steps``) until its smoothed loss
    reaches ``target``; its losses, trace and bytes (before any link is applied)."""
    name, ratio = parse_entry(entry)
    gcfg = cfg.gpt_config()
    fwd, bwd = codec_specs(name, ratio, cfg.bwd_codec, cfg.stage_codec)
    if cfg.mode == "processes":
        from actzip_bench.wire_processes import train_entry_processes  # it imports this module

        out = train_entry_processes(cfg, entry, device, target=target)
        if progress is not None:  # the stage processes report nothing while they run: the entry at once
            for step in range(cfg.steps):
                progress(entry, step)
        return out
    if name == "delta" and cfg.dataset_windows is None:
        raise ConfigError("delta caches activations per sample and needs repeated samples: set dataset_windows")
    stages = [s.to(device) for s in build_stages_for(gcfg, cfg.stages, name, ratio, cfg.seed, cfg.boundary_options())]
    pipe = SimulatedPipeline(stages, pipeline_config(cfg, entry), device)
    batches = Batches(corpus, cfg.batch_size, gcfg.block_size, cfg.seed, cfg.dataset_windows)
    window = max(1, round(cfg.smooth * cfg.steps))
    limit = cfg.steps if target is None else max(cfg.steps, round(cfg.target_steps * cfg.steps))
    val = None
    for step in range(limit):
        if step == cfg.steps:  # validation at equal tokens, before a run short of the target trains on
            val = _val_loss(pipe, corpus, cfg, device)
        if step >= cfg.steps and statistics.fmean(pipe.losses[-window:]) <= target:
            break
        x, y, ids = batches(step)
        pipe.train_step(x.to(device), y.to(device), ids)
        if progress is not None:
            progress(entry, step)
    val = _val_loss(pipe, corpus, cfg, device) if val is None else val
    tokens = cfg.steps * cfg.batch_size * gcfg.block_size  # equal tokens: the first `steps` steps
    boundaries = cfg.stages - 1
    acts = pipe.actions
    fwd_b = sum(a.send_bytes for a in acts if a.kind == "F" and a.step < cfg.steps)
    bwd_b = sum(a.send_bytes for a in acts if a.kind == "B" and a.step < cfg.steps)
    return {"entry": entry, "compressor": name, "ratio": ratio, "fwd_codec": fwd, "bwd_codec": bwd,
            "losses": pipe.losses, "val_loss": val, "actions": acts, "tokens": tokens,
            "bytes_per_token_fwd": fwd_b / (tokens * boundaries), "bytes_per_token_bwd": bwd_b / (tokens * boundaries),
            "wire_bytes_checked": sum(m.total("sent", "fwd") + m.total("sent", "bwd") for m in pipe.meters())}


def _val_loss(pipe, corpus, cfg, device) -> float:
    g = torch.Generator().manual_seed(1234)  # the same held-out batches for every entry
    batches = (corpus.get_batch("val", cfg.batch_size, cfg.gpt_config().block_size, generator=g)
               for _ in range(cfg.eval_batches))  # fmt: skip
    return statistics.fmean(pipe.eval_loss(x.to(device), y.to(device)) for x, y in batches)


def _median_step(ends: list[float] | None) -> float | None:
    """Median wall-clock step time of a run made with one process per stage (None for one process)."""
    if not ends:
        return None
    return statistics.median([b - a for a, b in zip([0.0, *ends], ends)])


def summarize(cfg: WireBenchConfig, trained: list[dict], dense_bytes_per_token: float,
              measured: LinkSpec | None = None) -> tuple[list[dict], dict]:
    """JSON runs, one per (entry, bandwidth), with the time to the dense run's final loss; and the curves.

    Times are simulated from the measured trace over each bandwidth's link; with ``measured`` (runs made through
    that real link) they are the measured wall-clock times instead, and the simulation is reported beside them.
    """
    window = max(1, round(cfg.smooth * cfg.steps))
    every = max(1, cfg.steps // 200)
    finals = {t["entry"]: statistics.fmean(t["losses"][cfg.steps - window : cfg.steps]) for t in trained}
    ref = min((t for t in trained if t["compressor"] == "dense"), key=lambda t: finals[t["entry"]], default=None)
    target = cfg.target_loss if cfg.target_loss is not None else (finals[ref["entry"]] if ref is not None else None)
    runs, curves = [], {}
    for t in trained:
        per_step = [0] * len(t["losses"])
        for a in t["actions"]:
            per_step[a.step] += a.send_bytes
        cum = list(itertools.accumulate(b / (cfg.stages - 1) for b in per_step))
        curves[t["entry"]] = {"every": every, "loss": t["losses"][::every], "bytes_per_boundary": cum[::every],
                              "time_s": {}}
    links = [measured] if measured is not None else [LinkSpec(bw, cfg.latency_ms if bw is not None else 0.0)
                                                     for bw in (*cfg.bandwidths, None)]
    for link in links:
        bw = link.bandwidth_mbps
        ref_time = None
        for t in ([ref] if ref is not None else []) + [t for t in trained if t is not ref]:
            tl = simulate(t["actions"], link)
            sim_step = tl.median_step_s
            if measured is not None:
                tl = Timeline(t["wall_step_end_s"], tl.busy_s, tl.link_bytes)
            hit = first_reach(t["losses"], window, target)
            ttt = tl.step_end_s[hit] if hit is not None else None
            if t is ref:
                ref_time = ttt
            curves[t["entry"]]["time_s"]["inf" if bw is None else f"{bw:g}"] = tl.step_end_s[::every]
            runs.append({
                "compressor": t["compressor"], "ratio": t["ratio"], "bandwidth_mbps": bw,
                "bytes_per_token_fwd": t["bytes_per_token_fwd"], "bytes_per_token_bwd": t["bytes_per_token_bwd"],
                "tokens": t["tokens"], "final_loss": finals[t["entry"]], "step_time_s": tl.median_step_s,
                "lr": entry_lr(t["entry"], cfg.lr),
                "time_to_target_s": ttt,
                "entry": t["entry"], "fwd_codec": t["fwd_codec"], "bwd_codec": t["bwd_codec"],
                "measured_ratio_fwd": dense_bytes_per_token / t["bytes_per_token_fwd"],
                "latency_ms": link.latency_ms, "val_loss": t["val_loss"], "total_time_s": tl.total_s,
                "loss_gap": None if target is None else finals[t["entry"]] / target - 1,
                "speedup_to_target": (ref_time / ttt) if ref_time and ttt else None,
                "steps_to_target": None if hit is None else hit + 1, "steps_run": len(t["losses"]),
                "time_source": "simulated" if measured is None else "measured", "simulated_step_time_s": sim_step,
                "wall_step_time_s": _median_step(t.get("wall_step_end_s")),
                **({"link_counters": t["link_counters"]} if "link_counters" in t else {}),
            })
    return runs, curves


def run_wire(cfg: WireBenchConfig, device: torch.device, progress=None, on_entry=None) -> dict:
    """Train every entry (dense first: it sets the target) and summarize over every link.

    ``on_entry(record)``, if given, receives the record of the entries trained so far after each one, so a long
    run that is cut short still leaves its finished entries (the CLI writes them to ``--json``)."""
    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    threads = torch.get_num_threads()
    if cfg.threads is not None and device.type == "cpu":
        # All stages share one process; on a shared CPU, OpenMP threads contending for cores made compute
        # times up to 10x slower and far noisier than one thread.
        torch.set_num_threads(cfg.threads)
    # dense first: the best dense run sets the target
    order = sorted(cfg.compressors, key=lambda e: parse_entry(e)[0] != "dense")
    trained, target = [], cfg.target_loss
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    window = max(1, round(cfg.smooth * cfg.steps))
    gcfg = cfg.gpt_config()
    dense_bpt = gcfg.n_embd * 4.0  # float32 activations, headers excluded
    try:
        if cfg.mode == "netns":  # every entry through a real link of each bandwidth
            from actzip_bench.wire_processes import train_entry_processes

            runs, curves = [], {}
            for bw in cfg.bandwidths:
                link = LinkSpec(bw, cfg.latency_ms)
                trained = [train_entry_processes(cfg, e, device, link) for e in order]
                r, c = summarize(cfg, trained, dense_bpt, measured=link)
                runs += r
                for k, v in c.items():
                    curves.setdefault(k, v)["time_s"].update(v["time_s"])
        else:
            for e in order:
                dense = parse_entry(e)[0] == "dense"
                trained.append(train_entry(cfg, e, device, corpus, progress, None if dense else target))
                if dense and cfg.target_loss is None:
                    final = statistics.fmean(trained[-1]["losses"][cfg.steps - window : cfg.steps])
                    target = final if target is None else min(target, final)
                if on_entry is not None and len(trained) < len(order):
                    on_entry(_record(cfg, gcfg, *summarize(cfg, trained, dense_bpt), device))
            runs, curves = summarize(cfg, trained, dense_bpt)
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
    return _record(cfg, gcfg, runs, curves, device)


def _record(cfg: WireBenchConfig, gcfg: GPTConfig, runs: list[dict], curves: dict, device: torch.device) -> dict:
    from actzip_bench.harness import machine_record

    ref = [r["final_loss"] for r in runs if r["compressor"] == "dense"]
    return {
        "config": asdict(cfg), "gpt": dataclasses.asdict(gcfg), "mode": cfg.mode,
        "target_loss": cfg.target_loss if cfg.target_loss is not None else (min(ref) if ref else None),
        "runs": runs, "curves": curves,
        "machine": machine_record(device),
    }
