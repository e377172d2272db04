"""The previous release's LoRA names keep working for one release, each warning once (FutureWarning)."""

import importlib
import sys
import warnings

import pytest
import torch
from torch import nn

import actzip.memory.lora as lora
from actzip import compat
from actzip.memory.lora import LoRAConfig, cached_gaussian_projection


def fresh(old: str) -> None:
    """Forget that ``old`` has warned (and, for a module path, that it was imported), so the test sees it warn."""
    compat.warned.discard(old)
    if old in compat.MOVED_MODULES:
        sys.modules.pop(old, None)


def warns_once(old: str, fn):
    fresh(old)
    with pytest.warns(FutureWarning, match=old.replace(".", r"\.")):
        first = fn()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second use is silent
        fn()
    return first


@pytest.mark.parametrize("old", ["actzip.lora", "actzip.memory.lora_peft"])
def test_old_module_paths_give_the_package(old):
    if old.endswith("lora_peft"):
        pytest.importorskip("peft")
    module = warns_once(old, lambda: importlib.import_module(old))
    assert module is lora
    for name in ("LoRALinear", "LoRALinearFunction", "lora_linear", "fit_reconstruction", "row_mask",
                 "saved_bytes_by_module", "apply", "remove"):
        assert hasattr(module, name), name
    if old.endswith("lora_peft"):
        from actzip.memory.lora.peft import CompressedLoraLinear, unsupported_reason

        assert module.CompressedLoraLinear is CompressedLoraLinear and module.unsupported_reason is unsupported_reason
        assert callable(module.apply_) and callable(module.remove_) and module.LoRAReport is lora.LoRAReport


def test_methods_is_lora_methods():
    assert warns_once("actzip.memory.lora.METHODS", lambda: lora.METHODS) == lora.LORA_METHODS == ("lora", "fa", "care")
    fresh("actzip.memory.lora.METHODS")
    with pytest.warns(FutureWarning):
        from actzip.memory.lora import METHODS  # noqa: F401


def test_lora_compression_is_lora_config():
    cfg = warns_once("actzip.memory.lora.LoRACompression", lambda: lora.LoRACompression(method="fa", lam=1e-3))
    assert isinstance(cfg, LoRAConfig) and cfg.method == "fa" and cfg.lam == 1e-3
    x = torch.randn(6, 8)
    base = nn.Linear(8, 4).requires_grad_(False)
    a, b = torch.randn(2, 8), torch.randn(4, 2, requires_grad=True)
    lora.lora_linear(x, base.weight, base.bias, a, b, scale=1.0, config=cfg).sum().backward()
    assert b.grad is not None


def test_sketch_matrix_is_cached_gaussian_projection():
    got = warns_once("actzip.memory.lora.sketch_matrix", lambda: lora.sketch_matrix(16, 3, torch.float32, "cpu"))
    assert torch.equal(got, cached_gaussian_projection(16, 3, torch.float32, torch.device("cpu")))
    assert got.shape == (3, 16)


def test_apply_and_remove_forward_to_compress_and_restore():
    peft = pytest.importorskip("peft")
    from actzip.memory.lora.peft import CompressedLoraLinear

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4), nn.Embedding(4, 8))
    pm = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["0", "2", "3"]))
    fresh("actzip.lora.apply")
    with pytest.warns(FutureWarning, match=r"actzip\.lora\.apply"), \
            pytest.warns(UserWarning, match="left as plain LoRA"):
        report = lora.apply(pm, method="fa", lam=1e-3)
    assert isinstance(report, lora.LoRAReport) and report.method == "fa"
    assert report.compressed == ["base_model.model.0", "base_model.model.2"] and report.frozen_a == 2
    assert [n for n, _ in report.plain] == ["base_model.model.3"] and "Embedding" in report.plain[0][1]
    assert any("3: left as plain LoRA" in line for line in report.lines())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        again = lora.apply(pm, "care", extra_rank=1)  # applying again replaces the method
    assert again.compressed == report.compressed
    assert {m.actzip_config.method for m in pm.modules() if isinstance(m, CompressedLoraLinear)} == {"care"}
    n = warns_once("actzip.lora.remove", lambda: lora.remove(pm))
    assert n == 2 and not any(isinstance(m, CompressedLoraLinear) for m in pm.modules())
    lora_a = {name: p for name, p in pm.named_parameters() if "lora_A" in name}
    assert sorted(lora_a) == ["base_model.model.0.lora_A.default.weight", "base_model.model.2.lora_A.default.weight"]
    assert all(p.requires_grad for p in lora_a.values())  # "fa" froze them; remove gave them back
    with pytest.raises(Exception, match="ridge"):
        lora.apply(pm, "care", ridge=1.0)


def test_apply_on_a_model_it_cannot_change_reports_instead_of_raising():
    peft = pytest.importorskip("peft")
    pm = peft.get_peft_model(nn.Sequential(nn.Embedding(4, 8)), peft.LoraConfig(r=2, target_modules=["0"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = lora.apply(pm)
    assert report.compressed == [] and "Embedding" in report.plain[0][1]
    assert lora.remove(pm) == 0
