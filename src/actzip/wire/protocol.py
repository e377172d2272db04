"""What a boundary message carries besides its code: the config header, and the token ids packed small.

A sender's message is a tensor (``dense``) or a dict of tensors. In a dict,

- ``code`` (batch, seq, width) is the compressed activation. It is the only tensor that carries a gradient
  back: the receiver's gradient with respect to ``code`` has the code's shape and dtype, so the backward pass is
  compressed by the same factor as the forward pass;
- ``ids`` are the token ids (one byte each up to 256 tokens, two up to 65,536: :func:`id_bytes`), a forward-only
  side channel from which the receiver rebuilds token-specific full-rank signal (``subspace``, ``stiefel``);
- ``cfg`` holds one 31-bit hash per config field the two ends must agree on (4 bytes each, per message). The
  receiver compares them with its own (:func:`check_header`) and raises :class:`~actzip.errors.ConfigError`
  naming the fields that differ;
- boundary-specific state (``rvq_*``, ``v_sync``, ...) that both ends must hold bit for bit.
"""

from __future__ import annotations

import hashlib

import torch

from actzip.errors import ConfigError

__all__ = ["check_header", "header", "id_bytes", "pack_ids", "unpack_ids"]

KINDS = ("dense", "subspace", "bottleneck", "stiefel", "pca")  # boundary kinds a header can name in an error


def id_bytes(vocab_size: int) -> int:
    """Bytes per token id on the wire: 1 up to 256 tokens, 2 up to 65,536, else 4."""
    return 1 if vocab_size <= 256 else 2 if vocab_size <= 1 << 16 else 4


def pack_ids(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token ids in the fewest bytes that hold ``vocab_size`` values."""
    n = id_bytes(vocab_size)
    if n == 1:
        return ids.to(torch.uint8)
    if n == 2:
        return (ids - 32768).to(torch.int16)  # the offset fits 0..65535 into int16
    return ids.to(torch.int32)


def unpack_ids(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The int64 token ids :func:`pack_ids` packed."""
    ids = packed.long()
    return ids + 32768 if id_bytes(vocab_size) == 2 else ids


def _hash31(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


_KNOWN = {_hash31(f"boundary={name!r}"): name for name in KINDS}


def header(fields: list[tuple[str, object]]) -> tuple[list[str], torch.Tensor]:
    """The names and int32 hashes of ``(name, value)`` fields (the boundary's kind first, named ``boundary``)."""
    return [n for n, _ in fields], torch.tensor([_hash31(f"{n}={v!r}") for n, v in fields], dtype=torch.int32)


def check_header(cfg, names: list[str], mine: torch.Tensor, got: torch.Tensor) -> None:
    """Raise a :class:`ConfigError` naming the fields in which the sender's header ``got`` differs from ``mine``."""
    theirs = got.tolist()  # a small host read per message
    own = mine.tolist()
    if theirs == own:
        return
    if not theirs or theirs[0] != own[0]:
        sender = _KNOWN.get(theirs[0] if theirs else -1, "another boundary")
        raise ConfigError(
            f"wire boundary: the sender is a {sender!r} boundary but the receiver is {cfg.kind!r}; "
            "build both ends of a boundary from the same config"
        )
    if len(theirs) != len(own):
        raise ConfigError(f"wire boundary ({cfg.kind}): the sender's config has {len(theirs)} shared fields, "
                          f"the receiver's {len(own)}; build both ends from the same config")
    bad = [n for n, a, b in zip(names, theirs, own) if a != b]
    raise ConfigError(
        f"wire boundary ({cfg.kind}): the sender's and receiver's configs differ in {bad}; the receiver has "
        + ", ".join(f"{n}={getattr(cfg, n, None)!r}" for n in bad if "." not in n)
        + "; build both ends of a boundary from the same config"
    )
