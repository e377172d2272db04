"""The fenced code blocks of the project's markdown, and how each kind is checked (see tests/test_examples.py).

A block opts out only with an HTML comment on the line before its fence (blank lines between allowed):

    <!-- example: skip (why it cannot run here) -->
    <!-- example: slow -->        (runs, with the longer timeout and the ``slow`` mark)
    <!-- example: cuda -->        (runs where a CUDA device is, and is skipped, saying so, elsewhere)
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PYTHON_LANGS = {"python", "py", "python3"}
SHELL_LANGS = {"bash", "sh", "shell", "console", "shell-session"}
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<kind>skip|slow|cuda)\b\s*(?:\((?P<reason>.*)\))?\s*-->\s*$")
SHELL_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}
PYTHONS = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")


@dataclass
class Block:
    """One fenced block: where it is, its language, its text and what its marker says."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str  # the info string's first word, lower-cased ("" for none)
    code: str
    marker: str | None = None  # "skip", "slow", "cuda" or None
    reason: str | None = None  # the skip marker's reason

    def id(self, root: Path) -> str:
        """``file:line``, the file relative to ``root`` when it is inside it."""
        path = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path.name
        return f"{path}:{self.line}"


def find_blocks(path: Path) -> list[Block]:
    """Every fenced block of a markdown file, with the marker on the line before it, if any."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m["fence"], i
        body = []
        i += 1
        while i < len(lines) and not lines[i].lstrip().startswith(fence):
            body.append(lines[i][len(m["indent"]):] if lines[i].startswith(m["indent"]) else lines[i])
            i += 1
        block = Block(path, start + 1, m["info"].lower(), "\n".join(body) + "\n")
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        mark = MARKER.match(lines[prev]) if prev >= 0 else None
        if mark:
            block.marker, block.reason = mark["kind"], (mark["reason"] or "").strip() or None
        out.append(block)
        i += 1
    return out


_zygote = None  # the example_zygote.Zygote of this session, started at the first example


def _zygote_for(src: Path):
    global _zygote
    if _zygote is None and hasattr(os, "fork"):
        import atexit

        from example_zygote import Zygote

        _zygote = Zygote(src)
        atexit.register(_zygote.close)
    return _zygote


def run_python(block: Block, src: Path, cwd: Path, timeout: float) -> str | None:
    """Run the block as a fresh interpreter would (``PYTHONPATH`` = ``src``, in ``cwd``): forked from a process
    that has imported torch and actzip (example_zygote), or a new interpreter where there is no fork; None, or
    why it failed."""
    late = (f"did not finish within {timeout:.0f} s (a long example needs `<!-- example: slow -->` before its "
            "fence)")
    zygote = _zygote_for(src)
    if zygote is not None:
        out = cwd / ".example-output"
        rc = zygote.run(block.code, cwd, out, timeout)
        text = out.read_text(errors="replace") if out.exists() else ""
        out.unlink(missing_ok=True)
        if rc is None:
            return late
        return f"exited {rc}:\n{text[-3000:]}" if rc else None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    try:
        r = subprocess.run([sys.executable, "-c", block.code], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return late
    if r.returncode:
        return f"exited {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}"
    return None


def shell_commands(code: str, lang: str = "bash") -> list[list[str]]:
    """The simple commands of a shell block: continuations joined, comments dropped, split at ``&&``, ``|``, ``;``
    (``console`` blocks: only the ``$ `` lines). Leading ``VAR=value`` assignments are dropped."""
    text = code.replace("\\\n", " ")
    if lang in ("console", "shell-session"):
        text = "\n".join(ln.lstrip()[2:] for ln in text.splitlines() if ln.lstrip().startswith("$ "))
    commands = []
    for line in text.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split, lex.commenters = True, "#"
        words: list[str] = []
        skip_next = False
        for tok in [*lex, ";"]:
            if skip_next:  # the file of a redirection
                skip_next = False
                continue
            if set(tok) <= set("<>&") and set(tok) & set("<>"):  # >, >>, 2>&1, <: not arguments
                if words and words[-1].isdigit():
                    words.pop()
                skip_next = True
                continue
            if tok in SHELL_OPERATORS or set(tok) <= set("&|;()"):
                while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                    words.pop(0)
                if words:
                    commands.append(words)
                words = []
            else:
                words.append(tok)
    return commands


def check_command(words: list[str], repo: Path, parse_actzip) -> str | None:
    """None if the command is one this check knows and it holds up, else why not; commands it does not know
    (``cd``, ``pip``, ...) return None. ``parse_actzip(argv)`` raises SystemExit on options it rejects."""
    head = words[0]
    if head == "actzip" or head.endswith("/actzip"):
        return _parse(parse_actzip, words[1:])
    if PYTHONS.match(head) and len(words) > 2 and words[1] == "-m":
        module, argv = words[2], words[3:]
        if module in ("actzip_bench", "actzip_bench.cli"):
            return _parse(parse_actzip, argv)
        return module_problem(module)
    if head in ("bash", "sh") and len(words) > 1 and not words[1].startswith("-"):
        script = repo / words[1]
        if not script.is_file():
            return f"{head} {words[1]}: no such script"
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        return f"bash -n {words[1]}: {r.stderr.strip()}" if r.returncode else None
    return None


def module_problem(module: str) -> str | None:
    """None if ``python -m module`` finds something to run: a module, or a package with a ``__main__``."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            if importlib.util.find_spec(f"{module}.__main__") is None:
                return f"python -m {module}: {module} is a package with no __main__ module"
    except (ImportError, ValueError) as e:
        return f"python -m {module}: no such module ({type(e).__name__}: {e})"
    return None if spec is not None else f"python -m {module}: no such module"


def _parse(parse_actzip, argv: list[str]) -> str | None:
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO

    err = StringIO()
    try:
        with redirect_stdout(StringIO()), redirect_stderr(err):
            parse_actzip(argv)
    except SystemExit as e:
        if e.code:
            return f"actzip {' '.join(argv)}: the command line is rejected: {err.getvalue().strip()}"
    return None


def checked_commands(commands: list[list[str]]) -> list[list[str]]:
    """The commands :func:`check_command` knows (the ones a block must hold at least one of to be checked)."""
    return [w for w in commands if w[0] == "actzip" or w[0].endswith("/actzip")
            or (PYTHONS.match(w[0]) and len(w) > 2 and w[1] == "-m") or w[0] in ("bash", "sh")]
