"""The examples' zygote: each example runs in its own forked child, with its exit status, output, working
directory and timeout as a fresh interpreter would have them, and nothing left over from the one before."""

from pathlib import Path

import pytest

from example_zygote import Zygote

pytestmark = pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="the zygote forks")
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def zygote():
    z = Zygote(SRC)
    yield z
    z.close()


def test_status_output_and_working_directory(zygote, tmp_path):
    out = tmp_path / "out"
    assert zygote.run("print('hello'); open('made', 'w').write('x')", tmp_path, out, 30) == 0
    assert out.read_text() == "hello\n" and (tmp_path / "made").read_text() == "x"
    assert zygote.run("raise ValueError('broken example')", tmp_path, out, 30) == 1
    assert "ValueError: broken example" in out.read_text()
    assert zygote.run("import sys; sys.exit(3)", tmp_path, out, 30) == 3
    assert zygote.run("import os; os.kill(os.getpid(), 9)", tmp_path, out, 30) == 128 + 9


def test_no_state_crosses_examples_and_a_late_one_is_killed(zygote, tmp_path):
    out = tmp_path / "out"
    assert zygote.run("import actzip; actzip.left_by_an_example = 1", tmp_path, out, 30) == 0
    assert zygote.run("import actzip; assert not hasattr(actzip, 'left_by_an_example')", tmp_path, out, 30) == 0
    assert zygote.run("import time; time.sleep(60)", tmp_path, out, 1) is None
    assert zygote.run("print(__name__)", tmp_path, out, 30) == 0 and out.read_text() == "__main__\n"
