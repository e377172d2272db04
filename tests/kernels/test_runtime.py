"""Why the Triton kernels cannot run on a device: each case of ``runtime.unavailable_reason``."""

import pytest

from actzip.kernels import runtime


@pytest.mark.parametrize(
    "device, loaded_interpreted, env, expect",
    [
        ("cuda", None, "", None),
        ("cuda", False, "", None),
        ("cuda", True, "", "no longer set"),
        ("cuda", True, "1", None),
        ("cpu", None, "1", None),
        ("cpu", True, "1", None),
        ("cpu", True, "", "no longer set"),
        ("cpu", False, "1", "compiled for CUDA before"),
        ("cpu", None, "", "set TRITON_INTERPRET=1"),
        ("meta", None, "", "meta device"),
    ],
)
def test_unavailable_reason(monkeypatch, device, loaded_interpreted, env, expect):
    if runtime.triton_import_error() is not None:
        pytest.skip("Triton is not importable here")
    monkeypatch.setattr(runtime, "_kernels_interpreted", lambda: loaded_interpreted)
    monkeypatch.setenv("TRITON_INTERPRET", env)
    reason = runtime.unavailable_reason(device)
    assert reason is None if expect is None else expect in reason


def test_missing_triton_is_named(monkeypatch):
    monkeypatch.setattr(runtime, "triton_import_error", lambda: "ImportError: no module named triton")
    assert "pip install 'actzip[triton]'" in runtime.unavailable_reason("cuda")


def test_missing_triton_names_the_extra():
    from actzip.errors import MissingDependencyError

    err = runtime.missing_triton(ModuleNotFoundError("No module named 'triton'"))
    assert isinstance(err, MissingDependencyError) and isinstance(err, ImportError)
    assert "No module named 'triton'" in str(err) and "pip install 'actzip[triton]'" in str(err)
