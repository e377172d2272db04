"""The tile layout, launch shapes and device helpers that the ``quant`` and ``fp8`` kernels
(:mod:`actzip.kernels.quant`, :mod:`actzip.kernels.fp8`) share.

Encoding is one kernel launch, one program per tile of whole groups; decoding is one launch of the same
layout. Buffers are sized from the shape alone and nothing waits for the device: no host synchronization.

The kernels are bound by instructions per element, not memory, so the layout serves the instruction count. A
tile is a ``[NS, BG, CP, K]`` block: ``BG`` groups (rows), each cut into ``NS * CP`` chunks of ``K`` elements
(one 16-byte load: 8 for 16-bit dtypes, 4 for float32; at least a byte of codes). Triton gives each thread
whole chunks, threads along ``CP`` and rows, ``NS`` in registers, so a thread holds ``NS * K`` elements of its
group: the minimum and maximum reduce in registers (packed bfloat16/float16 instructions on a GPU) and then
over ``CP`` threads, the group's one division is shared by those elements, and a chunk's codes pack into one
word in the thread. Offsets inside a tile are int32 from a scalar int64 start. A group that is not a
power-of-two number of chunks takes ``NS = 1`` and ``CP`` rounded up, the extra chunks rereading the row's first
ones (so no minimum or maximum changes) and storing nothing. Past ``n`` the loads return element ``n - 1``: the
padding rule. :func:`geometry` picks the shape; ``tile``, ``warps`` and ``group_threads`` change it, never the
bytes written.


bfloat16 widens exactly (two logic instructions per pair of elements on a GPU, :func:`widen`) and is written
by the hardware's round-to-nearest-even conversion on a GPU and by moving bits under the interpreter, whose
float32 -> bfloat16 conversion and bfloat16 comparisons differ from PyTorch's (``HW`` selects,
:func:`store_f32`). The kernels are launched with ``enable_fp_fusion=False`` (:data:`LAUNCH_OPTIONS`), so no
multiply and add become one fused operation.
"""

from __future__ import annotations

import functools

import torch

from actzip.errors import ConfigError
from actzip.kernels.quant_bits import mix32, pair_bits
from actzip.kernels.runtime import missing_triton

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

__all__ = ["DEFAULT_GROUP_THREADS", "DEFAULT_TILE", "INPUT_DTYPES", "INTERPRETED", "LAUNCH_OPTIONS", "MAX_GROUP",
           "bcast_rows", "check_group_size", "check_input", "check_size", "geometry", "launch_options", "load_rows",
           "load_tile", "new_output", "random_bits", "row_params", "row_reduce", "signed_key", "store_f32",
           "tile_elements", "widen"]

MAX_GROUP = 4096  # largest group a program takes (one group must fit in one program's registers)
DEFAULT_TILE = 4096  # elements per program (fp8; quant takes the shapes below)
DEFAULT_GROUP_THREADS = 4  # threads sharing one group (when the group allows it)
_THREAD_ELEMS = 64  # most elements of one group a thread holds (registers)
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAUNCH_OPTIONS = {"enable_fp_fusion": False}  # keep a * b + c two roundings, as PyTorch computes it


# -- device helpers ---------------------------------------------------------------------------------------


@triton.jit
def tile_elements(G: tl.constexpr, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr):
    """``(start, offs, words, chunk_ok)``: the tile's first element (int64), the int32 offsets ``[NS, BG, CP,
    K]`` of its elements from there, those of its chunks (``[NS, BG, CP]``, in chunks), and which chunks lie
    in their group (all unless the group was rounded up to a power of two chunks)."""
    start = tl.program_id(0).to(tl.int64) * (BG * G)
    c = tl.arange(0, CP)[None, None, :]
    chunk_ok = (c < G // K) | (NS * CP * K == G)
    c = tl.where(c < G // K, c, c - G // K)  # a rounded-up group rereads its first chunks
    words = tl.arange(0, NS)[:, None, None] * CP + tl.arange(0, BG)[None, :, None] * (G // K) + c
    return start, words[:, :, :, None] * K + tl.arange(0, K)[None, None, None, :], words, chunk_ok


@triton.jit
def row_params(p_ptr, n_rows, BG: tl.constexpr):
    """Pointers to the tile's ``BG`` group parameters and which of them exist."""
    first = tl.program_id(0).to(tl.int64) * BG
    r = tl.arange(0, BG)
    return p_ptr + first + r, r < tl.minimum(n_rows - first, BG).to(tl.int32)


@triton.jit
def load_tile(x_ptr, start, offs, n, TILE: tl.constexpr):
    if n - start >= TILE:  # a whole tile: no masks
        x = tl.load(x_ptr + start + offs)
    else:  # past the end every element reads element n - 1: the padding rule
        x = tl.load(x_ptr + start + offs, mask=offs < (n - start).to(tl.int32), other=tl.load(x_ptr + (n - 1)))
    return x


@triton.jit
def load_rows(x_ptr, start, offs, n, row_groups, row_stride, G: tl.constexpr, BG: tl.constexpr):
    """``load_tile`` for a view of rows ``row_groups * G`` elements long, ``row_stride`` apart: a group lies in
    one row, so each has one base address (worked out per group, not per element). Past ``n``: zeros, which only
    groups that are never stored read (``n`` is whole groups)."""
    g = start // G + tl.arange(0, BG)
    row = g // row_groups
    base = row * row_stride + (g - row * row_groups) * G
    inner = offs - (tl.arange(0, BG) * G)[None, :, None, None]
    lim = tl.minimum(n - start, 1 << 30).to(tl.int32)
    return tl.load(x_ptr + base[None, :, None, None] + inner, mask=offs < lim, other=0.0)


@triton.jit
def widen(x, IN_BF16: tl.constexpr, HW: tl.constexpr):
    """float32 values of ``x``, exactly. On a GPU a pair of bfloat16 in one register widens in two logic
    instructions (what the compiler emits extracts the high half first)."""
    if IN_BF16 and HW:
        return tl.inline_asm_elementwise("shl.b32 $0, $2, 16;\n and.b32 $1, $2, 0xffff0000;", "=r,=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=2)  # fmt: skip
    else:
        return x.to(tl.float32)


@triton.jit
def store_f32(ptr, offs, y, mask, OUT_BF16: tl.constexpr, HW: tl.constexpr):
    if OUT_BF16 and not HW:  # as int16 bits, rounded to nearest even like PyTorch (a NaN stays a NaN)
        u = y.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)  # noqa: PLR0124 (NaN test)
        tl.store(ptr + offs, r.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)
    elif OUT_BF16:
        tl.store(ptr + offs, y.to(tl.bfloat16).to(tl.int16, bitcast=True), mask=mask)
    else:
        tl.store(ptr + offs, y.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def row_reduce(x, MAX: tl.constexpr):
    """NaN-propagating minimum or maximum of each row of ``[NS, BG, CP, K]``: registers first, then threads."""
    if MAX:
        return tl.reduce(tl.reduce(tl.reduce(x, 0, _max_nan), 2, _max_nan), 1, _max_nan)
    else:
        return tl.reduce(tl.reduce(tl.reduce(x, 0, _min_nan), 2, _min_nan), 1, _min_nan)


@triton.jit
def bcast_rows(v):
    # Per-row values to [1, BG, 1, 1], undoing row_reduce's axes in reverse (no layout conversion).
    return tl.expand_dims(tl.expand_dims(tl.expand_dims(v, 1), 2), 0)


@triton.jit
def random_bits(start, offs, key0, key1, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr,
                 WIDE: tl.constexpr):  # fmt: skip
    """The codec's 15-bit random integers (``actzip.codecs.counter_rng.round_bits``), one per element, in int32:
    one hash per pair of elements (elements ``2p`` and ``2p + 1``)."""
    pair, _ = tl.split(tl.reshape(offs, (NS, BG, CP, K // 2, 2)))
    pair = pair >> 1
    k0 = key0.to(tl.uint32, bitcast=True)
    k1 = key1.to(tl.uint32, bitcast=True)
    first = start >> 1
    if WIDE:  # the tile crosses a multiple of 2**32 pairs: the high part per pair
        p = first + pair
        h = pair_bits(p.to(tl.uint32) + k0, k1 ^ mix32((p >> 32).to(tl.uint32)))
    else:
        h = pair_bits(pair.to(tl.uint32) + (first.to(tl.uint32) + k0), k1 ^ mix32((first >> 32).to(tl.uint32)))
    r = tl.join((h >> 17).to(tl.int32), (h & 0x7FFF).to(tl.int32))
    return tl.reshape(r, (NS, BG, CP, K))


# Triton picks between compiling and interpreting when a jit function is defined (TRITON_INTERPRET=1).
INTERPRETED = type(tile_elements).__name__ == "InterpretedFunction"


# -- host code --------------------------------------------------------------------------------------------


def check_group_size(group_size: int) -> int:
    """Raise :class:`ConfigError` unless ``group_size`` suits the kernels: a multiple of 8 up to :data:`MAX_GROUP`."""
    ok = isinstance(group_size, int) and not isinstance(group_size, bool) and 8 <= group_size <= MAX_GROUP
    if not ok or group_size % 8:
        raise ConfigError(
            f"quant Triton kernels: group_size must be a multiple of 8 from 8 to {MAX_GROUP}, got {group_size!r}"
        )
    return group_size


def _pow2(v: int, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1 or v & (v - 1):
        raise ConfigError(f"quant Triton kernels: {what} must be a power of two, got {v!r}")
    return v


def geometry(
    group_size: int, elem_bytes: int, bits: int, tile: int | None = None, group_threads: int | None = None,
    warps: int | None = None,
) -> dict:  # fmt: skip
    """The launch shape for groups of ``group_size`` elements of ``elem_bytes`` bytes, ``bits`` per code:
    ``G, NS, BG, CP, K`` (see the module docstring) and ``num_warps``, as keyword arguments of a launch.

    ``tile``: elements per program (a power of two; groups larger than it take one group per program).
    ``group_threads``: how many threads share a group (a power of two; more for groups too large for that many,
    or too few to fill the program). ``warps``: default 32 elements per thread, 1 to 8 warps.
    """
    return dict(_geometry(group_size, elem_bytes, bits, tile, group_threads, warps))


@functools.lru_cache(maxsize=256)
def _geometry(group_size: int, elem_bytes: int, bits: int, tile: int | None, group_threads: int | None,
              warps: int | None) -> tuple:  # fmt: skip
    # Worked out once per launch shape: a few microseconds of Python saved on every encode and decode.
    tile = _pow2(DEFAULT_TILE if tile is None else tile, "tile")
    lanes = _pow2(DEFAULT_GROUP_THREADS if group_threads is None else group_threads, "group_threads")
    k = max(16 // elem_bytes, 8 // bits)  # one 16-byte load, and whole bytes of codes
    chunks = group_size // k
    padded = bool(chunks & (chunks - 1))  # not a power of two chunks: one slice, rounded up
    row = triton.next_power_of_2(chunks) * k if padded else group_size
    bg = max(1, tile // row)
    warps = _pow2(min(8, max(1, bg * row // 1024)) if warps is None else warps, "warps")
    if padded:
        ns, cp = 1, row // k
    else:  # every thread busy, and at most _THREAD_ELEMS elements of a group in one thread
        cp = min(chunks, max(lanes, 32 * warps // bg, chunks * k // _THREAD_ELEMS))
        ns = chunks // cp
    return (("G", group_size), ("NS", ns), ("BG", bg), ("CP", cp), ("K", k), ("num_warps", warps))


def launch_options(geo: dict, n_rows: int, n_pad: int) -> tuple[tuple[int], dict]:
    """Grid, and the launch options: ``WIDE`` (a tile may cross a multiple of 2**32 element pairs, where the
    random stream's high part changes), ``HW`` (compiled for a GPU) and no fp fusion."""
    tile_pairs = geo["BG"] * geo["G"] // 2
    wide = n_pad > 1 << 33 and (1 << 32) % tile_pairs != 0
    return (-(-n_rows // geo["BG"]),), {"WIDE": wide, "HW": not INTERPRETED, **LAUNCH_OPTIONS}


def signed_key(key: int) -> int:
    # A 32-bit key travels as an int32 argument (the same argument type every call: no recompilation).
    key &= 0xFFFFFFFF
    return key - (1 << 32) if key >= 1 << 31 else key


def check_input(flat: torch.Tensor, group_size: int | None = None) -> tuple[torch.Tensor, bool, tuple[int, int]]:
    """``(flat, is bfloat16, (row_groups, row_stride))``: a contiguous 1-D tensor (``row_stride`` 0), or with
    ``group_size`` also a 2-D view of rows of whole groups ``row_stride`` elements apart."""
    if flat.dtype not in INPUT_DTYPES:
        raise ConfigError(f"quant Triton kernels take float32, float16 and bfloat16 tensors, got {flat.dtype}")
    bf16 = flat.dtype == torch.bfloat16
    if flat.dim() == 1 and flat.is_contiguous():
        return flat, bf16, (1, 0)
    if group_size and flat.dim() == 2 and flat.stride(1) == 1 and flat.stride(0) >= flat.shape[1] > 0 \
            and flat.shape[1] % group_size == 0:  # fmt: skip
        return flat, bf16, (flat.shape[1] // group_size, flat.stride(0))
    rows = " or a 2-D view of rows of whole groups (strides (S, 1))" if group_size else ""
    raise ConfigError(
        f"quant Triton kernels: the input must be a contiguous 1-D tensor{rows}, got shape {tuple(flat.shape)} "
        f"strides {flat.stride()}"
    )


def new_output(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    if dtype not in INPUT_DTYPES:
        raise ConfigError(f"quant Triton kernels decode to float32, float16 and bfloat16, got {dtype}")
    out = torch.empty(n, dtype=dtype, device=device)
    bf16 = dtype == torch.bfloat16
    return out, (out.view(torch.int16) if bf16 else out), bf16


def check_size(what: str, t: torch.Tensor, count: int) -> None:
    if t.numel() < count:
        raise ConfigError(f"quant Triton kernels: {what} has {t.numel()} elements, the payload needs {count}")

