"""GPU kernels (Triton) for actzip's codecs.

- :mod:`actzip.kernels.runtime`: can Triton run here, and a count of fallbacks to PyTorch. Always importable.
- The kernel modules, named as their codec or op: :mod:`~actzip.kernels.sparse` (the sparse format's passes and
  gather decoder), :mod:`~actzip.kernels.sparse_decode` (its default decoder, a run of values per tile),
  :mod:`~actzip.kernels.sparse_signpack` (its sign packing), :mod:`~actzip.kernels.sparse_encode` (the one
  encoder the codec and the fused MLPs run), :mod:`~actzip.kernels.sparse_encode_single` (its single-pass
  kernels), :mod:`~actzip.kernels.relu_mlp` (fused MLP backward from
  a payload), :mod:`~actzip.kernels.rms_norm` (the exact RMSNorm's elementwise parts), :mod:`~actzip.kernels.quant` and :mod:`~actzip.kernels.fp8` (on the shared tile layout of
  :mod:`~actzip.kernels.quant_tiles` and the bit helpers of :mod:`~actzip.kernels.quant_bits`), and
  :mod:`~actzip.kernels.sparse_launch` (the sparse kernels' host-side checks). They need Triton: import one only
  when a kernel is needed, because Triton decides at import time whether its kernels are compiled or
  interpreted (``TRITON_INTERPRET=1``), and the codecs import them lazily for that reason. This package itself
  imports no Triton.
"""

from actzip import compat
from actzip.kernels import runtime

# The kernel modules' names before they were named as their codec or op (importable for one release, with a
# warning). The old modules' private helpers were not kept, and sparse_triton.compress is encode() now.
compat.MOVED_MODULES.update({
    "actzip.kernels.sparse_triton": "actzip.kernels.sparse",
    "actzip.kernels.sparse_signpack_triton": "actzip.kernels.sparse_signpack",
    "actzip.kernels.sparse_encode_triton": "actzip.kernels.sparse_encode",
    "actzip.kernels.relu_mlp_triton": "actzip.kernels.relu_mlp",
    "actzip.kernels.quant_triton": "actzip.kernels.quant",
    "actzip.kernels.fp8_triton": "actzip.kernels.fp8",
})

__all__ = ["runtime"]
