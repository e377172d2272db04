"""What every command shares: configs from the options given, the device, the command line, JSON output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from actzip.errors import ConfigError

# Options given as comma-separated lists on the command line, and the type of their items.
LIST_OPTIONS = {"strategies": str, "seq_lens": int, "presets": str, "methods": str, "compressors": str, "policies": str,
                "bandwidths": float, "stage_lr_scale": float, "tasks": str, "seeds": int, "shaped_link": float,
                "cells": str}


def config_from_args(cls, args: argparse.Namespace):
    """A config dataclass from the options the user gave (the others keep the dataclass defaults)."""
    fields = {k: v for k, v in vars(args).items() if k in cls.__dataclass_fields__ and v is not None}
    for key, item in LIST_OPTIONS.items():
        if isinstance(fields.get(key), str):
            try:
                fields[key] = tuple(item(p) for p in fields[key].split(","))
            except ValueError:
                raise ConfigError(f"--{key.replace('_', '-')} takes comma-separated {item.__name__} values, "
                                  f"got {fields[key]!r}") from None
    return cls(**fields)


def device_from_args(args: argparse.Namespace):
    """``--device``, or CUDA when there is one (torch imported here: ``actzip --help`` stays fast)."""
    import torch

    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def command_line(args: argparse.Namespace) -> str:
    """The command as typed, recorded in every JSON so that a result says how it was made."""
    return " ".join(["actzip", *args.argv])


def write_json(record: dict, path: str | None, console) -> None:
    """``record`` to ``path`` (parents created), when a path was given."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(record, indent=2) + "\n")
        console.print(f"wrote {path}")


def write_json_and_plot(record: dict, path: str | None, console, plot) -> None:
    """:func:`write_json`, then ``plot(record, png)`` beside it (its name with ``.png``), when a path was given."""
    write_json(record, path, console)
    if path:
        png = Path(path).with_suffix(".png")
        plot(record, png)
        console.print(f"wrote {png}")


def write_partial(record: dict, args: argparse.Namespace, console) -> None:
    """The entries finished so far, to --json (overwritten by the full record at the end)."""
    if args.json:
        record["command"] = command_line(args)
        record["partial"] = True
        write_json(record, args.json, console)
