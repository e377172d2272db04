"""The activation-cache benchmark's strategies: what each one changes in a step on the shared model."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.nn as nn

from actzip_bench.cache_config import DERIVATIVES, NORMS, CacheBenchConfig, base_strategy
from actzip_bench.cache_models import BenchModel


def strategy_rules(name: str, cfg: CacheBenchConfig):
    """The cache rules of strategy ``name`` (``None``: the strategy runs without a cache)."""
    from actzip.memory.cache import CacheConfig, default_rules, preset_rules

    name = base_strategy(name)
    if name in ("none", "checkpoint", "sketch-d8"):
        return None
    if name == "sparse":
        return default_rules(CacheConfig(min_bytes=cfg.min_bytes))
    opts = {"min_bytes": cfg.min_bytes, "group_size": cfg.group_size, "seed": cfg.seed}
    return preset_rules(name, **opts)


class Strategy:
    """How one strategy runs a step on the shared model: modules swapped in, checkpointing, cache."""

    def __init__(self, name: str, cfg: CacheBenchConfig, model: BenchModel, sketched: dict | None, plain: dict | None):
        from actzip.memory.cache import CacheConfig, CacheContext

        self.name, self.model = name, model
        self.rules = strategy_rules(name, cfg)
        # a cache whose rules ask for each tensor's role (the lossy presets') tracks the roles itself
        self.cache = None if self.rules is None else \
            CacheContext(CacheConfig(fuse_compiled=cfg.fuse_compiled, graph_safe=cfg.graphs), rules=self.rules)
        self.swap = (sketched, plain) if base_strategy(name) == "sketch-d8" else None
        self.norms = name.removesuffix(DERIVATIVES).endswith(NORMS)
        self.derivatives = name.endswith(DERIVATIVES)
        self.compiled_cudagraphs = cfg.compile == "inductor-cudagraphs"  # the compiled loss replays CUDA graphs

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

    def forward_context(self, cache=None):
        """``cache`` (default: the strategy's own), or nothing for the strategies without one."""
        cache = cache if cache is not None else self.cache
        return cache if cache is not None else nullcontext()

    def train_step(self, opt, x, y):
        """One training step of the shared model under this strategy's cache (the caller has entered the
        strategy, so its modules are in place): forward, backward, the optimizer's step; the loss, a copy (a CUDA
        graph's output is overwritten by its next replay)."""
        if self.compiled_cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()  # the step before's outputs are no longer read
        with self.forward_context():
            loss = self.model.loss(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if self.cache is not None:
            self.cache.history.clear()
        return loss.detach().clone()

    def prepared(self):
        """What the strategy changes in the model that takes longer than a step should pay for, done before
        its timed step and undone after (the norms' swap and hooks, the activations keeping their derivative), or
        nothing."""
        if not (self.norms or self.derivatives):
            return nullcontext()
        return _model_changed(self.model.module, self.swap[0] if self.swap else None, self.norms, self.derivatives)


@contextmanager
def _model_changed(module: nn.Module, sketched: dict | None, norms: bool, derivatives: bool):
    """``module`` with its activations keeping their derivative (``compress_(..., DerivativeActivationConfig())``)
    and its norm outputs rebuilt in backward (``NormRebuildConfig``), over the sketched layers when the strategy
    sketches (so that the layers hooked are the ones that run); ``restore_`` undoes both after."""
    import actzip
    from actzip.errors import NothingToCompressError
    from actzip.memory.modules import DerivativeActivationConfig, NormRebuildConfig

    if sketched:
        use_modules(module, sketched)
    changed = norms
    if derivatives:
        try:
            actzip.compress_(module, DerivativeActivationConfig())
            changed = True
        except NothingToCompressError:  # no GELU or SiLU (the ReLU² GPT): the strategy's step is its base's
            pass
    if norms:
        actzip.compress_(module, NormRebuildConfig())
    try:
        yield
    finally:
        if changed:
            actzip.restore_(module)


def use_modules(model: nn.Module, modules: dict[str, nn.Module]) -> None:
    """Put each module of ``{dotted name: module}`` in its place in ``model``."""
    for name, mod in modules.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, mod)


def sketch_modules(module: nn.Module, ratio: float, sketch_head: bool = False, seed: int = 0):
    """Swap every nn.Linear of ``module`` (but the output head ``lm_head``, unless ``sketch_head``) for a
    SketchedLinear of rank ``in_features * ratio``; return ``(sketched, plain)``, each ``{name: module}``, so
    that :func:`use_modules` can switch between them."""
    from actzip.api import compress_
    from actzip.errors import NothingToCompressError
    from actzip.memory.modules import SketchedLinearConfig

    keep = lambda mod, name: sketch_head or name.rpartition(".")[2] != "lm_head"  # noqa: E731
    plain = {n: m for n, m in module.named_modules() if n and type(m) is nn.Linear and keep(m, n)}
    try:
        report = compress_(module, SketchedLinearConfig(rank_ratio=ratio, seed=seed), filter_fn=keep)
    except NothingToCompressError:
        return {}, plain
    return {n: module.get_submodule(n) for n, _ in report.swapped}, plain


def sketch_strategy_modules(model: BenchModel, cfg: CacheBenchConfig):
    """(sketched, plain) of the sketch strategy, the plain layers in place."""
    sketched, plain = sketch_modules(model.module, cfg.sketch_ratio, cfg.sketch_head, cfg.seed)
    use_modules(model.module, plain)
    return sketched, plain

