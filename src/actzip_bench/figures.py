"""Figures in README.md and docs/*.md rendered from the committed results, never typed by hand.

A figure block in markdown is

    <!-- figure: NAME -->
    ...what renderer NAME makes from results/...
    <!-- /figure -->

or the same on one line, inside a sentence (``text <!-- figure: NAME -->...<!-- /figure --> text``). A renderer
reads named files under results/ and returns markdown that names them. ``actzip report`` re-renders every
block in place (:func:`update`); ``actzip report --check`` lists the blocks that differ (:func:`stale`).

:func:`stray_figures` finds figures typed outside blocks: see :data:`FIGURE`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench import (figures_cache_host, figures_cache_roles, figures_compressors_docs, figures_ffn_public, figures_grpo, figures_kernel_variants,
                          figures_link_calibration, figures_lora_docs, figures_mask_keep, figures_memory,
                          figures_memory_docs, figures_one_liner, figures_presets_seeds, figures_prompt, figures_split,
                          figures_split_link,
                          figures_wire, figures_wire_baselines, figures_wire_docs, figures_wire_paper,
                          report_decentralized)

RENDERERS = {**figures_memory.RENDERERS, **figures_wire.RENDERERS, **figures_wire_baselines.RENDERERS,
             **figures_memory_docs.RENDERERS, **figures_lora_docs.RENDERERS, **figures_wire_docs.RENDERERS,
             **figures_compressors_docs.RENDERERS, **figures_presets_seeds.RENDERERS,
             **figures_ffn_public.RENDERERS, **figures_one_liner.RENDERERS, **report_decentralized.RENDERERS,
             **figures_link_calibration.RENDERERS, **figures_grpo.RENDERERS,
             **figures_mask_keep.RENDERERS, **figures_kernel_variants.RENDERERS, **figures_split.RENDERERS,
             **figures_prompt.RENDERERS, **figures_wire_paper.RENDERERS, **figures_cache_host.RENDERERS,
             **figures_cache_roles.RENDERERS, **figures_split_link.RENDERERS}

BLOCK = re.compile(r"<!-- figure: (?P<name>[\w.-]+) -->(?P<body>.*?)<!-- /figure -->", re.S)
OPEN, CLOSE = re.compile(r"<!-- figure:"), re.compile(r"<!-- /figure -->")
GENERATED = ("docs/RESULTS.md",)  # written whole by the report: no blocks of its own

# A figure is a number followed by a unit that measures something: %, ×, x as in 3.5x (not 0x1F nor 32x256),
# bytes (B/KiB/MiB/GiB, KB/MB/GB/TB, also per second), Mbit/s / Mbps / Gbit/s, ms. Version pins (torch==2.13.0),
# list numbers (1.), sizes (d=4096, 124M) and counts (two seeds) carry no such unit, so they are not figures.
FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:%|×|x(?!\w)|(?:[KMGT]i?B|B)(?:/s)?(?!\w)|[MG]bit/s|[MG]bps(?!\w)"
                    r"|ms(?!\w))")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]+`")


@dataclass(frozen=True)
class Block:
    """One figure block of a file: its renderer's name, its current body and its line."""
    path: Path
    name: str
    body: str
    line: int
    start: int
    end: int


def blocks(path: Path) -> list[Block]:
    """The figure blocks of a markdown file; a ConfigError for a marker left open or closed twice."""
    text = Path(path).read_text()
    found = [Block(Path(path), m["name"], m["body"], text.count("\n", 0, m.start()) + 1, m.start("body"),
                   m.end("body")) for m in BLOCK.finditer(text)]
    if len(OPEN.findall(text)) != len(found) or len(CLOSE.findall(text)) != len(found):
        raise ConfigError(f"figure: {path} has a `<!-- figure: NAME -->` marker without its `<!-- /figure -->` "
                          "(or one that is not `<!-- figure: NAME -->`)")
    return found


def render(name: str, root: Path) -> str:
    """What renderer ``name`` makes from ``root/results``; a ConfigError naming the known ones for any other."""
    if name not in RENDERERS:
        raise ConfigError(f"figure: no renderer named {name!r}; known: {', '.join(sorted(RENDERERS))}")
    return RENDERERS[name](Path(root)).strip()


def _body(block: Block, text: str) -> str:
    """A rendered text laid out as the block was: on lines of its own, or inline within a sentence."""
    if block.body.startswith("\n"):
        return f"\n{text}\n"
    if "\n" in text:
        raise ConfigError(f"figure: {block.path}:{block.line}: {block.name!r} renders several lines; put its markers "
                          "on lines of their own")
    return text


def marked_files(root: Path) -> list[Path]:
    """README.md and every docs/*.md (the generated report excepted) that exist under ``root``."""
    root = Path(root)
    docs = sorted(p for p in (root / "docs").glob("*.md") if p.relative_to(root).as_posix() not in GENERATED)
    return [p for p in (root / "README.md", *docs) if p.is_file()]


def rendered(path: Path, root: Path) -> str:
    """The text of ``path`` with every figure block re-rendered from ``root/results``."""
    text = Path(path).read_text()
    out, at = [], 0
    for b in blocks(path):
        out += [text[at:b.start], _body(b, render(b.name, root))]
        at = b.end
    return "".join(out) + text[at:]


def stale(root: Path) -> list[str]:
    """Every figure block under ``root`` whose text differs from what its renderer makes now, as
    ``file:line: name``; empty when all are current. Writes nothing."""
    root = Path(root)
    out = []
    for path in marked_files(root):
        for b in blocks(path):
            if b.body != _body(b, render(b.name, root)):
                out.append(f"{path.relative_to(root).as_posix()}:{b.line}: {b.name}")
    return out


def update(root: Path) -> list[Path]:
    """Re-render every figure block under ``root`` in place; the files that changed."""
    changed = []
    for path in marked_files(Path(root)):
        new = rendered(path, root)
        if new != path.read_text():
            path.write_text(new)
            changed.append(path)
    return changed


def stray_figures(text: str) -> list[str]:
    """Figures (see :data:`FIGURE`) in markdown prose outside figure blocks, fenced code and inline code, each as
    ``line N: the line``."""
    kept = BLOCK.sub(lambda m: "\n" * m[0].count("\n"), text)
    kept = FENCE.sub(lambda m: "\n" * m[0].count("\n"), kept)
    kept = INLINE_CODE.sub("", kept)
    return [f"line {n}: {line.strip()}" for n, line in enumerate(kept.split("\n"), 1) if FIGURE.search(line)]
