"""Images read from a local data set's files: the central square, resized, as a float tensor in [0, 1]."""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from actzip.errors import DataError, MissingDependencyError

__all__ = ["read_square_image"]


def read_square_image(path: pathlib.Path, size: int, rgb: bool, who: str) -> torch.Tensor:
    """``[C, size, size]`` float32 in [0, 1] (``C`` 3 for ``rgb``, else 1): the image's central square, resized
    bilinearly. A file Pillow cannot read is a :class:`DataError` naming ``who`` (the loader) and the path."""
    try:
        from PIL import Image
    except ImportError as e:
        raise MissingDependencyError("reading images needs Pillow (pip install pillow; matplotlib, in the bench "
                                     "extra, also installs it)") from e
    try:
        with Image.open(path) as im:
            im = im.convert("RGB" if rgb else "L")
            w, h = im.size
            side = min(w, h)
            left, top = (w - side) // 2, (h - side) // 2
            im = im.crop((left, top, left + side, top + side)).resize((size, size), Image.BILINEAR)
            a = np.asarray(im, dtype=np.float32) / 255.0
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow's errors for a damaged or unknown file
        raise DataError(f"{who}: {str(path)!r} cannot be read as an image: {exc}") from None
    return torch.from_numpy(a.reshape(size, size, -1)).permute(2, 0, 1).contiguous()
