"""Activation-cache benchmark: bytes kept for backward, peak memory and step time, per model and strategy.

Models (``bf16`` by default, sdpa attention, AdamW, one fixed batch of the embedded corpus):

- ``gpt-relu2``, ``gpt-gelu``: the reference GPT (:mod:`actzip_bench.models.gpt`) at ``gpt_preset`` with that MLP
  activation;
- ``llama-swiglu``: a HuggingFace ``LlamaForCausalLM`` built from a local ``LlamaConfig`` of the same width,
  depth and heads (SwiGLU MLP with ``hidden_act="silu"``, intermediate size ``llama_ffn_ratio`` x width,
  RMSNorm, rotary positions, untied output head); nothing is downloaded.

Every model's loss is the same: the output head and a float32 cross entropy over the next byte, computed
``loss_chunk`` tokens at a time with each chunk's logits recomputed in backward (the reference GPT's
``loss_chunk``; :func:`head_loss` for the Llama), so the ``tokens x vocab`` logits do not dominate the peak and
hide what the strategies save. ``loss_chunk=0`` keeps the full float32 log-softmax instead.

Strategies (:data:`STRATEGIES`; every model keeps one set of weights and one optimizer for all of them, and
the strategies only change what is saved for backward):

- ``none``: plain PyTorch; ``checkpoint``: every block recomputed in backward (the GPT's ``checkpoint_blocks``,
  HuggingFace's non-reentrant activation checkpointing);
- ``sparse``: :class:`~actzip.memory.ActivationCache` with its default rules (lossless sparse for mostly-zero
  tensors; the same rules as the ``lossless`` preset, which is accepted as a name too);
- ``conservative``, ``balanced``, ``aggressive``: the presets of :mod:`actzip.memory.presets` (linear inputs at
  8 / 4 / 2 bits), under a :class:`~actzip.memory.RoleTracker`;
- ``4bit``: the ``4bit`` preset, every activation at 4 bits but the loss head's (linear inputs and ``other``
  stochastic, the rest nearest; it opts out of the presets' 8-bit safety rule for nonlinear inputs, as ActNN and GACT do);
- ``2bit``: the ``2bit`` preset, ``4bit`` with linear inputs and ``other`` at 2 bits (stochastic);
- ``sketch-d8``: every ``nn.Linear`` but the output head as :class:`~actzip.memory.SketchedLinear` at rank
  ``in_features / 8`` (CompAct-style: a random sketch of each linear input instead of the input).

Measured per model and strategy:

- bytes: one untimed probe step per strategy, on the same weights, under the strategy's cache (or, for
  ``none`` / ``checkpoint`` / ``sketch-d8``, a count-only cache that stores everything as it is): the distinct
  activation bytes autograd keeps (parameters and inputs excluded; a sketch counts its ``x S``). With
  ``loss_chunk=0`` the loss head's float32 log-softmax output (``tokens x vocab``, kept by every strategy) is
  reported on its own (``head_bytes``), so the ratio over the rest can be read too;
- gradient error: in the same probe step, ``|g - g_none| / |g_none|`` over all parameters, and the cosine;
- step time: forward + backward + AdamW step, CUDA events, median over ``rounds`` after ``warmup``, the
  strategies interleaved round-robin (:func:`actzip_bench.harness.run_interleaved`); the timed steps of
  ``none``, ``checkpoint`` and ``sketch-d8`` run with no cache at all;
- peak: ``torch.cuda.max_memory_allocated`` over the step (weights, gradients, optimizer state and the
  batch included), and ``resident_bytes``, what stays allocated between steps (weights + optimizer state);
- ``last_loss``: the loss of each strategy's last timed step (a sanity check: the weights are shared, so
  these are points of one training run, not separate runs).

On the CPU the same code runs at a tiny size (``QUICK``); time is then wall-clock and there is no peak.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from actzip.errors import ConfigError
from actzip.memory.presets import DEFAULT_MIN_BYTES, PRESETS

MODELS = ("gpt-relu2", "gpt-gelu", "llama-swiglu")
_LOSSY_PRESETS = tuple(p for p in PRESETS if p not in ("lossless", "4bit", "2bit"))  # 4bit, 2bit: named below
STRATEGIES = ("none", "checkpoint", "sparse", *_LOSSY_PRESETS, "4bit", "2bit", "sketch-d8")
KNOWN_STRATEGIES = (*STRATEGIES, "lossless")
HEAD = "loss head"  # the float32 log-softmax output the cross entropy keeps (tokens x vocab)
LLAMA_VOCAB = 32000  # Llama-2's vocabulary, the Llama model's default
BYTE_VOCAB = 256  # the embedded corpus is bytes: token ids are 0..255

DESCRIPTIONS = {
    "none": "plain PyTorch",
    "checkpoint": "every block checkpointed (recomputed in backward)",
    "sparse": "ActivationCache, default rules: lossless sparse for mostly-zero tensors",
    "lossless": "preset lossless (the default rules)",
    **{p: f"preset {p}: {PRESETS[p].description}" for p in _LOSSY_PRESETS},
    "4bit": "preset 4bit: every activation 4-bit but the loss head's (linear inputs and other sr, the rest rn)",
    "2bit": "preset 2bit: 4bit with linear inputs and other 2-bit sr",
    "sketch-d8": "every nn.Linear but the output head saves x S, S random of rank in_features/8",
}


@dataclass
class CacheBenchConfig:
    """One run of the activation-cache benchmark (defaults: the GPU size)."""

    models: tuple[str, ...] = MODELS  # subset of MODELS
    strategies: tuple[str, ...] = STRATEGIES  # subset of KNOWN_STRATEGIES; must hold "none" (the reference)
    gpt_preset: str = "gpt2-124m"  # reference GPT size (GPTConfig preset); the Llama takes its width/depth/heads
    llama_ffn_ratio: float = 8 / 3  # Llama intermediate size = ratio x width, rounded up to a multiple of 32
    llama_kv_heads: int | None = None  # Llama key/value heads (None: one per query head, as in Llama-2 7B)
    vocab_size: int | None = None  # None: each model's own (GPT preset's, 50304 for gpt2-124m; Llama 32000)
    seq_len: int = 1024  # tokens per sequence
    batch_size: int = 32  # sequences per step (32 x 1024, as the GPT benchmark: activations well above the weights)
    # Output head + loss this many tokens at a time, each chunk's logits recomputed in backward (the GPT's
    # loss_chunk; the same code for the Llama). 0: full float32 logits over the vocabulary, kept for backward
    # by every strategy alike (reported apart as the loss head).
    loss_chunk: int = 4096
    dtype: str = "bfloat16"  # weights and activations
    lr: float = 1e-4  # AdamW learning rate of the shared training run
    rounds: int = 10  # measured steps per strategy
    warmup: int = 3  # interleaved steps dropped first
    group_size: int = 128  # quantization group of the lossy strategies (4-bit: 4.5 bits per element)
    min_bytes: int = DEFAULT_MIN_BYTES  # tensors below this are kept by every cache (tiny models need 0)
    sketch_ratio: float = 1 / 8  # sketch rank = round(in_features x ratio)
    sketch_head: bool = False  # also sketch the output head's input
    corpus_bytes: int = 4_000_000  # bytes of the embedded corpus read
    seed: int = 0

    def __post_init__(self) -> None:
        self.models, self.strategies = tuple(self.models), tuple(self.strategies)
        bad = [m for m in self.models if m not in MODELS]
        if bad or not self.models:
            raise ConfigError(f"cache bench: unknown or no models {bad}; choose from {list(MODELS)}")
        bad = [s for s in self.strategies if s not in KNOWN_STRATEGIES]
        if bad:
            raise ConfigError(f"cache bench: unknown strategies {bad}; choose from {list(KNOWN_STRATEGIES)}")
        if "none" not in self.strategies:
            raise ConfigError("cache bench: strategies must include 'none', the reference of every ratio")
        if len(set(self.strategies)) != len(self.strategies):
            raise ConfigError(f"cache bench: strategies repeat: {list(self.strategies)}")
        for name in ("seq_len", "batch_size", "rounds", "group_size", "corpus_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"cache bench: {name} must be a positive int, got {v!r}")
        for name in ("warmup", "min_bytes", "loss_chunk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"cache bench: {name} must be an int >= 0, got {v!r}")
        if self.vocab_size is not None and self.vocab_size < BYTE_VOCAB:
            raise ConfigError(f"cache bench: vocab_size must be >= {BYTE_VOCAB} (the corpus is bytes), got {self.vocab_size}")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ConfigError(f"cache bench: dtype must be bfloat16, float16 or float32, got {self.dtype!r}")
        if not 0 < self.sketch_ratio <= 1:
            raise ConfigError(f"cache bench: sketch_ratio must be in (0, 1], got {self.sketch_ratio!r}")


# A CPU run of every model and strategy in well under a minute on two cores.
QUICK = {"gpt_preset": "tiny", "seq_len": 64, "batch_size": 4, "vocab_size": BYTE_VOCAB, "rounds": 2, "warmup": 1,
         "min_bytes": 0, "loss_chunk": 128, "corpus_bytes": 200_000}


# -- models ---------------------------------------------------------------------------------------------------


@dataclass
class _Model:
    name: str
    module: nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, y) -> scalar loss
    set_checkpoint: Callable[[bool], None]
    vocab_size: int
    describe: dict


def _gpt(name: str, cfg: CacheBenchConfig) -> _Model:
    from actzip_bench.models import GPT, GPTConfig

    over = {"vocab_size": cfg.vocab_size} if cfg.vocab_size else {}
    gc_ = GPTConfig.preset(cfg.gpt_preset, activation=name.split("-", 1)[1], block_size=cfg.seq_len,
                           loss_chunk=cfg.loss_chunk, **over)
    model = GPT(gc_)

    def set_checkpoint(on: bool) -> None:
        model.config.checkpoint_blocks = on

    info = {"family": "reference GPT", "preset": cfg.gpt_preset, "activation": gc_.activation, "n_layer": gc_.n_layer,
            "n_embd": gc_.n_embd, "n_head": gc_.n_head, "mlp_hidden": gc_.mlp_ratio * gc_.n_embd}
    return _Model(name, model, lambda x, y: model(x, y)[1], set_checkpoint, gc_.vocab_size, info)


def _llama(cfg: CacheBenchConfig) -> _Model:
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise ConfigError(f"cache bench: the llama-swiglu model needs transformers ({e})") from None
    from actzip_bench.models import GPTConfig

    g = GPTConfig.preset(cfg.gpt_preset)
    ffn = 32 * math.ceil(cfg.llama_ffn_ratio * g.n_embd / 32)
    kv = cfg.llama_kv_heads or g.n_head
    if g.n_head % kv:
        raise ConfigError(f"cache bench: llama_kv_heads {kv} must divide the {g.n_head} query heads")
    config = LlamaConfig(vocab_size=cfg.vocab_size or LLAMA_VOCAB, hidden_size=g.n_embd, intermediate_size=ffn,
                         num_hidden_layers=g.n_layer, num_attention_heads=g.n_head, num_key_value_heads=kv,
                         max_position_embeddings=cfg.seq_len, hidden_act="silu", tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    model.train()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})  # installs the checkpoint function; the flags below switch it per step
    flags = [m for m in model.modules() if isinstance(getattr(m, "gradient_checkpointing", None), bool)]

    def set_checkpoint(on: bool) -> None:
        for m in flags:
            m.gradient_checkpointing = on

    set_checkpoint(False)
    info = {"family": "HF LlamaForCausalLM", "n_layer": g.n_layer, "n_embd": g.n_embd, "n_head": g.n_head,
            "n_kv_head": kv, "mlp_hidden": ffn, "activation": "silu (SwiGLU)", "attention": "sdpa"}

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = model.model(input_ids=x, use_cache=False).last_hidden_state
        return head_loss(model.lm_head, h, y, cfg.loss_chunk)

    return _Model("llama-swiglu", model, loss, set_checkpoint, config.vocab_size, info)


def _loss_sum(head: nn.Module, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(h).float(), y, reduction="sum")  # float32 log-softmax, as the GPT's head


def head_loss(head: nn.Module, h: torch.Tensor, y: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean cross entropy of ``head(h)`` against ``y``, as the reference GPT computes it (``loss_chunk``)."""
    h, y = h.reshape(-1, h.size(-1)), y.reshape(-1)
    if not chunk:
        return _loss_sum(head, h, y) / y.numel()
    total = h.new_zeros((), dtype=torch.float32)
    for i in range(0, h.size(0), chunk):
        total = total + checkpoint(_loss_sum, head, h[i:i + chunk], y[i:i + chunk], use_reentrant=False)
    return total / y.numel()


def build_model(name: str, cfg: CacheBenchConfig, device: torch.device) -> _Model:
    torch.manual_seed(cfg.seed)
    m = _llama(cfg) if name == "llama-swiglu" else _gpt(name, cfg)
    m.module.to(device=device, dtype=getattr(torch, cfg.dtype))
    return m


def _adamw(model: nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW, weight decay on matrices and embeddings only (as the reference GPT's optimizer)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=all(p.is_cuda for p in params))


# -- strategies -----------------------------------------------------------------------------------------------


def strategy_rules(name: str, cfg: CacheBenchConfig):
    """The cache rules of strategy ``name`` (``None``: the strategy runs without a cache)."""
    from actzip.memory import default_rules, preset_rules
    from actzip.memory.rules import CacheConfig

    if name in ("none", "checkpoint", "sketch-d8"):
        return None
    if name == "sparse":
        return default_rules(CacheConfig(min_bytes=cfg.min_bytes))
    opts = {"min_bytes": cfg.min_bytes, "group_size": cfg.group_size, "seed": cfg.seed}
    return preset_rules(name, **opts)


class _Strategy:
    """How one strategy runs a step on the shared model: modules swapped in, checkpointing, cache."""

    def __init__(self, name: str, cfg: CacheBenchConfig, model: _Model, sketched: dict | None, plain: dict | None):
        from actzip.memory import ActivationCache

        self.name, self.model = name, model
        self.rules = strategy_rules(name, cfg)
        self.cache = None if self.rules is None else ActivationCache(rules=self.rules)
        self.tracked = name in (*_LOSSY_PRESETS, "4bit", "2bit")  # rules that ask for each tensor's role
        self.swap = (sketched, plain) if name == "sketch-d8" else None

    def __enter__(self):
        if self.swap:
            use_modules(self.model.module, self.swap[0])
        if self.name == "checkpoint":
            self.model.set_checkpoint(True)
        return self

    def __exit__(self, *exc) -> None:
        if self.swap:
            use_modules(self.model.module, self.swap[1])
        if self.name == "checkpoint":
            self.model.set_checkpoint(False)

    def forward_context(self, cache=None) -> ExitStack:
        """Role tracking (when the rules need it) and ``cache`` (default: the strategy's own)."""
        from actzip.memory import RoleTracker

        stack = ExitStack()
        cache = cache if cache is not None else self.cache
        if self.tracked and cache is not None:
            stack.enter_context(RoleTracker())
        stack.enter_context(cache if cache is not None else nullcontext())
        return stack


def use_modules(model: nn.Module, modules: dict[str, nn.Module]) -> None:
    """Put each module of ``{dotted name: module}`` in its place in ``model``."""
    for name, mod in modules.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, mod)


def sketch_modules(module: nn.Module, ratio: float, sketch_head: bool = False, seed: int = 0):
    """Swap every nn.Linear of ``module`` (but the output head ``lm_head``, unless ``sketch_head``) for a
    SketchedLinear of rank ``in_features * ratio``; return ``(sketched, plain)``, each ``{name: module}``, so
    that :func:`use_modules` can switch between them."""
    from actzip.memory import sketch_linears_

    keep = lambda name, mod: sketch_head or name.rpartition(".")[2] != "lm_head"  # noqa: E731
    plain = {n: m for n, m in module.named_modules() if n and type(m) is nn.Linear and keep(n, m)}
    names = sketch_linears_(module, rank_ratio=ratio, filter_fn=keep, seed=seed)
    return {n: module.get_submodule(n) for n in names}, plain


def _sketch_modules(model: _Model, cfg: CacheBenchConfig):
    """(sketched, plain) of the sketch strategy, the plain layers in place."""
    sketched, plain = sketch_modules(model.module, cfg.sketch_ratio, cfg.sketch_head, cfg.seed)
    use_modules(model.module, plain)
    return sketched, plain


# -- measurement ----------------------------------------------------------------------------------------------


def _probe(strategies: dict[str, _Strategy], model: _Model, x, y, tokens: int, batch: int) -> dict[str, dict]:
    """One untimed step per strategy on the same weights: bytes by rule, loss-head bytes, gradient error."""
    from actzip.memory import ActivationCache, Rule, count_only_rules

    params = [(n, p) for n, p in model.module.named_parameters() if p.requires_grad]
    vocab = model.vocab_size
    out, ref = {}, None
    for name, s in strategies.items():  # "none" first
        head: list[int] = []

        def observe(t: torch.Tensor, head: list[int] = head) -> bool:  # sees every new saved tensor, never decides
            full = t.dim() >= 1 and t.shape[-1] == vocab and t.numel() >= (tokens - batch) * vocab
            if full and t.dtype == torch.float32:
                head.append(t.numel() * t.element_size())
            return False

        rules = s.rules if s.rules is not None else count_only_rules()
        cache = ActivationCache(rules=[Rule(f"observe {HEAD}", observe), *rules])
        for _, p in params:
            p.grad = None
        with s:
            with s.forward_context(cache):
                loss = model.loss(x, y)
            loss.backward()
        acc = cache.last
        rec = {"bytes_dense": acc.bytes_before, "bytes_saved": acc.bytes_after, "head_bytes": sum(head),
               "duplicates": acc.duplicates, "probe_loss": float(loss.detach()),
               "by_rule": {k: vars(v).copy() for k, v in acc.by_rule.items()}}
        if ref is None:
            ref = [None if p.grad is None else p.grad.detach().clone() for _, p in params]
        else:
            sums = torch.zeros(4, dtype=torch.float64, device=x.device)  # |b - a|², |a|², a·b, |b|²; one sync
            for (_, p), g0 in zip(params, ref):
                if g0 is None:
                    continue
                a, b = g0.float(), (torch.zeros_like(g0) if p.grad is None else p.grad).float()
                sums += torch.stack([((b - a) ** 2).sum(), (a * a).sum(), (a * b).sum(), (b * b).sum()]).double()
            num, den, dot, nrm = sums.tolist()
            rec["grad_rel_error"] = math.sqrt(num / den) if den else None
            rec["grad_cosine"] = dot / math.sqrt(den * nrm) if den and nrm else None
        out[name] = rec
    out["none"].update(grad_rel_error=0.0, grad_cosine=1.0)
    for _, p in params:
        p.grad = None
    return out


def run_model(name: str, cfg: CacheBenchConfig, device: torch.device, corpus, progress=None) -> dict:
    from actzip_bench.harness import run_interleaved

    model = build_model(name, cfg, device)
    n_params = sum(p.numel() for p in model.module.parameters())
    opt = _adamw(model.module, cfg.lr)
    sketched, plain = _sketch_modules(model, cfg) if "sketch-d8" in cfg.strategies else (None, None)
    order = ["none", *[s for s in cfg.strategies if s != "none"]]
    strategies = {s: _Strategy(s, cfg, model, sketched, plain) for s in order}
    g = torch.Generator().manual_seed(cfg.seed)
    x, y = corpus.get_batch("train", cfg.batch_size, cfg.seq_len, generator=g, device=device)
    tokens = cfg.batch_size * cfg.seq_len

    probes = _probe(strategies, model, x, y, tokens, cfg.batch_size)
    last_loss: dict[str, torch.Tensor] = {}

    def step(s: _Strategy) -> None:
        with s:
            with s.forward_context():
                loss = model.loss(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if s.cache is not None:
            s.cache.history.clear()
        last_loss[s.name] = loss.detach()

    # The harness collects garbage before every step; with transformers and torch's compiler stack imported a
    # full collection takes a few hundred ms. Freezing what exists now leaves only the steps' own garbage to it.
    gc.collect()
    gc.freeze()
    try:
        results = run_interleaved({n: (lambda s=s: step(s)) for n, s in strategies.items()}, device,
                                  rounds=cfg.rounds, warmup=cfg.warmup, progress=progress)
    finally:
        gc.unfreeze()
    gc.collect()
    resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    base, pnone = results["none"], probes["none"]
    runs = []
    for n in cfg.strategies:
        r, p = results[n], probes[n]
        head = p["head_bytes"]
        rest_none, rest = pnone["bytes_saved"] - pnone["head_bytes"], p["bytes_saved"] - head
        runs.append({
            "strategy": n, **{k: v for k, v in p.items() if k != "by_rule"},
            "x_smaller": pnone["bytes_saved"] / p["bytes_saved"] if p["bytes_saved"] else None,
            "x_smaller_without_head": rest_none / rest if rest > 0 else None,
            **r.summary(),
            "time_vs_none": r.median_ms / base.median_ms,
            "peak_vs_none": r.peak_bytes / base.peak_bytes if r.peak_bytes and base.peak_bytes else None,
            "last_loss": float(last_loss[n]),
            "by_rule": p["by_rule"],
        })
    record = {"model": name, **model.describe, "params": n_params, "vocab_size": model.vocab_size,
              "seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "tokens_per_step": tokens,
              "resident_bytes": resident, "runs": runs}
    return record


def run_cache(cfg: CacheBenchConfig, device: torch.device, progress=None) -> dict:
    """Every model of ``cfg`` under every strategy; see the module docstring for what is measured."""
    from actzip_bench.harness import machine_record
    from actzip_bench.data import Corpus
    from actzip.kernels import runtime

    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    before = runtime.fallback_counts()
    models = []
    for m in cfg.models:
        models.append(run_model(m, cfg, device, corpus, progress=progress))
        gc.collect()  # the model, its optimizer and caches are gone: give their memory back before the next
        if device.type == "cuda":
            torch.cuda.empty_cache()
    after = runtime.fallback_counts()
    fallbacks = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    record = {"config": asdict(cfg), "strategies": {s: DESCRIPTIONS[s] for s in cfg.strategies}, "models": models,
              "kernel_fallbacks": fallbacks, "machine": machine_record(device)}
    record["targets"] = [{**t, "line": format_target(t)} for t in evaluate_targets(record)]
    return record


# -- targets --------------------------------------------------------------------------------------------------

# (key, strategies it applies to, models it applies to (None: all), text)
TARGETS = (
    ("cache_4bit_x", ("balanced", "4bit"), None, "4-bit: activation cache >= 3.5x smaller than bf16 (none)"),
    ("peak_4bit_llama", ("balanced", "4bit"), ("llama-swiglu",), "4-bit: peak memory of the Llama-style model >= 30% lower"),
    ("time_4bit", ("balanced", "4bit"), None, "4-bit: step overhead <= 5%"),
    ("peak_sketch", ("sketch-d8",), None, "sketch d/8: peak memory >= 25% lower (CompAct reports 25-30%)"),
    ("cache_2bit_x", ("aggressive", "2bit"), None, "2-bit: activation cache vs ActNN's 12x (over fp32, ~6x over bf16)"),
)


def evaluate_targets(record: dict) -> list[dict]:
    """One entry per (target, model, strategy) measured: the figure, the threshold and whether it is met."""
    timed_on_gpu = bool(record.get("machine", {}).get("gpu"))  # CPU wall-clock says nothing about the H200
    out = []
    for key, strategies, models, text in TARGETS:
        for m in record["models"]:
            if models is not None and m["model"] not in models:
                continue
            for r in m["runs"]:
                if r["strategy"] not in strategies:
                    continue
                if key.startswith("cache"):
                    value, threshold = r["x_smaller"], (3.5 if key == "cache_4bit_x" else 6.0)
                    met = None if value is None else value >= threshold
                    extra = {"without_head": r["x_smaller_without_head"]} if r["head_bytes"] else {}
                elif key.startswith("peak"):
                    v = r["peak_vs_none"]
                    value, threshold = (None if v is None else 1 - v), (0.30 if key == "peak_4bit_llama" else 0.25)
                    met, extra = (None if value is None else value >= threshold), {}
                else:
                    value, threshold = r["time_vs_none"] - 1, 0.05
                    met, extra = (value <= threshold if timed_on_gpu else None), {}
                out.append({"target": key, "text": text, "model": m["model"], "strategy": r["strategy"],
                            "value": value, "threshold": threshold, "met": met, **extra})
    return out


def format_target(t: dict) -> str:
    """One line: what was asked, what was measured, met or not (``n/a`` where not measured, e.g. on a CPU)."""
    v = t["value"]
    if v is None:
        fig = "not measured"
    elif t["target"].startswith("cache"):
        fig = f"{v:.2f}x (without the loss head {t['without_head']:.2f}x)" if t.get("without_head") else f"{v:.2f}x"
    elif t["target"].startswith("peak"):
        fig = f"{v:.1%} lower"
    else:
        fig = f"{v:+.1%}"
    verdict = "n/a" if t["met"] is None else ("met" if t["met"] else "not met")
    if t["target"] == "cache_2bit_x" and t["met"] is not None:
        verdict = "reaches ActNN's bf16-equivalent 6x" if t["met"] else "below ActNN's bf16-equivalent 6x"
    return f"{t['text']} — {t['model']} / {t['strategy']}: {fig}: {verdict}"


def with_quick(cfg: CacheBenchConfig, given: set[str] = frozenset()) -> CacheBenchConfig:
    """``cfg`` with the QUICK settings, except the fields in ``given``."""
    return dataclasses.replace(cfg, **{k: v for k, v in QUICK.items() if k not in given})


def _gib(b) -> str:
    return "n/a" if b is None else f"{b / 2**30:.2f}"


def render(record: dict) -> list:
    """Rich tables, one per model, and the target lines."""
    from rich.table import Table

    out: list = []
    for m in record["models"]:
        res = "" if m["resident_bytes"] is None else f", resident {_gib(m['resident_bytes'])} GiB"
        t = Table(title=f"{m['model']} ({m['params'] / 1e6:.1f}M params, vocab {m['vocab_size']}), "
                        f"{m['batch_size']} x {m['seq_len']} tokens{res}")
        for col in ("strategy", "saved MiB", "x smaller", "w/o head", "peak GiB", "vs none", "step ms", "vs none",
                    "grad rel err", "last loss"):
            t.add_column(col, justify="left" if col == "strategy" else "right")
        for r in m["runs"]:
            rel = "" if r["peak_vs_none"] is None else f"{r['peak_vs_none'] - 1:+.1%}"
            xb = "n/a" if r["x_smaller_without_head"] is None else f"{r['x_smaller_without_head']:.2f}"
            t.add_row(r["strategy"], f"{r['bytes_saved'] / 2**20:,.1f}", f"{r['x_smaller']:.2f}", xb,
                      _gib(r["peak_bytes"]), rel, f"{r['median_ms']:.1f}", f"{r['time_vs_none'] - 1:+.1%}",
                      f"{r['grad_rel_error']:.3g}", f"{r['last_loss']:.3f}")
        out.append(t)
    out.extend(t["line"] for t in record["targets"])
    return out
