"""Codecs: tensor -> payload -> tensor.

>>> codec = actzip.codecs.get("sparse", sign_pack=True)
>>> payload = codec.encode(x); x2 = codec.decode(payload); payload.nbytes
>>> lossy = actzip.codecs.get("quant", bits=4, group_size=128)  # or get("fp8", format="e4m3")
"""

from actzip.codecs import cast, dct, fp8, mask, passthrough, quant, sketch, sparse  # noqa: F401  (registers the codecs)
from actzip.codecs.base import Codec
from actzip.codecs.cast import CastCodec
from actzip.codecs.dct import DCTCodec
from actzip.codecs.fp8 import FP8Codec
from actzip.codecs.mask import MaskCodec
from actzip.codecs.quant import QuantCodec
from actzip.codecs.sketch import SketchCodec, sketch_matrix
from actzip.codecs.sparse import EntropyBound, SparseCodec, entropy_bound
from actzip.core.payload import Payload
from actzip.core.registry import available, get, register_codec

__all__ = [
    "CastCodec",
    "Codec",
    "DCTCodec",
    "EntropyBound",
    "FP8Codec",
    "MaskCodec",
    "Payload",
    "QuantCodec",
    "SketchCodec",
    "SparseCodec",
    "available",
    "entropy_bound",
    "get",
    "register_codec",
    "sketch_matrix",
]
