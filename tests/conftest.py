import importlib.util
import os

import pytest
import torch

# Without a GPU, Triton runs kernels in its interpreter, and it decides whether a kernel (and its own library
# functions) are interpreted when they are defined, i.e. at import. Modules anywhere in the suite may import
# Triton or actzip's kernels while being collected (peft imports Triton), so the interpreter is switched on
# here, before anything is collected, for the whole run; tests that need it off use a fresh process.
if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ and importlib.util.find_spec("triton"):
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny-tensor tests: faster, and much faster on a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def sync_free_after_warmup():
    """``check(step, warmup=3)``: ``step`` run ``warmup`` times (kernels compiled, roles tracked, decisions
    remembered), then once more with any host synchronization on the GPU an error."""

    def check(step, warmup: int = 3) -> None:
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")

    return check
