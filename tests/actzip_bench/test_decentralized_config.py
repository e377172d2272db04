"""The decentralized bench's methods: every codec spec parses, and mask_keep reaches both masks."""

import pytest

from actzip.wire.codecs import parse_codec
from actzip.errors import ConfigError
from actzip_bench.decentralized_config import METHODS, DecentralizedBenchConfig, method_codecs


def test_every_methods_codecs_parse_at_the_default_and_another_keep():
    for keep in (0.125, 0.5):
        cfg = DecentralizedBenchConfig(mask_keep=keep)
        for method in METHODS:
            for spec in method_codecs(method, cfg):
                parse_codec(spec)


def test_mask_keep_reaches_the_masks_and_nothing_else():
    cfg = DecentralizedBenchConfig(mask_keep=0.5)
    assert method_codecs("mask", cfg) == ("mask:keep=0.5,mode=random+quant:bits=8",) * 2
    assert method_codecs("topk-mask", cfg)[0] == "mask:keep=0.5,mode=topk+quant:bits=8"
    assert method_codecs("mask-backward", cfg) == ("quant:bits=8", "mask:keep=0.5,mode=random+quant:bits=8")
    assert method_codecs("int4", cfg) == method_codecs("int4")
    assert method_codecs("mask") == ("mask:keep=0.125,mode=random+quant:bits=8",) * 2


@pytest.mark.parametrize("keep", [0.0, 1.5, True])
def test_a_bad_mask_keep_is_refused(keep):
    with pytest.raises(ConfigError, match="mask_keep"):
        DecentralizedBenchConfig(mask_keep=keep)
