"""Loss curves of the activation-cache presets: the same GPT, weights and batches under each preset.

Trains the reference GPT (or, with ``activation="swiglu"``, a HuggingFace Llama of the same size built from a
local config) from the same initial weights on the same batches of the embedded corpus once per preset
(``lossless``, ``conservative``, ``balanced``, ``aggressive``, ``4bit``), recording the training loss, the
validation loss at the end, the bytes the cache kept per token, and the step time. The final-loss gap to
``lossless`` (which is bit-identical to no compression) is the price of each lossy preset.

``sketch-d8`` is not a cache preset but takes part the same way: every ``nn.Linear`` but the output head
becomes a :class:`~actzip.memory.linear.SketchedLinear` of rank ``in_features / 8`` for that run (a cache that
compresses nothing counts what autograd keeps). ``none`` trains with no cache at all (the reference where
``lossless`` cannot run: under ``graphs``).

No step waits for the device: the losses stay on it until the run ends, and the step time is the run's wall time
over its steps after the first five. With ``graphs`` each preset's step is captured as a CUDA graph after three
eager steps (the cache ``graph_safe``: new rounding noise on every replay) and the rest of its steps are replays
on static batch tensors: the same training without the host's work per saved tensor.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

import actzip
from actzip.errors import ConfigError
from actzip.memory.cache import CacheConfig, CacheContext as ActivationCache, preset_rules
from actzip.memory.cache.rules import count_only_rules
from actzip.memory.modules import DerivativeActivationConfig
from actzip_bench.data import Corpus
from actzip_bench.models import GPT, GPTConfig

SKETCH = "sketch-d8"  # the unbiased rank-d/8 sketch of every linear input but the head's
NONE = "none"  # no cache: every activation kept by autograd as it is
WARMUP = 3  # eager steps before a capture
# after a preset's name: the model's activations keep their derivative for backward (DerivativeActivationConfig)
DERIVATIVES = "+derivatives"


@dataclass
class PresetBenchConfig:
    model: str = "tiny"  # model size (GPTConfig.of_size)
    # GELU exercises the nonlinear-input rules; relu2 the sparse ones; swiglu: an HF LlamaForCausalLM of the GPT
    # preset's width, depth and sequence length, byte vocabulary, built from a local config
    activation: str = "gelu"
    # preset names, each optionally with roles' treatments replaced: "2bit/attention=quant2-rn" (preset_spec), and
    # "+derivatives" after the name: the model's GELU / SiLU keep their derivative ("2bit+derivatives")
    presets: tuple[str, ...] = ("lossless", "conservative", "balanced", "aggressive")
    steps: int = 2000
    batch_size: int = 16
    lr: float = 1e-3
    min_bytes: int = 0  # compress every tensor the rules select, however small (tiny models have small tensors)
    corpus_bytes: int = 4_000_000
    eval_batches: int = 8
    log_every: int = 10  # keep every n-th training loss in the record
    seed: int = 0  # initial weights and training batches (the validation batches stay fixed)
    # "float32", or "bfloat16": every forward under autocast to bfloat16 (the weights and optimizer stay float32),
    # as a user trains at 124M; the cache then sees bfloat16 activations and lossless keeps them as they are
    dtype: str = "float32"
    block_size: int | None = None  # sequence length (None: the GPT preset's)
    # CUDA: each preset's step captured as a CUDA graph and replayed; the caches refuse rules a graph cannot
    # replay (lossless's sparse codec: none is the reference there), and the sketch draws its signs on the host
    graphs: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"bench presets: dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.block_size is not None and not (isinstance(self.block_size, int) and self.block_size > 0):
            raise ConfigError(f"bench presets: block_size must be a positive int or None, got {self.block_size!r}")
        if self.graphs and SKETCH in self.presets:
            raise ConfigError(f"bench presets: graphs cannot replay {SKETCH} (its signs are drawn on the host)")
        for name in self.presets:  # each preset's cache checks its own rules now, before any training
            _cache(name, self)
        if self.graphs and self.steps <= WARMUP:
            raise ConfigError(f"bench presets: graphs needs more than {WARMUP} steps (the eager warm-up), got "
                              f"{self.steps}")


def preset_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"2bit/attention=quant2-rn/norm=quant2-rn"``: preset ``2bit`` with those roles' treatments replaced (the
    record keeps the whole spec as the run's name); a name ending in :data:`DERIVATIVES` is the preset's."""
    name, *overrides = spec.split("/")
    if name.endswith(DERIVATIVES) and name.removesuffix(DERIVATIVES) in (SKETCH, NONE):
        raise ConfigError(f"bench presets: {spec!r}: {DERIVATIVES} hands each derivative to the preset's rules, and "
                          f"{name.removesuffix(DERIVATIVES)} has none")
    name = name.removesuffix(DERIVATIVES)
    treatments = {}
    for item in overrides:
        role, sep, how = item.partition("=")
        if not sep or not role or not how:
            raise ConfigError(f"bench presets: {spec!r}: each override after the preset is ROLE=TREATMENT, got "
                              f"{item!r}")
        treatments[role] = how
    if treatments and name in (SKETCH, NONE):
        raise ConfigError(f"bench presets: {spec!r}: {name} has no rules to override")
    return name, treatments


def _cache(spec: str, cfg: PresetBenchConfig) -> ActivationCache:
    """The cache of preset ``spec`` (:func:`preset_spec`), built once for its run: fresh noise each step (under
    graphs each replay, through the device-side step offset); count-only for ``none`` and the sketch."""
    name, treatments = preset_spec(spec)
    rules = count_only_rules() if name in (SKETCH, NONE) else \
        preset_rules(name, min_bytes=cfg.min_bytes, treatments=treatments or None)
    return ActivationCache(CacheConfig(graph_safe=cfg.graphs), rules=rules)


def _autocast(cfg: PresetBenchConfig, device: torch.device):
    """The forward's precision: autocast to bfloat16, or nothing for float32 (under graphs without autocast's
    cache of cast weights, as torch asks of captured regions)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16",
                          cache_enabled=not cfg.graphs)


def _val_loss(model, loss_fn, block: int, corpus: Corpus, cfg: PresetBenchConfig, device) -> float:
    g = torch.Generator().manual_seed(1234)
    losses = []
    model.eval()
    with torch.no_grad(), _autocast(cfg, device):
        for _ in range(cfg.eval_batches):
            x, y = corpus.get_batch("val", cfg.batch_size, block, generator=g, device=device)
            losses.append(float(loss_fn(x, y)))
    model.train()
    return sum(losses) / len(losses)


def _build(cfg: PresetBenchConfig, device: torch.device):
    """The model, its loss ``(x, y) -> scalar``, an optimizer factory and the sequence length."""
    size = {} if cfg.block_size is None else {"block_size": cfg.block_size}
    gcfg = GPTConfig.of_size(cfg.model, **size) if cfg.activation == "swiglu" else \
        GPTConfig.of_size(cfg.model, activation=cfg.activation, **size)
    torch.manual_seed(cfg.seed)
    if cfg.activation == "swiglu":
        from actzip_bench.cache_config import CacheBenchConfig
        from actzip_bench.cache_models import adamw as _adamw, build_model

        ccfg = CacheBenchConfig(models=("llama-swiglu",), gpt_preset=cfg.model, seq_len=gcfg.block_size,
                                vocab_size=256, loss_chunk=0, dtype="float32")
        m = build_model("llama-swiglu", ccfg, device)
        return m.module, m.loss, lambda: _adamw(m.module, cfg.lr), gcfg.block_size
    base = GPT(gcfg).to(device)
    return base, (lambda x, y: base(x, y)[1]), (lambda: base.configure_optimizer(lr=cfg.lr)), gcfg.block_size


def _batches(cfg: PresetBenchConfig, corpus: Corpus, block: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every step's batch, drawn as the steps would draw them and moved to ``device`` at once (no step then
    waits for a copy from the host)."""
    g = torch.Generator().manual_seed(cfg.seed)
    xs, ys = zip(*(corpus.get_batch("train", cfg.batch_size, block, generator=g) for _ in range(cfg.steps)))
    return torch.stack(xs).to(device), torch.stack(ys).to(device)


def _train(cfg: PresetBenchConfig, cache, loss_fn, opt, xs, ys, device, progress=None, name: str = ""):
    """One preset's training: the losses (on the device), the cache's bytes kept and seen at the logged steps,
    and the wall time per step after the first five."""
    losses = torch.empty(cfg.steps, dtype=torch.float32, device=device)
    kept, before = [], []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)

    def step(x, y) -> torch.Tensor:
        with cache, _autocast(cfg, device):  # the cache tracks the roles its rules ask for (replayed by position)
            loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def done(i: int, loss: torch.Tensor) -> None:
        losses[i].copy_(loss)
        if i % cfg.log_every == 0 or i == cfg.steps - 1:
            kept.append(cache.last.bytes_after)  # a replay's account is its capture's
            before.append(cache.last.bytes_before)
        if not cfg.graphs:
            cache.history.clear()
        if progress is not None:
            progress(name, i)

    t0 = None
    first = WARMUP if cfg.graphs else cfg.steps
    side = torch.cuda.Stream(device) if cfg.graphs else None
    static_x, static_y = (xs[0].clone(), ys[0].clone()) if cfg.graphs else (None, None)  # a graph's inputs
    for i in range(first):  # eager steps (under graphs: torch's warm-up on a side stream, then the capture)
        if i == 5:
            sync(device)
            t0 = time.perf_counter()
        if side is None:
            done(i, step(xs[i], ys[i]))
            continue
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            static_x.copy_(xs[i])
            static_y.copy_(ys[i])
            done(i, step(static_x, static_y))
        torch.cuda.current_stream(device).wait_stream(side)
    if cfg.graphs:
        opt.zero_grad(set_to_none=True)  # gradients made in the graph's memory
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(static_x, static_y)
        for i in range(first, cfg.steps):
            if i == 5:
                sync(device)
                t0 = time.perf_counter()
            static_x.copy_(xs[i])
            static_y.copy_(ys[i])
            graph.replay()
            done(i, out)
    sync(device)
    per_step = (time.perf_counter() - t0) / (cfg.steps - 5) if t0 is not None else None
    return losses.tolist(), kept, before, per_step


def run_presets(cfg: PresetBenchConfig, device: torch.device, progress=None) -> dict:
    from actzip_bench.cache_models import adamw
    from actzip_bench.cache_strategies import sketch_modules, use_modules
    from actzip_bench.harness import machine_record

    if cfg.graphs and device.type != "cuda":
        raise ConfigError(f"bench presets: graphs captures CUDA graphs; the device is {device}")
    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    base, loss_fn, make_opt, block = _build(cfg, device)
    init = {k: v.clone() for k, v in base.state_dict().items()}
    tokens = cfg.batch_size * block
    xs, ys = _batches(cfg, corpus, block, device)
    runs = []
    for name in cfg.presets:
        base.load_state_dict(init)
        plain = sketch_modules(base, 1 / 8)[1] if preset_spec(name)[0] == SKETCH else None
        derivatives = name.split("/")[0].endswith(DERIVATIVES)
        if derivatives:
            actzip.compress_(base, DerivativeActivationConfig())
        opt = adamw(base, cfg.lr, capturable=True) if cfg.graphs else make_opt()
        cache = _cache(name, cfg)
        losses, kept, before, per_step = _train(cfg, cache, loss_fn, opt, xs, ys, device, progress, name)
        if plain is not None:
            use_modules(base, plain)
        if derivatives:
            actzip.restore_(base)
        tail = losses[-50:]
        runs.append({
            "preset": name,
            "final_train_loss": sum(tail) / len(tail),
            "val_loss": _val_loss(base, loss_fn, block, corpus, cfg, device),
            "saved_bytes_per_token": statistics.fmean(kept) / tokens,
            "dense_bytes_per_token": statistics.fmean(before) / tokens,
            "step_time_s": per_step,
            "train_loss": losses[:: cfg.log_every],
        })
    ref = next((r for r in runs if r["preset"] == "lossless"), runs[0])
    for r in runs:
        r["val_loss_gap"] = r["val_loss"] / ref["val_loss"] - 1
        r["train_loss_gap"] = r["final_train_loss"] / ref["final_train_loss"] - 1
    return {"config": asdict(cfg), "tokens_per_step": tokens, "reference": ref["preset"], "runs": runs,
            "machine": machine_record(device)}


def plot(record: dict, path) -> None:
    """Training-loss curves of every preset, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = record["config"]["log_every"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in record["runs"]:
        xs = [i * every for i in range(len(r["train_loss"]))]
        ax.plot(xs, r["train_loss"], label=f"{r['preset']} (val gap {r['val_loss_gap']:+.2%})", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    c = record["config"]
    family = "Llama (HF)" if c["activation"] == "swiglu" else "GPT"
    ax.set_title(f"{c['model']}-size {c['activation']} {family}: activation-cache presets")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
