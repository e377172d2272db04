"""The rule of this directory's conftest: in CI, a kernel test that Triton's absence would skip fails instead."""

import os
import subprocess
import sys

import pytest
import torch

from actzip.kernels import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = "tests/kernels/test_sparse_signpack.py"  # small, and skipped whole without Triton


def start(ci: bool, fake_root=None, interpret=None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TRITON_INTERPRET") and not k.startswith("PYTEST_")}
    if ci:
        env["CI"] = "true"
    if fake_root is not None:  # a `triton` that fails to import shadows the installed one
        env["PYTHONPATH"] = os.pathsep.join([str(fake_root), env.get("PYTHONPATH", "")])
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TARGET]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def test_missing_triton_fails_in_ci_and_skips_locally(tmp_path):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'triton\' (hidden)", name="triton")\n'
    )
    runs = {"ci": start(True, tmp_path), "local": start(False, tmp_path)}  # concurrently: each is mostly startup
    if runtime.triton_import_error() is None and not torch.cuda.is_available():
        runs["ci_no_interpreter"] = start(True, interpret="0")
    done = {name: finish(proc) for name, proc in runs.items()}
    rc, out = done["ci"]
    assert rc != 0 and "CI is set and actzip's Triton kernels cannot run here" in out and "hidden" in out, out
    rc, out = done["local"]  # 5: the one module skipped, no test left to run
    assert rc in (0, 5) and "skipped" in out and "failed" not in out and "error" not in out, out
    if "ci_no_interpreter" in done:
        rc, out = done["ci_no_interpreter"]
        assert rc != 0 and "set TRITON_INTERPRET=1" in out, out
