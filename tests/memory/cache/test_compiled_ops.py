"""The codecs as custom ops a compiled graph holds: schema, fake kernels and real kernels agree (opcheck), and
what they make is the codec's own payload."""

import pytest
import torch

import actzip
from actzip.codecs import get
from actzip.memory.cache import compiled_ops

compiled_ops.register()


def test_the_custom_ops_pass_opcheck_and_match_the_codec():
    from actzip.codecs import get
    from actzip.memory.cache import compiled_ops

    x = torch.randn(33, 64).t()  # transposed: memory order and strides come back
    for spec in ("quant:bits=4,check=False,rounding=nearest", "fp8:check=False", "cast"):
        codec = get(spec)
        key = compiled_ops.codec_key(codec)
        buffers = torch.ops.actzip.encode_saved(x, key, "test")
        torch.library.opcheck(torch.ops.actzip.encode_saved, (x, key, "test"))
        args = (buffers, key, list(x.shape), list(x.stride()), x.dtype)
        torch.library.opcheck(torch.ops.actzip.decode_saved, args)
        y = torch.ops.actzip.decode_saved(*args)
        assert torch.equal(y, codec.decode(codec.encode(x))), spec
        assert spec == "cast" or y.stride() == x.stride(), spec  # the group codecs keep memory order
    with pytest.raises(actzip.errors.ConfigError, match="payload size depends on the data"):
        compiled_ops.codec_key(get("sparse"))


def test_an_unknown_key_says_to_recompile():
    with pytest.raises(actzip.errors.ConfigError, match="recompile"):
        compiled_ops.codec_of("quant#999999")
