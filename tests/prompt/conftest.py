"""Fixtures of the prompt tests: tiny models of each kind (see tiny_models)."""

import pytest

from .tiny_models import HF_KINDS, KINDS, tiny


@pytest.fixture
def make():
    """``make(kind, hidden=32, layers=2, seed=0)``: a tiny model (see :func:`tiny`)."""
    return tiny


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture(params=HF_KINDS)
def hf_kind(request) -> str:
    return request.param
