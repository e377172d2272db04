"""Every fenced code block of README.md and docs/*.md (docs/RESULTS.md is generated: not read) is checked.

- ```python blocks run, each in a fresh interpreter with ``PYTHONPATH=src``, in an empty temporary directory
  (so an example cannot read or litter the checkout), under a timeout of :data:`TIMEOUT_S` seconds
  (:data:`SLOW_TIMEOUT_S` and the ``slow`` mark for a block marked ``<!-- example: slow -->``). A block passes
  when it exits 0: an example that only works with names it never defines fails.
- ```bash / ```sh / ```shell / ```console blocks are not run (they install packages, train models, need
  GPUs). Each simple command in them (split at ``&&``, ``|``, ``;``, continuations joined, comments dropped)
  is checked for what it is: ``actzip ...`` and ``python -m actzip_bench ...`` have their whole command line
  parsed by the real ``actzip`` parser (subcommand, every option, choices and types: more than ``--help``
  would check, and in-process, so fast); ``python -m MODULE ...`` must name a module that exists
  (``importlib.util.find_spec``; its own options are not checked); ``bash SCRIPT`` must name a script of the
  repository that ``bash -n`` parses. Other commands (``cd``, ``pip``, ...) are not checked, and a shell
  block holding none of the checked kinds fails, so that nothing passes unread.
- Blocks with no language, or another one (diagrams, pseudo-code, output), are text: not checked.

A block opts out only with ``<!-- example: skip (reason) -->`` on the line before its fence; the reason is
the skip message pytest prints (``-ra``). ``<!-- example: cuda -->`` runs a block only where a CUDA device is
(skipped, saying so, elsewhere). Test ids name the file and the line of the fence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from examples_runner import (PYTHON_LANGS, SHELL_LANGS, Block, check_command, checked_commands, find_blocks,
                             module_problem, run_python, shell_commands)

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60
SLOW_TIMEOUT_S = 300
GENERATED = {"docs/RESULTS.md"}  # written by `actzip report`; its figures are checked by tests/actzip_bench


def _markdown() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").glob("*.md") if str(p.relative_to(REPO)) not in GENERATED)
    return [REPO / "README.md", *docs]


def _blocks(langs: set[str]) -> list:
    out = []
    for path in _markdown():
        for b in find_blocks(path):
            if b.lang in langs:
                marks = [pytest.mark.slow] if b.marker == "slow" else []
                out.append(pytest.param(b, id=b.id(REPO), marks=marks))
    return out


def _skip_if_marked(block: Block) -> None:
    if block.marker == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip(f"{block.id(REPO)}: needs a CUDA device (<!-- example: cuda -->)")
    if block.marker == "skip":
        assert block.reason, (f"{block.id(REPO)}: `<!-- example: skip -->` needs a reason: "
                              "`<!-- example: skip (why) -->`")
        pytest.skip(f"{block.id(REPO)}: {block.reason}")


@pytest.mark.parametrize("block", _blocks(PYTHON_LANGS))
def test_python_example_runs(block: Block, tmp_path):
    _skip_if_marked(block)
    timeout = SLOW_TIMEOUT_S if block.marker == "slow" else TIMEOUT_S
    failure = run_python(block, REPO / "src", tmp_path, timeout)
    if failure:
        pytest.fail(f"{block.id(REPO)}: the example {failure}", pytrace=False)


@pytest.fixture(scope="module")
def parse_actzip():
    from actzip_bench.cli import build_parser

    return build_parser().parse_args


@pytest.mark.parametrize("block", _blocks(SHELL_LANGS))
def test_shell_example_commands_parse(block: Block, parse_actzip):
    _skip_if_marked(block)
    commands = checked_commands(shell_commands(block.code, block.lang))
    assert commands, (f"{block.id(REPO)}: no actzip, python -m or bash command in this block to check; mark it "
                      "`<!-- example: skip (reason) -->` or give it another language")
    problems = [p for w in commands if (p := check_command(w, REPO, parse_actzip))]
    if problems:
        pytest.fail(f"{block.id(REPO)}:\n" + "\n".join(problems), pytrace=False)


# -- the checks themselves, on a small markdown file ------------------------------------------------------------


def test_blocks_markers_and_failures_are_found(tmp_path, parse_actzip):
    md = tmp_path / "page.md"
    md.write_text("# page\n\n```python\nprint('ok')\n```\n\n<!-- example: skip (needs a GPU) -->\n\n```python\n"
                  "import nothing_here\n```\n\n```python\nundefined_name\n```\n\n<!-- example: cuda -->\n```bash\n"
                  "actzip bench wire --quick --json out.json && actzip bench nope\npython -m no_such_module_here\n"
                  "bash scripts/missing.sh  # gone\n```\n\n```\ndiagram\n```\n")
    blocks = find_blocks(md)
    assert [(b.line, b.lang, b.marker) for b in blocks] == [
        (3, "python", None), (9, "python", "skip"), (13, "python", None), (18, "bash", "cuda"), (24, "", None)]
    assert blocks[1].reason == "needs a GPU"
    with pytest.raises(pytest.skip.Exception, match="page.md:9: needs a GPU"):
        _skip_if_marked(blocks[1])
    blocks[1].reason = None  # a skip must say why
    with pytest.raises(AssertionError, match="needs a reason"):
        _skip_if_marked(blocks[1])
    assert run_python(blocks[0], REPO / "src", tmp_path, TIMEOUT_S) is None
    assert "NameError: name 'undefined_name'" in run_python(blocks[2], REPO / "src", tmp_path, TIMEOUT_S)
    commands = shell_commands(blocks[3].code)
    assert commands == [["actzip", "bench", "wire", "--quick", "--json", "out.json"], ["actzip", "bench", "nope"],
                        ["python", "-m", "no_such_module_here"], ["bash", "scripts/missing.sh"]]
    problems = [check_command(w, REPO, parse_actzip) for w in commands]
    assert problems[0] is None
    assert "actzip bench nope: the command line is rejected" in problems[1] and "invalid choice" in problems[1]
    assert "no such module" in problems[2] and "no such script" in problems[3]
    assert check_command(["bash", "scripts/bootstrap.sh"], REPO, parse_actzip) is None
    assert check_command(["python", "-m", "actzip_bench", "report", "--root", "."], REPO, parse_actzip) is None


# -- the repository's own scripts ------------------------------------------------------------------------------


@pytest.mark.parametrize("script", sorted((REPO / "scripts").glob("*.sh")), ids=lambda p: f"scripts/{p.name}")
def test_script_parses_and_its_python_modules_exist(script: Path):
    """``bash -n`` passes, and every ``python3 -m MODULE`` in the script names something ``-m`` can run (its
    arguments are the script's business: they are built from shell variables)."""
    import re
    import subprocess

    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    modules = sorted(set(re.findall(r"\bpython3? -m ([\w.]+)", script.read_text())))
    assert modules, f"scripts/{script.name} runs no python -m: nothing checked"
    problems = [p for m in modules if (p := module_problem(m))]
    assert not problems, f"scripts/{script.name}: " + "; ".join(problems)
