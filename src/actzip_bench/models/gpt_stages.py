"""The reference GPT split into :mod:`actzip.wire` stages, with boundary ends at every cut.

:func:`build_gpt_stages` returns one :class:`actzip.wire.Stage` per pipeline stage. Stage 0 takes the token ids
``idx`` (int64, batch x seq) and hands them to its sender as the token-id side channel; the last stage returns
the logits. Every other input and output is a boundary's message (a tensor for ``dense``, a dict of tensors
otherwise: see :mod:`actzip.wire.protocol`). Blocks are split as evenly as possible, earlier stages taking the
extra ones. Each stage's body is a :class:`GPTSlice`: ``[embed] -> blocks -> [ln_f, lm_head]``.

Weights: the stages hold the modules of one ``GPT(cfg)`` built under ``seed``, so for ``dense`` the chained
stages compute exactly the unsplit model's logits and gradients. With ``tie_weights`` the output head becomes a
copy of the token embedding (same initial values) when there is more than one stage: each stage owns its
parameters, so nothing has to be exchanged between stages besides the messages and their gradients. The
boundary ends' own initial values (learned anchors, a subspace embedding) come from ``seed`` too; the caller's
RNG is left as it was.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from actzip.compat import deprecated
from actzip.errors import ConfigError
import actzip.wire as wire
from actzip.wire import Stage, confine_to_subspace, make_boundary
from actzip.wire.boundaries import (
    BoundaryConfig,
    SubspaceConfig,
    SubspaceEmbedding,
    adopt_sublayer,
    parse_boundary,
)
from actzip_bench.models.gpt import GPT, GPTConfig

__all__ = ["BlockHalf", "GPTEmbedding", "GPTSlice", "build_gpt_stages", "confine_gpt_block", "gpt_boundary_config",
           "stage_layers"]  # and, for one release, the old names build_stages, boundary_config, split_gpt


def gpt_boundary_config(boundary: str, cfg: GPTConfig, ratio: float | None = None, seed: int = 0,
                        act_dtype: torch.dtype = torch.float32, **options) -> BoundaryConfig:
    """The config of boundary spec ``boundary`` (``"stiefel:16"``, ``"dense"``, ...) between blocks of the GPT
    ``cfg`` (its width, vocabulary and block size), see :func:`actzip.wire.boundary_config`."""
    return wire.boundary_config(boundary, n_embd=cfg.n_embd, vocab_size=cfg.vocab_size, block_size=cfg.block_size,
                           ratio=ratio, seed=seed, act_dtype=act_dtype, **options)


class GPTEmbedding(nn.Module):
    """The GPT's input: dropout(token embedding + position embedding), the same ops in the same order."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], dtype=torch.long, device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))


class GPTSlice(nn.Module):
    """A run of the GPT's blocks, with its input embedding on the first stage and its head on the last."""

    def __init__(self, blocks: list[nn.Module], cfg: GPTConfig, embed: nn.Module | None = None,
                 head: tuple[nn.Module, nn.Module] | None = None) -> None:
        super().__init__()
        self.gpt_config = cfg
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        if head is not None:
            self.ln_f, self.lm_head = head
        self.has_head = head is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            if not isinstance(x, torch.Tensor) or x.dim() != 2:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ConfigError(f"stage 0 takes token ids of shape (batch, seq), got {got}")
            if x.shape[1] > self.gpt_config.block_size:
                raise ConfigError(
                    f"stage 0: sequence length {x.shape[1]} exceeds block_size {self.gpt_config.block_size}")
            x = self.embed(x)
        use_ckpt = self.gpt_config.checkpoint_blocks and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if use_ckpt else block(x)
        return self.lm_head(self.ln_f(x)) if self.has_head else x


def stage_layers(n_layer: int, n_stages: int) -> list[range]:
    """The blocks of each stage: as even as possible, earlier stages taking the extra ones."""
    base, extra = divmod(n_layer, n_stages)
    out, start = [], 0
    for i in range(n_stages):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def confine_gpt_block(block: nn.Module, U: torch.Tensor, dropout: float, zero_init: bool = False) -> None:
    """Keep a GPT block's residual writes in span(U) (what a ``subspace`` boundary needs): its attention and MLP
    output projections become ``U W'`` (``W'`` from zero with ``zero_init``), their dropout moving onto the k
    coordinates."""
    confine_to_subspace(block, U, ("attn.c_proj", "mlp.c_proj"), dropout, zero_init)
    block.attn.resid_dropout = nn.Identity()
    block.mlp.dropout = nn.Identity()


class BlockHalf(nn.Module):
    """One residual sublayer of a GPT block, ``x + sub(norm(x))``: the half a ``resbm`` bottleneck leaves in the
    stage when its end takes the other half (the sender the last block's MLP, the receiver the next stage's first
    attention)."""

    def __init__(self, norm: nn.Module, sub: nn.Module) -> None:
        super().__init__()
        self.norm, self.sub = norm, sub

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.sub(self.norm(x))


def _resbm_bodies(blocks: list[nn.Module], layers: list[range], ends: list) -> list[list[nn.Module]]:
    """Each stage's blocks with a ``resbm`` bottleneck's ends holding the sublayers they take over."""
    bodies = []
    for i, span in enumerate(layers):
        body = []
        for j in span:
            b = blocks[j]
            takes_attn = i > 0 and j == span.start  # the receiver before this stage decodes into it
            takes_mlp = i < len(layers) - 1 and j == span[-1]  # the sender after it encodes through it
            if takes_attn:
                adopt_sublayer(ends[i - 1][1], nn.Sequential(b.ln_1, b.attn))
            if takes_mlp:
                adopt_sublayer(ends[i][0], nn.Sequential(b.ln_2, b.mlp))
            if not takes_attn and not takes_mlp:
                body.append(b)
            elif not takes_attn:
                body.append(BlockHalf(b.ln_1, b.attn))
            elif not takes_mlp:
                body.append(BlockHalf(b.ln_2, b.mlp))
        bodies.append(body)
    return bodies


def build_gpt_stages(cfg: GPTConfig, n_stages: int, boundary: str = "dense", *, ratio: float | None = None,
                     seed: int = 0, **options) -> list[Stage]:
    """Split ``GPT(cfg)`` (initialized under ``seed``) into ``n_stages`` stages with ``boundary`` ends.

    ``boundary``: a boundary spec (``dense``, ``subspace:100``, ``bottleneck:16``, ``stiefel:16,tie=true``,
    ``stiefel-rvq:100``), its ratio the forward compression (dense bytes per token over code + side-channel
    bytes per token, float32 activations); ``ratio`` gives it apart from the spec. ``options`` override
    boundary config fields (see :func:`actzip.wire.boundary_config`). The global RNG is left as it was.
    """
    if not isinstance(cfg, GPTConfig):
        raise ConfigError(f"build_gpt_stages: cfg must be a GPTConfig, got {type(cfg).__name__}")
    if not isinstance(n_stages, int) or isinstance(n_stages, bool) or not 1 <= n_stages <= cfg.n_layer:
        raise ConfigError(f"build_gpt_stages: n_stages must be an int in [1, n_layer={cfg.n_layer}], got "
                          f"{n_stages!r}")
    if n_stages == 1 and parse_boundary(boundary)[0] != "dense":
        raise ConfigError(f"build_gpt_stages: n_stages=1 has no boundary for {boundary!r} to compress")
    bcfg = gpt_boundary_config(boundary, cfg, ratio, seed, **options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gpt = GPT(cfg)
        ends = [make_boundary(bcfg) for _ in range(n_stages - 1)]  # learned anchors: seeded too
        embed: nn.Module = GPTEmbedding(gpt)
        if isinstance(bcfg, SubspaceConfig):
            embed = SubspaceEmbedding(bcfg, dropout=cfg.dropout)
    blocks = list(gpt.h)
    if cfg.tie_weights and n_stages > 1:
        gpt.lm_head.weight = nn.Parameter(gpt.lm_head.weight.detach().clone())
    layers = stage_layers(cfg.n_layer, n_stages)
    if isinstance(bcfg, SubspaceConfig):
        confined = cfg.n_layer if bcfg.confine_last_stage else layers[-1].start
        for block in blocks[:confined]:
            confine_gpt_block(block, embed.U, cfg.dropout, bcfg.proj_init == "zero")
    last = n_stages - 1
    if getattr(bcfg, "style", None) == "resbm":
        bodies = _resbm_bodies(blocks, layers, ends)
    else:
        bodies = [[blocks[j] for j in span] for span in layers]
    return [
        Stage(GPTSlice(bodies[i], cfg, embed=embed if i == 0 else None,
                       head=(gpt.ln_f, gpt.lm_head) if i == last else None),
              sender=ends[i][0] if i < last else None, receiver=ends[i - 1][1] if i > 0 else None,
              input_ids=i == 0)
        for i in range(n_stages)
    ]


def _build_stages(cfg: GPTConfig, n_stages: int, compressor: str = "dense", ratio: float = 1.0, seed: int = 0,
                  **options) -> list[Stage]:
    return build_gpt_stages(cfg, n_stages, compressor, ratio=ratio, seed=seed, **options)


def _boundary_config(compressor: str, cfg: GPTConfig, ratio: float = 1.0, seed: int = 0,
                     act_dtype: torch.dtype = torch.float32, **overrides) -> BoundaryConfig:
    return gpt_boundary_config(compressor, cfg, ratio, seed, act_dtype, **overrides)


def _split_gpt(cfg: GPTConfig, n_stages: int, seed: int = 0) -> list[Stage]:
    if not 2 <= n_stages <= cfg.n_layer:
        raise ConfigError(f"split_gpt: n_stages must be in [2, n_layer={cfg.n_layer}], got {n_stages}")
    return build_gpt_stages(cfg, n_stages, "dense", seed=seed)


# Old names of the two GPT splitters this module replaces, kept for one release.
build_stages = deprecated(_build_stages, "actzip.wire.stages.build_stages",
                          "actzip_bench.models.gpt_stages.build_gpt_stages")
boundary_config = deprecated(_boundary_config, "actzip.wire.stages.boundary_config",
                                     "actzip_bench.models.gpt_stages.gpt_boundary_config")
split_gpt = deprecated(_split_gpt, "actzip_bench.wire.split_gpt", "actzip_bench.models.gpt_stages.build_gpt_stages")
