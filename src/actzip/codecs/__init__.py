"""Codecs: tensor -> payload -> tensor.

>>> codec = actzip.codecs.get("sparse", sign_pack=True)
>>> payload = codec.encode(x); x2 = codec.decode(payload); payload.nbytes
"""

from actzip.codecs import passthrough, sparse  # noqa: F401  (registers the codecs)
from actzip.codecs.base import Codec
from actzip.codecs.sparse import EntropyBound, SparseCodec, entropy_bound
from actzip.core.payload import Payload
from actzip.core.registry import available, get, register_codec

__all__ = ["Codec", "EntropyBound", "Payload", "SparseCodec", "available", "entropy_bound", "get", "register_codec"]
