"""Two domains from the standard library, no download: Python code without its prose, and the prose (comments
and docstrings, English) without the code; the code split by file into an early and a late part.

Pretraining on ``code_early`` and adapting on ``prose`` is domain adaptation; continuing on ``code_late`` (other
modules, the same kind of text) is continual pretraining. Files are taken in sorted path order and split with
Python's own tokenizer; a file it cannot tokenize is left out.
"""

from __future__ import annotations

import io
import tokenize

from actzip.errors import DataError
from actzip_bench.data.corpus import Corpus, stdlib_source_files

__all__ = ["DOMAINS", "domain_corpora", "split_code_and_prose"]

DOMAINS = ("code_early", "code_late", "prose")


def split_code_and_prose(source: str) -> tuple[str, str]:
    """``(code, prose)`` of one Python source: comments and docstrings (string statements) go to the prose,
    one per line; everything else stays in the code, with those spans blanked out and blank lines dropped."""
    lines = source.splitlines(keepends=True)
    prose, cut = [], []  # cut: ((row, col), (row, col)) spans to remove from the code
    previous = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            prose.append(tok.string.lstrip("#").strip())
            cut.append((tok.start, tok.end))
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT,
                                                          tokenize.DEDENT):
            prose.append(" ".join(tok.string.strip("\"'rRbBuUfF").split()))
            cut.append((tok.start, tok.end))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    keep = [list(line) for line in lines]
    for (r0, c0), (r1, c1) in cut:
        for r in range(r0, r1 + 1):
            row = keep[r - 1]
            lo = c0 if r == r0 else 0
            hi = c1 if r == r1 else len(row)
            for c in range(lo, min(hi, len(row))):
                if row[c] != "\n":
                    row[c] = ""
    code = "".join(line for line in ("".join(row) for row in keep) if line.strip())
    return code, "\n".join(p for p in prose if p) + "\n"


def domain_corpora(max_bytes: int = 2_000_000, val_fraction: float = 0.1) -> dict[str, Corpus]:
    """``{"code_early", "code_late", "prose"}``: each up to ``max_bytes`` bytes (see the module docstring)."""
    files = sorted(stdlib_source_files(), key=lambda p: p.as_posix())
    if not files:
        raise DataError("domain_corpora: no standard-library .py files found")
    half = len(files) // 2
    parts: dict[str, list[bytes]] = {d: [] for d in DOMAINS}
    sizes = dict.fromkeys(DOMAINS, 0)
    for i, path in enumerate(files):
        code_name = "code_early" if i < half else "code_late"
        if sizes[code_name] >= max_bytes and sizes["prose"] >= max_bytes:
            if i < half:
                continue
            break
        try:
            code, prose = split_code_and_prose(path.read_text(encoding="utf-8"))
        except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, IndentationError, OSError):
            continue
        for name, text in ((code_name, code), ("prose", prose)):
            if sizes[name] < max_bytes:
                data = text.encode("utf-8")
                parts[name].append(data)
                sizes[name] += len(data)
    out = {}
    for name in DOMAINS:
        data = b"".join(parts[name])[:max_bytes]
        if not data:
            raise DataError(f"domain_corpora: the {name} domain came out empty")
        out[name] = Corpus.from_bytes(data, val_fraction=val_fraction, name=f"stdlib-{name}")
    return out
