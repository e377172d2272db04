"""The kernel modules' old paths (``actzip.kernels.*_triton``) still import, for one release, with one warning."""

import importlib
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

OLD_TO_NEW = {
    "actzip.kernels.sparse_triton": "actzip.kernels.sparse",
    "actzip.kernels.sparse_signpack_triton": "actzip.kernels.sparse_signpack",
    "actzip.kernels.sparse_encode_triton": "actzip.kernels.sparse_encode",
    "actzip.kernels.relu_mlp_triton": "actzip.kernels.relu_mlp",
    "actzip.kernels.quant_triton": "actzip.kernels.quant",
    "actzip.kernels.fp8_triton": "actzip.kernels.fp8",
}


@pytest.mark.parametrize("old,new", OLD_TO_NEW.items())
def test_old_module_path_is_the_new_module_and_warns_once(old, new):
    from actzip import compat

    compat.warned.discard(old)
    sys.modules.pop(old, None)
    with pytest.warns(FutureWarning, match=rf"{old} is deprecated .* use {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    sys.modules.pop(old, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second import of the old path in this process is silent
        assert importlib.import_module(old) is module


def test_importing_the_kernels_package_imports_no_triton():
    code = "import sys, actzip.kernels; assert 'triton' not in sys.modules, 'triton imported'; print('OK')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-2000:]
