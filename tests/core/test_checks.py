"""The shared option checks (:mod:`actzip.core.checks`) and dtype helpers: each error names its owner and option."""

import pytest
import torch

from actzip.core.checks import check_choice, check_group_size, check_seed
from actzip.core.dtypes import LOSSY_DTYPES, work_dtype
from actzip.errors import ConfigError


def test_choices_compare_types_too():
    check_choice("quant", "bits", 4, (1, 2, 4, 8))
    for bad in (3, 4.0, True, "4"):
        with pytest.raises(ConfigError, match=rf"quant: option bits must be one of 1, 2, 4, 8, got {bad!r}"):
            check_choice("quant", "bits", bad, (1, 2, 4, 8))


@pytest.mark.parametrize("seed", [None, 0, 7, 2**63])
def test_good_seeds(seed):
    check_seed("mask", seed)


@pytest.mark.parametrize("seed", [-1, 1.0, True, "0"])
def test_bad_seeds(seed):
    with pytest.raises(ConfigError, match=r"SketchedLinear: option seed must be None or a non-negative int"):
        check_seed("SketchedLinear", seed)


@pytest.mark.parametrize("bad", [0, -8, 12, 8.0, True, None])
def test_group_size(bad):
    check_group_size("fp8", 24)
    with pytest.raises(ConfigError, match=r"fp8: option group_size must be a positive multiple of 8"):
        check_group_size("fp8", bad)


def test_work_dtype():
    assert [work_dtype(d) for d in LOSSY_DTYPES] == [torch.float32] * 3 + [torch.float64]
