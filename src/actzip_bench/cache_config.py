"""The activation-cache benchmark's settings: models, strategies and :class:`CacheBenchConfig`.

See :mod:`actzip_bench.cache` for what each model and strategy is and what is measured.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from actzip.errors import ConfigError
from actzip.memory.cache.presets import DEFAULT_MIN_BYTES, PRESETS

MODELS = ("gpt-relu2", "gpt-gelu", "llama-swiglu")
LOSSY_PRESETS = tuple(p for p in PRESETS if p not in ("lossless", "4bit", "2bit"))  # 4bit, 2bit: named below
STRATEGIES = ("none", "checkpoint", "sparse", *LOSSY_PRESETS, "4bit", "2bit", "sketch-d8")
NORMS = "+norms"  # suffix: the strategy with every norm output rebuilt in backward (NormRebuildConfig)
WITH_NORMS = ("4bit+norms", "2bit+norms", "sketch-d8+norms")
# suffix, after "+norms" if any: the GELUs / SiLUs keep their derivative for backward (DerivativeActivationConfig)
DERIVATIVES = "+derivatives"
WITH_DERIVATIVES = ("2bit+derivatives", "2bit+norms+derivatives")
KNOWN_STRATEGIES = (*STRATEGIES, "lossless", *WITH_NORMS, *WITH_DERIVATIVES)
HEAD = "loss head"  # the float32 log-softmax output the cross entropy keeps (tokens x vocab)
LLAMA_VOCAB = 32000  # Llama-2's vocabulary, the Llama model's default
BYTE_VOCAB = 256  # the embedded corpus is bytes: token ids are 0..255

DESCRIPTIONS = {
    "none": "plain PyTorch",
    "checkpoint": "every block checkpointed (recomputed in backward)",
    "sparse": "ActivationCache, default rules: lossless sparse for mostly-zero tensors",
    "lossless": "preset lossless (the default rules)",
    **{p: f"preset {p}: {PRESETS[p].description}" for p in LOSSY_PRESETS},
    "4bit": "preset 4bit: every activation 4-bit but the loss head's (linear inputs and other sr, the rest rn)",
    "2bit": "preset 2bit: 4bit with linear inputs and other 2-bit sr",
    "sketch-d8": "every nn.Linear but the output head saves x S, S random of rank in_features/8",
}
DESCRIPTIONS.update({s: DESCRIPTIONS[s.removesuffix(NORMS)] + "; norm outputs rebuilt in backward, transformers "
                     "RMSNorms swapped for exact lean ones (NormRebuildConfig)" for s in WITH_NORMS})
DESCRIPTIONS.update({s: DESCRIPTIONS[s.removesuffix(DERIVATIVES)] + "; GELUs / SiLUs keep their derivative, a linear "
                     "input to the rules (DerivativeActivationConfig; a model with neither runs its base strategy)" for s in WITH_DERIVATIVES})


def base_strategy(strategy: str) -> str:
    """``strategy`` without its model changes (``+norms``, ``+derivatives``): the cache or checkpointing it runs."""
    return strategy.removesuffix(DERIVATIVES).removesuffix(NORMS)


@dataclass
class CacheBenchConfig:
    """One run of the activation-cache benchmark (defaults: the GPU size)."""

    models: tuple[str, ...] = MODELS  # subset of MODELS
    strategies: tuple[str, ...] = STRATEGIES  # subset of KNOWN_STRATEGIES; must hold "none" (the reference)
    gpt_preset: str = "gpt2-124m"  # reference GPT size (GPTConfig.of_size); the Llama takes its width/depth/heads
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
    # The loss (forward of the whole model) under torch.compile for every strategy: "" (eager), "inductor"
    # (the default backend), "inductor-cudagraphs" (inductor with mode="reduce-overhead": its forward and backward
    # graphs replayed as CUDA graphs, no host work per saved tensor) or "aot_eager" (AOTAutograd without code
    # generation).
    compile: str = ""
    # with compile: every cache writes the quant codec in the graph's own operations, for the compiler to fuse
    # with the producing and consuming kernels (CacheConfig.fuse_compiled) instead of calling a custom op per save
    fuse_compiled: bool = False
    # every strategy's whole training step captured as a CUDA graph (torch.cuda.graph) and its timed steps
    # replays: no host work per saved tensor; the caches graph_safe (CacheConfig.graph_safe), AdamW capturable.
    # The caches refuse rules a graph cannot replay (the sparse codec); the bench refuses the strategies whose
    # step changes the model outside the cache (not_graphed); peaks are not measured (the graphs' memory pool),
    # the bytes come from the eager probe as always
    graphs: bool = False

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
        if self.compile not in COMPILE_MODES:
            raise ConfigError(f"cache bench: compile must be one of {list(COMPILE_MODES)}, got {self.compile!r}")
        bad = [s for s in self.strategies if not_graphed(s)] if self.graphs else []
        if self.graphs and (self.compile or bad):
            raise ConfigError(f"cache bench: graphs runs eager steps (no compile), got compile={self.compile!r}; "
                              + "; ".join(f"{s}: {not_graphed(s)}" for s in bad))
        if self.fuse_compiled and not self.compile:
            raise ConfigError("cache bench: fuse_compiled needs compile (it writes the codec into compiled graphs)")
        if not 0 < self.sketch_ratio <= 1:
            raise ConfigError(f"cache bench: sketch_ratio must be in (0, 1], got {self.sketch_ratio!r}")


COMPILE_MODES = ("", "inductor", "inductor-cudagraphs", "aot_eager")  # CacheBenchConfig.compile


def not_graphed(strategy: str) -> str | None:
    """Why a captured graph cannot replay ``strategy``'s step outside its cache (which refuses its own rules),
    or ``None``."""
    if base_strategy(strategy) == "sketch-d8":
        return "the sketch draws its signs on the host, a replay would repeat them"
    if strategy.endswith(DERIVATIVES):
        return "its activations are swapped in for the capture only, a replay would run them after they are gone"
    if strategy.endswith(NORMS):
        return "its norms are swapped in for the capture only, a replay would read them after they are gone"
    return None


# A CPU run of every model and strategy in well under a minute on two cores.
QUICK = {"gpt_preset": "tiny", "seq_len": 64, "batch_size": 4, "vocab_size": BYTE_VOCAB, "rounds": 2, "warmup": 1,
         "min_bytes": 0, "loss_chunk": 128, "corpus_bytes": 200_000}


def with_quick(cfg: CacheBenchConfig, given: set[str] = frozenset()) -> CacheBenchConfig:
    """``cfg`` with the QUICK settings, except the fields in ``given``."""
    return dataclasses.replace(cfg, **{k: v for k, v in QUICK.items() if k not in given})

