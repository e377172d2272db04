"""``actzip bench memory``: the lossless sparse cache's benchmarks in one command, each part to its own JSON.

Parts (each also a command of its own): ``kernels`` (codec throughput against the measured copy bandwidth),
``ffn`` (the residual ReLU² FFN stack; by default the sweep d = 4096 and 768 x 4k/8k/16k/32k rows x both
densities, merged into one ``ffn.json``), ``gpt`` (the reference ReLU² GPT at sequence 1024/4096/8192) and
``bits`` (bits per element against the entropy bound on a trained model). They need a CUDA device, except
``bits``. A part that fails is reported and the others still run; the exit status says whether all ran.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

PARTS = ("kernels", "ffn", "gpt", "bits")
FFN_SWEEP = {"d": (4096, 768), "rows": (4096, 8192, 16384, 32768), "density": ("mid", "low")}


def part_commands(part: str, out: Path, device: str | None, ffn_rows: tuple[int, ...] | None = None) -> list[list[str]]:
    """The ``actzip`` argument lists that make one part (the FFN sweep is one command per point)."""
    dev = ["--device", device] if device and part != "kernels" else []
    if part == "ffn":
        rows = ffn_rows or FFN_SWEEP["rows"]
        return [["bench", "ffn", "--d", str(d), "--rows", str(r), "--density", den, *dev,
                 "--json", str(out / "ffn-parts" / f"d{d}-r{r}-{den}.json")]
                for d, r, den in itertools.product(FFN_SWEEP["d"], rows, FFN_SWEEP["density"])]
    return [["bench", part, *dev, "--json", str(out / f"{part}.json")]]


def merge_ffn(out: Path) -> Path | None:
    """The sweep's points as one list in ``ffn.json`` (the report's format); the parts folder is removed."""
    parts = sorted((out / "ffn-parts").glob("*.json"))
    if not parts:
        return None
    target = out / "ffn.json"
    target.write_text(json.dumps([json.loads(p.read_text()) for p in parts], indent=1) + "\n")
    for p in parts:
        p.unlink()
    (out / "ffn-parts").rmdir()
    return target


def run_suite(out: Path, parts: tuple[str, ...], device: str | None, ffn_rows: tuple[int, ...] | None,
              run_one) -> dict[str, str]:
    """Run every part's commands with ``run_one(argv) -> exit status``; ``{part: "ok" or why it failed}``."""
    status = {}
    for part in parts:
        failed = []
        for argv in part_commands(part, out, device, ffn_rows):
            try:
                rc = run_one(argv)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - one part must not stop the others
                failed.append(f"{' '.join(argv[:2])}: {type(e).__name__}: {e}")
                continue
            if rc:
                failed.append(f"{' '.join(argv)} exited {rc}")
        if part == "ffn":
            merge_ffn(out)
        status[part] = "ok" if not failed else "; ".join(failed)
    return status
