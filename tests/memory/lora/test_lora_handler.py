"""The compress_ handler of LoRAConfig: registered with actzip.api, and a clear error without peft."""

import importlib.util

import pytest
from torch import nn

import actzip
from actzip.errors import MissingDependencyError, UnknownConfigError
from actzip.memory.lora import LoRAConfig


def test_compress_knows_lora_config():
    with pytest.raises(UnknownConfigError, match="LoRAConfig"):  # the error lists the registered config types
        actzip.compress_(nn.Linear(2, 2), object())


def test_without_peft_the_error_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(MissingDependencyError, match=r"peft.*actzip\[hf\]"):
        actzip.compress_(nn.Sequential(nn.Linear(2, 2)), LoRAConfig())
