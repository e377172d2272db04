import os
import subprocess
import sys
from pathlib import Path

import pytest

from actzip_bench.cli import build_parser, main

SRC = Path(__file__).resolve().parents[2] / "src"


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)


def test_python_m_actzip_bench_is_the_actzip_command():
    r = _python("-m", "actzip_bench", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: actzip") and "{demo,bench,report}" in r.stdout


def test_actzip_bench_without_rich_names_the_extra():
    r = _python("-c", "import sys; sys.modules['rich'] = None; import actzip_bench")
    assert r.returncode == 1 and "pip install 'actzip[bench]'" in r.stderr


@pytest.mark.parametrize("argv", [
    ["demo", "--steps", "3", "--activation", "gelu", "--no-progress"],
    ["bench", "memory", "--out", "o", "--parts", "bits"],
    ["bench", "ffn", "--density", "low", "--matmul", "fp8"],
    ["bench", "gpt", "--seq-lens", "1024", "--loss-chunk", "0"],
    ["bench", "kernels", "--numel", "4096"],
    ["bench", "quant", "--numel", "4096"],
    ["bench", "bits", "--dtype", "float8_e4m3fn"],
    ["bench", "presets", "--activation", "swiglu", "--presets", "4bit"],
    ["bench", "lora", "--config", "h200", "--dropout-mask", "regenerate"],
    ["bench", "cache", "--quick", "--models", "gpt-gelu", "--group-size", "64"],
    ["bench", "wire", "--quick", "--mode", "processes", "--stage-lr-scale", "1,0.3"],
    ["bench", "link", "--mbps", "80", "--sizes", "1000,2000", "--repeats", "3"],
    ["report", "--root", ".", "--out", "R.md"],
])
def test_every_command_keeps_its_options(argv):
    args = build_parser().parse_args(argv)
    assert callable(args.func)


def test_bench_link_names_a_bad_size_list(capsys):
    assert main(["bench", "link", "--sizes", "1000,lots"]) == 2
    assert "--sizes takes comma-separated byte counts, got '1000,lots'" in capsys.readouterr().err


def test_a_bad_option_value_is_a_clear_error(capsys):
    assert main(["bench", "gpt", "--seq-lens", "1024,many", "--device", "cpu"]) == 2
    assert "--seq-lens takes comma-separated int values, got '1024,many'" in capsys.readouterr().err
