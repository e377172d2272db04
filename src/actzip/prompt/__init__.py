"""Instruction prompts folded into one activation vector of a frozen causal LM.

- :mod:`actzip.prompt.config`: :class:`PromptVectorConfig` (where the vector is read and written, how it is
  fitted, and for ``compress_`` the saved file to install).
- :mod:`actzip.prompt.layers`: a model's decoder blocks, width and logits, found by structure
  (:func:`decoder_blocks`, :func:`hidden_size`, :func:`forward_logits`).
- :mod:`actzip.prompt.hooks`: reading and writing the residual stream at a block boundary (:func:`capture`,
  :func:`inject`), KV caches and ``generate`` included.
- :mod:`actzip.prompt.vector`: :class:`PromptVector` (fit on a few examples, apply, generate, save, load) and the
  ``compress_`` handler that installs a saved one.
"""

from actzip.prompt.config import MODES, PromptVectorConfig
from actzip.prompt.hooks import Capture, capture, inject, inject_hook, slot_mask
from actzip.prompt.layers import accepts, check_layer, decoder_blocks, embedding, forward_logits, hidden_size
from actzip.prompt.vector import PromptVector, VectorWeights, install_prompt_vector

__all__ = [
    "MODES",
    "Capture",
    "PromptVector",
    "PromptVectorConfig",
    "VectorWeights",
    "accepts",
    "capture",
    "check_layer",
    "decoder_blocks",
    "embedding",
    "forward_logits",
    "hidden_size",
    "inject",
    "inject_hook",
    "install_prompt_vector",
    "slot_mask",
]
