"""Checks shared by the peft LoRA tests: each asserts how many things it found, so that a filter matching
nothing (renamed parameters, a layer class that changed) fails the test instead of passing it."""

from actzip.memory.lora.peft import CompressedLoraLinear


def named(grads, part: str, expected: int) -> list[str]:
    """The names in ``grads`` containing ``part``, checked to be ``expected`` of them (one per adapted layer)."""
    names = sorted(n for n in grads if part in n)
    assert len(names) == expected, (part, names)
    return names


def compressed_layers(pm, expected: int) -> list[CompressedLoraLinear]:
    """The compressed LoRA layers of ``pm``, checked to be ``expected`` of them."""
    layers = [m for m in pm.modules() if isinstance(m, CompressedLoraLinear)]
    assert len(layers) == expected
    return layers
