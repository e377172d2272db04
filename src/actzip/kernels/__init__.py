"""GPU kernels (Triton) for actzip's codecs.

- :mod:`actzip.kernels.runtime`: can Triton run here, and a count of fallbacks to PyTorch. Always importable.
- :mod:`actzip.kernels.sparse_triton`: the sparse codec's kernels (needs Triton). Import it only when a kernel
  is needed: Triton decides at import time whether its kernels are compiled or interpreted
  (``TRITON_INTERPRET=1``), and the codecs import it lazily for that reason.
"""

from actzip.kernels import runtime

__all__ = ["runtime"]
