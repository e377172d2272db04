"""The counter-based random generator of stochastic rounding and of the sketch codec's sign matrices.

Random numbers are hashes of element indices under two 32-bit keys, never draws from a device RNG: the PyTorch
code here and the Triton kernels (:mod:`actzip.kernels.quant_bits` mirrors these hashes) make the same numbers,
no host synchronization is needed, and the global RNG is never touched, so compressing activations does not
change a training run's randomness.

Stochastic rounding (the ``quant`` and ``fp8`` codecs): elements ``2p`` and ``2p + 1`` (indices in the padded
group layout: group ``g``, position ``j``, ``i = g * group_size + j``) share one 32-bit hash
``h = pair_hash(lo32(p + k0), k1 ^ mix32(hi32(p)))`` (:func:`pair_hash`, :func:`mix32`) and take its bits 17-31
and 0-14 as 15-bit integers ``r`` (:func:`round_bits`), where ``(k0, k1)`` are the keys :func:`stream_keys`
derives on the host from ``(seed, n)`` for a codec's ``n``-th stochastic encode (``seed=None`` means 0). A
payload is therefore reproducible for the same seed and call order, on any device.
"""

from __future__ import annotations

import torch

__all__ = ["HASH_M1", "HASH_M2", "hash_uniform", "mix32", "pair_hash", "round_bits", "round_bits_like",
           "stream_keys"]

HASH_M1, HASH_M2 = 0x21F0AAAD, 0x735A2D97  # multipliers of mix32 (both below 2**31: no int64 overflow here)
_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1


def stream_keys(seed: int, count: int) -> tuple[int, int]:
    """The two 32-bit keys of the ``count``-th stochastic encode of a codec seeded with ``seed`` (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + count + 1) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return z & _M32, z >> 32


def mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply, two rounds), in place on an int64 tensor of values < 2**32."""
    h ^= h >> 16
    h.mul_(HASH_M1).bitwise_and_(_M32)
    h ^= h >> 15
    h.mul_(HASH_M2).bitwise_and_(_M32)
    h ^= h >> 15
    return h


def hash_uniform(index: torch.Tensor, keys: tuple[int, int]) -> torch.Tensor:
    """float32 uniforms in ``[0, 1)`` on the grid of ``2**-24``, one per int64 element ``index``:
    ``(mix32(mix32(lo32(i) ^ k0) ^ hi32(i) ^ k1) >> 8) / 2**24`` (used by the sketch codec's sign matrices)."""
    h = mix32((index & _M32) ^ keys[0])
    h ^= (index >> 32) ^ keys[1]
    return (mix32(h) >> 8).to(torch.float32).mul_(2.0**-24)


def pair_hash(counter: torch.Tensor, k1: int | torch.Tensor) -> torch.Tensor:
    """A 32-bit hash of int64 ``counter`` values < 2**32, in place: :func:`mix32` without its first
    xorshift, ``k1`` xored in after the first multiplication (the Triton kernels' ``pair_bits``).

    Six GPU instructions per pair of elements rather than sixteen per element for two mix32 rounds; the
    rounding decisions it drives stay uncorrelated (below 0.2%) between elements up to 2**21 apart.
    """
    h = counter.mul_(HASH_M1).bitwise_and_(_M32)
    h ^= (h >> 15) ^ k1
    h.mul_(HASH_M2).bitwise_and_(_M32)
    h ^= h >> 15
    return h


def round_bits(pairs: torch.Tensor, keys: tuple[int, int], wide: bool = True) -> torch.Tensor:
    """The 15-bit random integers of stochastic rounding (int64, shape ``pairs.shape + (2,)``) of elements
    ``2p`` and ``2p + 1``, for int64 pair indices ``p``: bits 17-31 and 0-14 of
    ``h = pair_hash(lo32(p + k0), k1 ^ mix32(hi32(p)))``. ``wide=False`` when every ``p < 2**32`` (mix32(0) is 0).
    """
    k1 = mix32(pairs >> 32).bitwise_xor_(keys[1]) if wide else keys[1]
    h = pair_hash((pairs + keys[0]).bitwise_and_(_M32), k1)
    return torch.stack([h >> 17, h & 0x7FFF], dim=-1)


def round_bits_like(t: torch.Tensor, keys: tuple[int, int]) -> torch.Tensor:
    """One 15-bit random integer per element of ``t`` (the padded group layout, in memory order)."""
    n = t.numel()
    pairs = torch.arange((n + 1) // 2, dtype=torch.int64, device=t.device)
    return round_bits(pairs, keys, wide=n > 1 << 33).view(-1)[:n].view(t.shape)
