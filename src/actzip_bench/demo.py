"""``actzip demo``: train the reference ReLU² GPT three ways and compare what autograd keeps.

Strategies, trained in lockstep from the same weights on the same batches:

- ``none``: plain PyTorch;
- ``checkpoint``: activation checkpointing of every block (``torch.utils.checkpoint``);
- ``sparse``: the lossless sparse activation cache (:class:`actzip.memory.ActivationCache`).

Every strategy runs under an activation cache that at least counts, so saved bytes are counted the same
way for all (distinct tensors, parameters and inputs excluded). Each step the strategies run in a rotating
order, and every gradient is compared with the ``none`` run's gradient of the same step: a strategy is
reported lossless only when all its gradients of every step are bit-identical (``torch.equal``) to those
and its final loss equals the reference's.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from actzip.errors import ConfigError
from actzip_bench.data import Corpus
from actzip.memory.cache import CacheContext as ActivationCache
from actzip_bench.models import GPT, GPTConfig

STRATEGIES = ("none", "checkpoint", "sparse")


@dataclass
class DemoConfig:
    """Options of the demo run. Defaults finish in a few minutes on a 2-core CPU."""

    preset: str = "small"  # model size (GPTConfig.of_size); the field keeps its name in recorded results
    activation: str = "relu2"  # MLP activation; ReLU² leaves most of the MLP activations exactly zero
    steps: int = 60  # training steps per strategy
    warmup_steps: int = 3  # first steps left out of the step-time median (at most steps - 1)
    batch_size: int = 8  # sequences per step
    block_size: int | None = None  # tokens per sequence; None: the preset's block_size
    lr: float = 1e-3  # AdamW learning rate
    seed: int = 0  # weights and batches
    device: str = "auto"  # "auto": CUDA when available, else CPU
    dtype: str = "auto"  # "auto": bfloat16 weights on CUDA, float32 on CPU; or "float32" / "bfloat16"
    text_file: str | None = None  # train on this text file instead of the standard library's source
    corpus_bytes: int = 8_000_000  # bytes of standard-library source to use
    strategies: tuple[str, ...] = STRATEGIES  # which strategies to run ("none" always runs: it is the reference)
    deterministic: bool = True  # deterministic kernels, so a gradient difference can only come from the strategy

    def __post_init__(self) -> None:
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            raise ConfigError(f"demo: unknown strategies {bad}; choose from {list(STRATEGIES)}")
        if "none" not in self.strategies:
            self.strategies = ("none", *self.strategies)
        if self.steps < 1 or self.warmup_steps < 0:
            raise ConfigError(f"demo: need steps >= 1 and warmup_steps >= 0, got {self.steps}, {self.warmup_steps}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"demo: dtype must be auto, float32 or bfloat16, got {self.dtype!r}")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dev = torch.device(self.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("demo: device 'cuda' was asked for but torch sees no CUDA device")
        return dev

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return getattr(torch, self.dtype)


@dataclass
class StrategyRun:
    """One strategy's measurements (the demo's JSON record)."""

    strategy: str
    lossless: bool  # measured: every gradient torch.equal to "none"'s at every step, and the same final loss
    saved_bytes_per_token: float  # activation bytes autograd keeps per token, mean over steps
    peak_bytes: int | None  # peak device memory of a step as if run alone (weights, optimizer, activations); CUDA only
    step_time_s: float  # median wall time of forward + backward + optimizer step after warm-up
    final_loss: float  # training loss at the last step
    max_grad_abs_diff: float  # largest |grad - grad of "none"| over every parameter and step (NaN if any is NaN)
    losses: list[float] = field(default_factory=list, repr=False)  # loss per step (not in the JSON)


class _Runner:
    """One strategy: a model, its optimizer and its measurements."""

    def __init__(self, name: str, base: GPT, lr: float) -> None:
        self.name = name
        self.model = copy.deepcopy(base)
        self.model.config.checkpoint_blocks = name == "checkpoint"
        self.opt = self.model.configure_optimizer(lr=lr)
        self.cache = ActivationCache() if name == "sparse" else ActivationCache.count_only()
        self.times: list[float] = []
        self.saved: list[int] = []
        self.peaks: list[int] = []
        self.losses: list[float] = []
        self.max_diff = 0.0
        self.identical = True  # every gradient so far torch.equal to the reference's

    def compare(self, ref: "_Runner") -> None:
        """Fold this step's gradients, against the reference's, into max_diff and identical."""
        pairs = list(zip(self.grads(), ref.grads()))
        # A gradient missing on one side only is a difference that no value can show.
        self.identical = self.identical and all(
            (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b)) for a, b in pairs)
        diffs = [(a.float() - b.float()).abs().max() for a, b in pairs if a is not None and b is not None]
        if diffs:
            # torch's max keeps NaN (Python's max would drop a NaN that comes second).
            step = float(torch.stack(diffs).max())
            self.max_diff = step if math.isnan(step) or step > self.max_diff else self.max_diff

    def state_bytes(self) -> int:
        n = sum(p.numel() * p.element_size() for p in self.model.parameters())
        for st in self.opt.state.values():
            n += sum(v.numel() * v.element_size() for v in st.values() if isinstance(v, torch.Tensor))
        return n

    def step(self, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            own = self.state_bytes()
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        with self.cache:
            _, loss = self.model(x, y)
        loss.backward()
        self.opt.step()
        if cuda:
            torch.cuda.synchronize(device)
        self.times.append(time.perf_counter() - t0)
        if cuda:
            # Memory held by the other strategies' models is in `before`: take it out, keep this one's own.
            self.peaks.append(torch.cuda.max_memory_allocated(device) - before + own)
        self.saved.append(self.cache.last.bytes_after)
        self.losses.append(float(loss.detach()))

    def grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.model.parameters()]


def run_demo(cfg: DemoConfig, progress: bool = True) -> dict:
    """Run the demo and return its JSON-ready result."""
    if not cfg.deterministic:
        return _run(cfg, progress)
    # GPU kernels with atomic adds (attention backward, some GEMMs) differ from run to run; pin them so that
    # max_grad_abs_diff measures the strategy alone. cuBLAS reads this variable when its handle is created.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _run(cfg, progress)
    finally:
        torch.use_deterministic_algorithms(was)


def _run(cfg: DemoConfig, progress: bool) -> dict:
    device = cfg.resolve_device()
    dtype = cfg.resolve_dtype(device)
    torch.manual_seed(cfg.seed)
    overrides = {"activation": cfg.activation}
    if cfg.block_size is not None:
        overrides["block_size"] = cfg.block_size
    base = GPT(GPTConfig.of_size(cfg.preset, **overrides)).to(device=device, dtype=dtype)
    block = base.config.block_size
    corpus = Corpus.from_file(cfg.text_file) if cfg.text_file else Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    gen = torch.Generator().manual_seed(cfg.seed)
    runners = [_Runner(s, base, cfg.lr) for s in cfg.strategies]
    ref = runners[0]
    tokens = cfg.batch_size * block

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("[bold]training[/]"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
               TextColumn("loss {task.fields[loss]}"))
    with Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task("train", total=cfg.steps, loss="-")
        for step in range(cfg.steps):
            x, y = corpus.get_batch("train", cfg.batch_size, block, generator=gen, device=device)
            # Rotate the order so no strategy always runs first (cold caches) or last.
            for k in range(len(runners)):
                runners[(step + k) % len(runners)].step(x, y, device)
            for r in runners[1:]:
                r.compare(ref)
            bar.update(task, advance=1, loss=f"{ref.losses[-1]:.3f}")

    runs = []
    for r in runners:
        runs.append(
            StrategyRun(
                strategy=r.name,
                # "none" is the reference; NaN losses compare unequal, so they are never lossless.
                lossless=r is ref or (r.identical and r.losses[-1] == ref.losses[-1]),
                saved_bytes_per_token=statistics.fmean(r.saved) / tokens,
                peak_bytes=max(r.peaks) if r.peaks else None,
                step_time_s=statistics.median(r.times[min(cfg.warmup_steps, cfg.steps - 1):]),
                final_loss=r.losses[-1],
                max_grad_abs_diff=r.max_diff,
                losses=r.losses,
            )
        )
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "host": host_info(),
        "dtype": str(dtype).replace("torch.", ""),
        "model": {"preset": cfg.preset, "activation": cfg.activation, "params": base.num_params(False), "block_size": block},
        "tokens_per_step": tokens,
        "deterministic": cfg.deterministic,
        "steps": cfg.steps,
        "corpus": corpus.name,
        "runs": [{k: v for k, v in asdict(run).items() if k != "losses"} for run in runs],
    }


def host_info() -> dict:
    """The machine a result was measured on."""
    from actzip_bench.harness import cpu_name

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(), "os": platform.platform()}


def render(result: dict):
    """The demo's rich table."""
    from rich.table import Table

    runs = {r["strategy"]: r for r in result["runs"]}
    base = runs["none"]
    t = Table(title=f"actzip demo: {result['model']['activation']} GPT, {result['model']['params'] / 1e6:.1f}M params, "
              f"{result['device']} {result['dtype']}, {result['steps']} steps x {result['tokens_per_step']} tokens")
    for col in ("strategy", "saved B/token", "vs none", "peak memory", "step ms", "vs none", "final loss", "max|Δgrad|"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in result["runs"]:
        t.add_row(
            r["strategy"],
            f"{r['saved_bytes_per_token']:,.0f}",
            f"{r['saved_bytes_per_token'] / base['saved_bytes_per_token'] - 1:+.1%}",
            "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:,.1f} MiB",
            f"{r['step_time_s'] * 1e3:,.1f}",
            f"{r['step_time_s'] / base['step_time_s'] - 1:+.1%}",
            f"{r['final_loss']:.4f}",
            f"{r['max_grad_abs_diff']:.3g}",
        )
    return t


def write_json(result: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
