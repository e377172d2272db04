"""Which rows of the current batch are tokens: the mask the CARE fit uses to leave padding rows out."""

from __future__ import annotations

import contextlib
import contextvars

import torch

# Rows of the current batch that are real tokens (1) or padding (0), flattened; None: all rows count.
_ROW_MASK: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("actzip_lora_row_mask", default=None)


@contextlib.contextmanager
def row_mask(mask: torch.Tensor | None):
    """Within the block, fit ``M`` on the rows where ``mask`` is non-zero (padding rows left out).

    ``mask`` is a ``[batch, seq]`` attention mask (1 = token, 0 = padding); a layer whose input has a different
    number of rows fits on all of them and counts a ``mask_mismatch`` in its stats.
    """
    token = _ROW_MASK.set(None if mask is None else mask.reshape(-1).float())  # converted once, not per layer
    try:
        yield
    finally:
        _ROW_MASK.reset(token)


def current_row_mask() -> torch.Tensor | None:
    """The flattened mask set by the innermost :func:`row_mask` block, if any."""
    return _ROW_MASK.get()
