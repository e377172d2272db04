"""LoRALinear without peft: peft's parameter names, the config it takes, one batched solve for a step's layers."""

import pytest
import torch
from torch import nn

from actzip.errors import ConfigError
from actzip.memory.lora import LoRAConfig, LoRALinear, fit_reconstruction

D_IN, D_OUT, R = 48, 40, 4


def test_layers_of_one_step_share_one_batched_solve():
    torch.manual_seed(4)
    first = LoRALinear(nn.Linear(D_IN, D_IN), rank=R)
    second = LoRALinear(nn.Linear(D_IN, D_OUT), rank=R)
    nn.init.normal_(first.lora_B.weight)
    nn.init.normal_(second.lora_B.weight)
    x, g = torch.randn(30, D_IN, requires_grad=True), torch.randn(30, D_OUT)
    h = first(x)
    (second(h) * g).sum().backward()
    # the second layer's grad_A equals the one from its own, unbatched fit
    z = h.detach() @ second.lora_A.weight.detach().t()
    m = fit_reconstruction(z, h.detach(), 1e-6)
    expected = (g @ second.lora_B.weight.detach()).t() @ z @ m
    torch.testing.assert_close(second.lora_A.weight.grad, expected, rtol=1e-4, atol=1e-5)
    assert first.lora_A.weight.grad is not None


def test_standalone_module():
    torch.manual_seed(6)
    lin = nn.Linear(D_IN, D_OUT)
    mod = LoRALinear(lin, rank=R, alpha=8, dropout=0.1, method="care")
    assert set(mod.state_dict()) == {"base.weight", "base.bias", "lora_A.weight", "lora_B.weight"}
    assert not lin.weight.requires_grad and mod.scaling == 2.0
    nn.init.normal_(mod.lora_B.weight)
    x = torch.randn(4, 5, D_IN)
    mod.eval()
    with torch.no_grad():
        torch.testing.assert_close(mod(x), lin(x) + x @ mod.delta_weight().t(), rtol=1e-5, atol=1e-5)
    mod.train()
    mod(x.requires_grad_()).sum().backward()
    assert mod.lora_A.weight.grad is not None and mod.stats["calls"] == 1
    fa = LoRALinear(nn.Linear(D_IN, D_OUT), rank=R, method="fa")
    assert not fa.lora_A.weight.requires_grad
    assert "method='care'" in repr(mod)


def test_standalone_module_takes_every_config_field_or_a_config():
    lin = nn.Linear(D_IN, D_OUT)
    mod = LoRALinear(lin, rank=R, method="care", extra_rank=2, power_iters=1, fit_group_rows=8)
    assert mod.config == LoRAConfig(method="care", extra_rank=2, power_iters=1, fit_group_rows=8)
    cfg = LoRAConfig(method="fa")
    fa = LoRALinear(nn.Linear(D_IN, D_OUT), rank=R, config=cfg)
    assert fa.config is cfg and not fa.lora_A.weight.requires_grad
    with pytest.raises(ConfigError, match="ridge"):
        LoRALinear(lin, rank=R, ridge=1e-3)
    with pytest.raises(ConfigError, match="either config"):
        LoRALinear(lin, rank=R, config=cfg, lam=1e-3)
