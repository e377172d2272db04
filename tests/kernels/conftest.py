"""Kernel tests run the Triton kernels on CUDA when there is a GPU, else under Triton's CPU interpreter.

Triton chooses between compiling and interpreting a kernel when the kernel is defined, i.e. when a kernel
module (``actzip.kernels.sparse``, ...) is imported, and the interpreter needs ``TRITON_INTERPRET`` still set
while kernels run. So without a GPU this sets ``TRITON_INTERPRET=1`` now, at import (before the test modules import
the kernels), and puts the variable back as it was once this directory's tests are done. Afterwards
``actzip.kernels.runtime`` reports the (interpreted) kernels as unusable instead of running them without the
variable. With a GPU the variable is left as the user set it, so the CUDA cases test compiled kernels and the
CPU cases skip.

In CI (``CI`` set, as CI services do) a kernel test must not skip because Triton cannot run here (not
importable, or no GPU and no interpreter): that would pass silently. There such a skip, of a test or of a whole
module (``pytest.importorskip``), is reported as a failure naming the reason; locally it stays a skip.
"""

import os

import pytest
import torch

from actzip.kernels import runtime

_BEFORE = os.environ.get("TRITON_INTERPRET")
if _BEFORE is None and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
_DURING = os.environ.get("TRITON_INTERPRET")


@pytest.fixture(scope="package", autouse=True)
def _triton_interpret_env():
    os.environ.pop("TRITON_INTERPRET", None)
    if _DURING is not None:
        os.environ["TRITON_INTERPRET"] = _DURING
    yield
    os.environ.pop("TRITON_INTERPRET", None)
    if _BEFORE is not None:
        os.environ["TRITON_INTERPRET"] = _BEFORE


_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def _ci_failure() -> str | None:
    """Why a skip here must fail: in CI, when actzip's Triton kernels cannot run in this process; else None.

    Asked only once something skipped, so that Triton is never imported before the interpreter is switched on.
    """
    if not _CI:
        return None
    if runtime.triton_import_error() is not None:
        reason = runtime.unavailable_reason("cuda")  # names the import error and the extra
    elif not torch.cuda.is_available():
        reason = runtime.unavailable_reason("cpu")
    else:
        reason = None
    return None if reason is None else f"CI is set and actzip's Triton kernels cannot run here: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    reason = _ci_failure() if report.skipped else None
    if reason is not None:
        report.outcome, report.longrepr = "failed", f"skipped, which must not happen here: {reason}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    # CUDA cases skip without a GPU, whatever Triton can do; an expected failure is no skip.
    cuda_only = item.get_closest_marker("cuda") is not None and not torch.cuda.is_available()
    if report.skipped and not cuda_only and not hasattr(report, "wasxfail"):
        reason = _ci_failure()
        if reason is not None:
            report.outcome, report.longrepr = "failed", f"skipped, which must not happen here: {reason}"
    return report
