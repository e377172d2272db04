"""The reference GPT split into pipeline stages, with a compressor at every stage boundary.

``build_stages(cfg, n_stages, compressor, ratio, seed)`` returns one module per stage. Stage 0 takes the token
ids ``idx`` (int64, batch x seq) and the last stage returns the logits; every other input and output is the
message of a boundary (a tensor for ``dense``, a dict of tensors otherwise: see
:mod:`actzip.wire.boundary`). Blocks are split as evenly as possible, earlier stages taking the extra ones.

A runner moving messages between processes does, per boundary::

    out = stage_i(inp)                         # keep `out` for the backward
    msg = stage_i.wire_encode(out)             # what goes on the link (RVQ: indices instead of the code)
    ...send msg...
    inp = stage_j.wire_decode(received)        # the receiver rebuilds what the link dropped, checks state
    # mark inp's floating-point tensors requires_grad, run stage_j, and send back their .grad by key;
    # stage_i then calls torch.autograd.backward([out[k] ...], [grad[k] ...]).
    # after a step's last backward, receiver -> sender (a tied Stiefel projection's gradient share):
    stage_i.wire_backward_accept(stage_j.wire_backward_items())
    ...optimizer.step(); stage.after_optimizer_step()   # Stiefel step, codebook update

A receiver that finds its codebook out of sync raises :class:`actzip.codecs.rvq.CodebookDesyncError`; the
runner then calls ``stage_i.request_resync()`` and the next message carries the whole codebook. (actzip's
runner recovers by itself: it decodes that message with the receiver's codebook as it is and asks the sender
for a snapshot with the microbatch's gradient.)
:func:`run_chain` does all of this in one process (tests, single-process studies) and meters the bytes;
:func:`exchange_backward` does the step's receiver-to-sender hand-over after the backward.

Weights: the stages hold the modules of one ``GPT(cfg)`` built under ``seed``, so for ``dense`` the chained
stages compute exactly the unsplit model's logits. With ``tie_weights`` the output head becomes a copy of the
token embedding (same initial values) when there is more than one stage: each stage owns its parameters, so
nothing has to be exchanged between stages besides the messages and their gradients.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from actzip.codecs.rvq import RVQConfig
from actzip.errors import ConfigError
from actzip_bench.models.gpt import GPT, GPTConfig
from actzip.wire.boundary import (
    BottleneckConfig,
    BoundaryConfig,
    DenseConfig,
    StiefelConfig,
    SubspaceConfig,
    SubspaceEmbedding,
    SubspaceLinear,
    code_width,
    id_bytes,
    make_boundary,
)

__all__ = ["COMPRESSORS", "Stage", "WireMeter", "boundary_config", "build_stages", "exchange_backward", "run_chain"]

COMPRESSORS = ("dense", "subspace", "bottleneck", "stiefel", "stiefel-rvq")


def boundary_config(
    compressor: str,
    cfg: GPTConfig,
    ratio: float = 1.0,
    seed: int = 0,
    act_dtype: torch.dtype = torch.float32,
    **overrides,
) -> BoundaryConfig:
    """The boundary config of ``compressor`` for the GPT ``cfg`` at forward compression ``ratio``.

    The code width follows :func:`actzip.wire.boundary.code_width` (side channel included). For
    ``stiefel-rvq`` the projection width is ``n_embd / 16`` (at least 1) and the number of RVQ levels (256
    rows, one byte each, unless ``rvq_codebook_size`` says otherwise) fills the byte budget left after the
    token ids (at least 1, at most 16).
    ``overrides`` replace config fields (``rvq_`` prefixed names go to the RVQ config).
    """
    if compressor not in COMPRESSORS:
        raise ConfigError(f"compressor {compressor!r} is unknown; choose one of {list(COMPRESSORS)}")
    d = cfg.n_embd
    rvq_over = {k[4:]: v for k, v in overrides.items() if k.startswith("rvq_")}
    overrides = {k: v for k, v in overrides.items() if not k.startswith("rvq_")}
    if rvq_over:
        fields = {f.name for f in dataclasses.fields(RVQConfig)} - {"dim"}
        if compressor != "stiefel-rvq" or set(rvq_over) - fields:
            raise ConfigError(
                f"boundary_config: options {sorted('rvq_' + k for k in rvq_over)} need compressor 'stiefel-rvq' "
                f"and names among {sorted('rvq_' + f for f in fields)}"
            )
    code_dtype = overrides.get("code_dtype")
    common = {"n_embd": d, "seed": seed}
    if compressor == "dense":
        out: BoundaryConfig = DenseConfig(**common)
    elif compressor == "bottleneck":
        out = BottleneckConfig(width=code_width(d, ratio, dense_dtype=act_dtype, code_dtype=code_dtype), **common)
    else:
        vocab = {"vocab_size": cfg.vocab_size, "block_size": cfg.block_size}
        side = id_bytes(cfg.vocab_size) if overrides.get("anchor_rank", 1) else 0
        if compressor == "subspace":
            k = code_width(d, ratio, dense_dtype=act_dtype, code_dtype=code_dtype, side_bytes=side)
            out = SubspaceConfig(width=k, **vocab, **common)
        elif compressor == "stiefel":
            k = code_width(d, ratio, dense_dtype=act_dtype, code_dtype=code_dtype, side_bytes=side)
            out = StiefelConfig(width=k, **vocab, **common)
        else:
            if not ratio >= 1.0:
                raise ConfigError(f"compression ratio must be a number >= 1, got {ratio!r}")
            k = int(overrides.get("width", max(1, d // 16)))
            size = int(rvq_over.get("codebook_size", 256))
            bits = RVQConfig(dim=1, codebook_size=size).index_bits
            levels = int(min(16, max(1, (d * act_dtype.itemsize / ratio - side) * 8 // bits)))
            rvq = RVQConfig(**{"dim": k, "levels": levels, "seed": seed, **rvq_over})
            out = StiefelConfig(width=k, rvq=rvq, **vocab, **common)
    if overrides:
        valid = {f.name for f in dataclasses.fields(out)}
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise ConfigError(
                f"boundary_config: {type(out).__name__} has no field(s) {unknown}; valid: {sorted(valid)}"
            )
        if isinstance(out, StiefelConfig) and out.rvq is not None and "width" in overrides:
            overrides["rvq"] = dataclasses.replace(out.rvq, dim=overrides["width"])
        out = dataclasses.replace(out, **overrides)
    return out


def parse_boundary_options(text: str) -> dict:
    """``"anchor_rank=256,lr=1e-4,code_dtype=bfloat16"`` as boundary config overrides (see :func:`boundary_config`):
    ints, floats, ``true``/``false``, dtype names (``bfloat16``, ``float16``, ``float32``), else strings."""
    out: dict = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, eq, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not key.isidentifier() or not raw:
            raise ConfigError(f"boundary option {part!r}: expected name=value (e.g. anchor_rank=256)")
        if raw.lower() in ("true", "false"):
            value: object = raw.lower() == "true"
        elif raw in ("bfloat16", "float16", "float32"):
            value = getattr(torch, raw)
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        out[key] = value
    return out


class _TokenEmbedding(nn.Module):
    """The GPT's input: dropout(token embedding + position embedding), the same ops in the same order."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], dtype=torch.long, device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))


class Stage(nn.Module):
    """One pipeline stage: [embedding | receiver] -> blocks -> [sender | final norm + head]."""

    def __init__(
        self,
        index: int,
        n_stages: int,
        blocks: list[nn.Module],
        gpt_cfg: GPTConfig,
        embed: nn.Module | None = None,
        receiver: nn.Module | None = None,
        sender: nn.Module | None = None,
        head: tuple[nn.Module, nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.index = index
        self.n_stages = n_stages
        self.gpt_config = gpt_cfg
        self.embed = embed
        self.receiver = receiver
        self.blocks = nn.ModuleList(blocks)
        self.sender = sender
        if head is not None:
            self.ln_f, self.lm_head = head

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.n_stages - 1

    def forward(self, inp):
        if self.is_first:
            if not isinstance(inp, torch.Tensor) or inp.dim() != 2:
                got = tuple(inp.shape) if isinstance(inp, torch.Tensor) else type(inp).__name__
                raise ConfigError(f"stage 0 takes token ids of shape (batch, seq), got {got}")
            if inp.shape[1] > self.gpt_config.block_size:
                raise ConfigError(
                    f"stage 0: sequence length {inp.shape[1]} exceeds block_size {self.gpt_config.block_size}"
                )
            x, ids = self.embed(inp), inp
        else:
            x, ids = self.receiver(inp)
        use_ckpt = self.gpt_config.checkpoint_blocks and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if use_ckpt else block(x)
        if self.is_last:
            return self.lm_head(self.ln_f(x))
        return self.sender(x, ids)

    def wire_encode(self, out):
        """What goes on the link for this stage's output (see the module docstring)."""
        return out if self.sender is None else self.sender.wire_encode(out)

    def wire_decode(self, msg, stale_ok: bool = False):
        """This stage's input rebuilt from what arrived on the link (``stale_ok``: see the runner's recovery
        from a codebook desync in :mod:`actzip.wire.pipeline`)."""
        return msg if self.receiver is None else self.receiver.wire_decode(msg, stale_ok)

    @property
    def wire_exact_keys(self) -> tuple[str, ...]:
        """Message items of this stage's boundary ends that must cross bit for bit (codebook and projection
        updates): a runner's lossy byte codec leaves them alone."""
        return tuple(k for end in (self.receiver, self.sender) if end is not None for k in end.exact_keys)

    def wire_backward_items(self) -> dict[str, torch.Tensor]:
        """What this stage's receiver returns to the previous stage once the step's backward is done (a tied
        Stiefel projection's gradient share); send it with the step's last gradient message."""
        return {} if self.receiver is None else self.receiver.wire_backward_items()

    def wire_backward_accept(self, items: dict[str, torch.Tensor]) -> None:
        """Hand what the next stage's :meth:`wire_backward_items` returned to this stage's sender."""
        if self.sender is not None:
            self.sender.wire_backward_accept(items)
        elif items:
            raise ConfigError(f"stage {self.index} has no sender to take {sorted(items)}")

    def after_optimizer_step(self) -> None:
        """Call after every optimizer step: Stiefel steps and codebook updates of this stage's boundary ends."""
        for end in (self.receiver, self.sender):
            if end is not None:
                end.after_optimizer_step()

    def request_resync(self) -> None:
        """The next message of this stage's sender carries its full state (after a desync)."""
        if self.sender is not None:
            self.sender.request_resync()

    def configure_optimizer(self, lr: float = 3e-4, weight_decay: float = 0.1, betas=(0.9, 0.95)):
        """AdamW as :meth:`GPT.configure_optimizer`: decay on tensors with >= 2 dims only.

        Stiefel projections are in the list but never stepped by it: their gradient is taken away as soon as
        it is accumulated and applied on the manifold by :meth:`after_optimizer_step`.
        """
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        fused = bool(params) and all(p.is_cuda for p in params)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def _split(n_layer: int, n_stages: int) -> list[range]:
    base, extra = divmod(n_layer, n_stages)
    out, start = [], 0
    for i in range(n_stages):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def _confine(block: nn.Module, U: torch.Tensor, dropout: float) -> None:
    # Output projections of attention and MLP write U W' h: the residual stream stays in the subspace.
    for owner, drop_name in ((block.attn, "resid_dropout"), (block.mlp, "dropout")):
        lin = owner.c_proj
        owner.c_proj = SubspaceLinear(U, lin.weight, lin.bias, dropout)
        setattr(owner, drop_name, nn.Identity())


def build_stages(
    cfg: GPTConfig,
    n_stages: int,
    compressor: str = "dense",
    ratio: float = 1.0,
    seed: int = 0,
    **options,
) -> list[Stage]:
    """Split ``GPT(cfg)`` (initialized under ``seed``) into ``n_stages`` stages with ``compressor`` boundaries.

    ``compressor``: ``dense | subspace | bottleneck | stiefel | stiefel-rvq``; ``ratio``: forward compression
    (dense bytes per token over code + side-channel bytes per token, float32 activations). ``options``
    override boundary config fields (see :func:`boundary_config`). The global RNG is left as it was.
    """
    if not isinstance(cfg, GPTConfig):
        raise ConfigError(f"build_stages: cfg must be a GPTConfig, got {type(cfg).__name__}")
    if not isinstance(n_stages, int) or isinstance(n_stages, bool) or not 1 <= n_stages <= cfg.n_layer:
        raise ConfigError(f"build_stages: n_stages must be an int in [1, n_layer={cfg.n_layer}], got {n_stages!r}")
    if compressor not in COMPRESSORS:
        raise ConfigError(f"build_stages: compressor {compressor!r} is unknown; choose one of {list(COMPRESSORS)}")
    if n_stages == 1 and compressor != "dense":
        raise ConfigError(f"build_stages: n_stages=1 has no boundary for compressor {compressor!r} to compress")
    bcfg = boundary_config(compressor, cfg, ratio, seed, **options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gpt = GPT(cfg)
        ends = [make_boundary(bcfg) for _ in range(n_stages - 1)]  # learned anchors: seeded too
    blocks = list(gpt.h)
    if cfg.tie_weights and n_stages > 1:
        gpt.lm_head.weight = nn.Parameter(gpt.lm_head.weight.detach().clone())
    embed: nn.Module = _TokenEmbedding(gpt)
    if isinstance(bcfg, SubspaceConfig):
        embed = SubspaceEmbedding(bcfg, dropout=cfg.dropout)
        U = embed.U
        confined = cfg.n_layer if bcfg.confine_last_stage else _split(cfg.n_layer, n_stages)[-1].start
        for block in blocks[:confined]:
            _confine(block, U, cfg.dropout)
    stages = []
    for i, layers in enumerate(_split(cfg.n_layer, n_stages)):
        stages.append(
            Stage(
                i,
                n_stages,
                [blocks[j] for j in layers],
                cfg,
                embed=embed if i == 0 else None,
                receiver=ends[i - 1][1] if i > 0 else None,
                sender=ends[i][0] if i < n_stages - 1 else None,
                head=(gpt.ln_f, gpt.lm_head) if i == n_stages - 1 else None,
            )
        )
    return stages


# ---- one-process chaining ------------------------------------------------------------------------------


@dataclass
class WireMeter:
    """Bytes that crossed each boundary, per direction, and tokens processed (for bytes per token)."""

    fwd_bytes: list[int] = field(default_factory=list)
    bwd_bytes: list[int] = field(default_factory=list)
    tokens: int = 0

    def _grow(self, i: int) -> None:
        while len(self.fwd_bytes) <= i:
            self.fwd_bytes.append(0)
            self.bwd_bytes.append(0)

    def per_token(self) -> dict[str, float]:
        """Mean bytes per token per boundary, each direction."""
        n = max(1, self.tokens) * max(1, len(self.fwd_bytes))
        return {"fwd": sum(self.fwd_bytes) / n, "bwd": sum(self.bwd_bytes) / n}


def message_nbytes(msg) -> int:
    """Bytes of a message: every tensor's elements."""
    tensors = msg.values() if isinstance(msg, dict) else [msg]
    return sum(t.numel() * t.element_size() for t in tensors)


class _Link(torch.autograd.Function):
    # Forward: the receiver's copy; backward: its gradient goes to the sender's tensor, metered.
    @staticmethod
    def forward(ctx, sent, received, meter, boundary):
        ctx.meter, ctx.boundary = meter, boundary
        return received.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.meter is not None:
            ctx.meter.bwd_bytes[ctx.boundary] += grad.numel() * grad.element_size()
        return grad, None, None, None


def _receive(out, msg, meter: WireMeter | None, boundary: int):
    def link(sent, got):
        if isinstance(sent, torch.Tensor) and sent.requires_grad and got.is_floating_point():
            return _Link.apply(sent, got, meter, boundary)
        return got

    if isinstance(msg, dict):
        return {k: link(out.get(k) if isinstance(out, dict) else None, v) for k, v in msg.items()}
    return link(out, msg)


def exchange_backward(stages: list[Stage], meter: WireMeter | None = None) -> None:
    """After the backward of a step chained by :func:`run_chain`: hand every receiver's
    :meth:`Stage.wire_backward_items` to the sender before it (a tied Stiefel projection's gradient), metering
    them as backward bytes. Call it before the optimizer step."""
    for i in range(1, len(stages)):
        items = stages[i].wire_backward_items()
        if meter is not None and items:
            meter._grow(i - 1)
            meter.bwd_bytes[i - 1] += message_nbytes(items)
        stages[i - 1].wire_backward_accept({k: v.detach().clone() for k, v in items.items()})


def run_chain(stages: list[Stage], idx: torch.Tensor, meter: WireMeter | None = None) -> torch.Tensor:
    """Run ``stages`` in order in one process, as a pipeline runner would; returns the logits.

    Each message goes through ``wire_encode``, is copied (the receiver gets detached tensors, as over a link),
    then ``wire_decode``; gradients of the received floating-point tensors flow back to the sender's tensors of
    the same key. ``meter`` counts the bytes in both directions.
    """
    if meter is not None:
        meter.tokens += idx.numel()
        meter._grow(len(stages) - 2)
    inp = idx
    for i, stage in enumerate(stages):
        out = stage(inp)
        if i == len(stages) - 1:
            return out
        msg = stage.wire_encode(out)
        if meter is not None:
            meter.fwd_bytes[i] += message_nbytes(msg)
        copied = {k: v.detach().clone() for k, v in msg.items()} if isinstance(msg, dict) else msg.detach().clone()
        inp = _receive(out, stages[i + 1].wire_decode(copied), meter, i)
    raise ConfigError("run_chain: no stages")
