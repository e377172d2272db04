"""Which implementation a codec runs (:mod:`actzip.codecs.kernel_choice`), decided from the device and the option."""

import warnings

import pytest
import torch

from actzip.codecs.kernel_choice import KERNELS, use_triton
from actzip.errors import ConfigError, KernelUnavailableError
from actzip.kernels import runtime

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def test_torch_never_and_auto_only_on_cuda(monkeypatch):
    monkeypatch.setattr(runtime, "unavailable_reason", lambda device: None)
    assert KERNELS == ("auto", "torch", "triton")
    assert not use_triton("quant", "torch", CUDA) and not use_triton("quant", "auto", CPU)
    assert use_triton("quant", "auto", CUDA) and use_triton("quant", "triton", CPU)


def test_triton_that_cannot_run_raises_naming_the_codec_and_reason(monkeypatch):
    monkeypatch.setattr(runtime, "unavailable_reason", lambda device: None)
    with pytest.raises(KernelUnavailableError, match=r"^fp8\(kernel='triton'\) cannot run: too big$") as e:
        use_triton("fp8", "triton", CPU, "too big")
    assert isinstance(e.value, ConfigError)
    monkeypatch.setattr(runtime, "unavailable_reason", lambda device: "no GPU here")
    with pytest.raises(KernelUnavailableError, match="cannot run: no GPU here"):
        use_triton("fp8", "triton", CPU, "too big")  # the device's reason first


def test_auto_on_cuda_falls_back_once_warned_and_always_counted(monkeypatch):
    monkeypatch.setattr(runtime, "unavailable_reason", lambda device: None)
    runtime.reset_fallbacks()
    with pytest.warns(RuntimeWarning, match=r"actzip sparse codec \(kernel='auto'\): using the PyTorch .* because odd"):
        assert not use_triton("sparse", "auto", CUDA, "odd")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not use_triton("sparse", "auto", CUDA, "odd")
    assert runtime.fallback_counts() == {"sparse codec (kernel='auto'): odd": 2}
    runtime.reset_fallbacks()
