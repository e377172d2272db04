"""Boundary ends by spec string: ``"dense"``, ``"subspace:100"``, ``"stiefel:16,anchor_rank=256,tie=true"``,
``"pca:16,refresh=8"``.

The grammar is :mod:`actzip.core.spec`'s (``name:option=value,...``), with one shorthand: a first option
without ``=`` is the forward compression ``ratio`` (``"stiefel:16"`` is ``"stiefel:ratio=16"``). Every other
option is a field of the boundary's config (``rvq_`` prefixed names go to the RVQ config of ``stiefel-rvq``);
``bfloat16``, ``float16`` and ``float32`` as values are those dtypes (for ``code_dtype``).
"""

from __future__ import annotations

import dataclasses

import torch

from actzip.codecs.rvq import RVQConfig
from actzip.core.spec import format_spec, parse_spec
from actzip.errors import ConfigError
from actzip.wire.boundaries.bottleneck import BottleneckReceiver, BottleneckSender
from actzip.wire.boundaries.config import (
    BottleneckConfig,
    BoundaryConfig,
    DenseConfig,
    PCAConfig,
    StiefelConfig,
    SubspaceConfig,
    code_width,
)
from actzip.wire.boundaries.dense import DenseReceiver, DenseSender
from actzip.wire.boundaries.ends import BoundaryReceiver, BoundarySender
from actzip.wire.boundaries.principal import PCAReceiver, PCASender
from actzip.wire.boundaries.stiefel import StiefelReceiver, StiefelSender
from actzip.wire.boundaries.subspace import SubspaceReceiver, SubspaceSender
from actzip.wire.protocol import id_bytes

__all__ = ["BOUNDARIES", "boundary_config", "format_boundary", "make_boundary", "parse_boundary",
           "parse_boundary_options"]

BOUNDARIES = ("dense", "subspace", "bottleneck", "stiefel", "stiefel-rvq", "pca")  # boundary spec names
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

_ENDS = {
    "dense": (DenseSender, DenseReceiver),
    "subspace": (SubspaceSender, SubspaceReceiver),
    "bottleneck": (BottleneckSender, BottleneckReceiver),
    "stiefel": (StiefelSender, StiefelReceiver),
    "pca": (PCASender, PCAReceiver),
}


def parse_boundary(text: str) -> tuple[str, dict]:
    """``(name, options)`` of a boundary spec; ``options["ratio"]`` holds the shorthand ratio if one is given."""
    if not isinstance(text, str):
        raise ConfigError(f"boundary spec must be a string like 'stiefel:16', got {type(text).__name__}")
    head, colon, opts = text.partition(":")
    first, comma, rest = opts.partition(",")
    if first.strip() and "=" not in first:
        opts = f"ratio={first.strip()}{comma}{rest}"
    name, options = parse_spec(f"{head}{colon}{opts}")
    if name not in BOUNDARIES:
        raise ConfigError(f"boundary {name!r} (in spec {text!r}) is unknown; choose one of {list(BOUNDARIES)}")
    return name, {k: _DTYPES.get(v, v) if isinstance(v, str) else v for k, v in options.items()}


def parse_boundary_options(text: str) -> dict:
    """Boundary config overrides without a name: ``"anchor_rank=256,lr=1e-4,code_dtype=bfloat16"`` (the spec
    grammar's options, dtype names as dtypes); ``""`` gives ``{}``."""
    _, options = parse_spec(f"options:{text or ''}")
    return {k: _DTYPES.get(v, v) if isinstance(v, str) else v for k, v in options.items()}


def format_boundary(name: str, options: dict | None = None) -> str:
    """The spec string of a boundary, the inverse of :func:`parse_boundary`."""
    opts = {k: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v for k, v in (options or {}).items()}
    return format_spec(name, opts)


def boundary_config(
    spec: str,
    *,
    n_embd: int,
    vocab_size: int = 256,
    block_size: int = 256,
    ratio: float | None = None,
    seed: int = 0,
    act_dtype: torch.dtype = torch.float32,
    **overrides,
) -> BoundaryConfig:
    """The config of boundary ``spec`` at a boundary of width ``n_embd`` (token ids below ``vocab_size``,
    sequences up to ``block_size``).

    The code width follows :func:`~actzip.wire.boundaries.config.code_width` at the forward compression ratio
    (the spec's, else ``ratio``, else 1), side channel included. For ``stiefel-rvq`` the projection width is
    ``n_embd / 16`` (at least 1) and the number of RVQ levels (256 rows, one byte each, unless
    ``rvq_codebook_size`` says otherwise) fills the byte budget left after the token ids (1 to 16).
    ``overrides`` (and the spec's other options) replace config fields.
    """
    name, options = parse_boundary(spec)
    twice = sorted(set(options) & set(overrides))
    if twice:
        raise ConfigError(f"boundary_config: {twice} given both in the spec {spec!r} and as arguments")
    options.update(overrides)
    if "ratio" in options:
        if ratio is not None:
            raise ConfigError(f"boundary_config: the ratio is given both in the spec {spec!r} and as ratio=")
        ratio = options.pop("ratio")
    ratio = 1.0 if ratio is None else ratio
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio >= 1.0:
        raise ConfigError(f"compression ratio must be a number >= 1, got {ratio!r}")
    ratio = float(ratio)
    d = n_embd
    rvq_over = {k[4:]: v for k, v in options.items() if k.startswith("rvq_")}
    options = {k: v for k, v in options.items() if not k.startswith("rvq_")}
    if rvq_over:
        fields = {f.name for f in dataclasses.fields(RVQConfig)} - {"dim"}
        if name != "stiefel-rvq" or set(rvq_over) - fields:
            raise ConfigError(
                f"boundary_config: options {sorted('rvq_' + k for k in rvq_over)} need boundary 'stiefel-rvq' "
                f"and names among {sorted('rvq_' + f for f in fields)}"
            )
    code_dtype = options.get("code_dtype")
    common = {"n_embd": d, "seed": seed}
    if name == "dense":
        out: BoundaryConfig = DenseConfig(**common)
    elif name == "bottleneck":
        out = BottleneckConfig(width=code_width(d, ratio, dense_dtype=act_dtype, code_dtype=code_dtype), **common)
    elif name == "pca":
        out = PCAConfig(width=code_width(d, ratio, dense_dtype=act_dtype, code_dtype=code_dtype), **common)
    else:
        vocab = {"vocab_size": vocab_size, "block_size": block_size}
        side = id_bytes(vocab_size) if options.get("anchor_rank", 1) else 0
        if name == "subspace":
            k = code_width(d, ratio, dense_dtype=act_dtype, code_dtype=code_dtype, side_bytes=side)
            out = SubspaceConfig(width=k, **vocab, **common)
        elif name == "stiefel":
            k = code_width(d, ratio, dense_dtype=act_dtype, code_dtype=code_dtype, side_bytes=side)
            out = StiefelConfig(width=k, **vocab, **common)
        else:
            k = int(options.get("width", max(1, d // 16)))
            size = int(rvq_over.get("codebook_size", 256))
            bits = RVQConfig(dim=1, codebook_size=size).index_bits
            levels = int(min(16, max(1, (d * act_dtype.itemsize / ratio - side) * 8 // bits)))
            rvq = RVQConfig(**{"dim": k, "levels": levels, "seed": seed, **rvq_over})
            out = StiefelConfig(width=k, rvq=rvq, **vocab, **common)
    if options:
        valid = {f.name for f in dataclasses.fields(out)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ConfigError(
                f"boundary_config: {type(out).__name__} has no field(s) {unknown}; valid: {sorted(valid)}"
            )
        if isinstance(out, StiefelConfig) and out.rvq is not None and "width" in options:
            options["rvq"] = dataclasses.replace(out.rvq, dim=options["width"])
        out = dataclasses.replace(out, **options)
    return out


def make_boundary(cfg: BoundaryConfig) -> tuple[BoundarySender, BoundaryReceiver]:
    """The sender and receiver modules of one boundary."""
    if not isinstance(cfg, BoundaryConfig) or cfg.kind not in _ENDS:
        raise ConfigError(f"make_boundary: expected a config of one of {sorted(_ENDS)}, got {cfg!r}")
    sender, receiver = _ENDS[cfg.kind]
    return sender(cfg), receiver(cfg)
