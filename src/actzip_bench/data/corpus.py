"""Byte-level text corpora that need no download.

A :class:`Corpus` is a 1-D ``torch.uint8`` tensor of bytes (token id = byte value, so vocabulary 256)
with a fixed train/val split: train is the first ``1 - val_fraction`` of the bytes, val the rest.
The default source is the running interpreter's standard library, whose ``.py`` files are always
present; the concatenated bytes are cached on disk so later runs skip the directory walk.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import sys
import sysconfig
import tempfile
import warnings
from typing import Iterable

import torch

from actzip.errors import ConfigError, DataError

__all__ = ["Corpus", "stdlib_source_files", "decode", "default_cache_dir"]

# Third-party packages and bytecode caches are not the standard library.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_SPLITS = ("train", "val")


def _stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def stdlib_source_files(root: str | os.PathLike[str] | None = None) -> list[pathlib.Path]:
    """The ``.py`` files under ``root`` (default: this interpreter's standard library).

    ``site-packages``, ``dist-packages`` and ``__pycache__`` directories are skipped. The order is
    sorted by the path relative to ``root`` as a posix string, so it does not depend on the
    filesystem's listing order.
    """
    root = _stdlib_root() if root is None else pathlib.Path(root)
    if not root.is_dir():
        raise DataError(f"stdlib_source_files: root {str(root)!r} is not a directory")
    found: list[tuple[str, pathlib.Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning in place stops os.walk from descending into skipped directories at all.
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for filename in filenames:
            if filename.endswith(".py"):
                path = pathlib.Path(dirpath, filename)
                if path.is_file():
                    found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    return [path for _, path in found]


def default_cache_dir() -> pathlib.Path:
    """``$ACTZIP_CACHE_DIR`` if set, else ``~/.cache/actzip``."""
    env = os.environ.get("ACTZIP_CACHE_DIR")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "actzip"


def decode(tokens: torch.Tensor | bytes | bytearray | Iterable[int]) -> str:
    """Byte tokens back to text (invalid UTF-8 becomes U+FFFD rather than an error)."""
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().reshape(-1).tolist()
    try:
        raw = bytes(tokens)
    except (TypeError, ValueError) as exc:
        raise DataError(f"decode: tokens must be byte values in [0, 255] ({exc})") from None
    return raw.decode("utf-8", errors="replace")


def _check_val_fraction(val_fraction: float) -> float:
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not (
        0.0 < val_fraction < 1.0
    ):
        raise ConfigError(f"val_fraction must be a number in (0, 1), got {val_fraction!r}")
    return float(val_fraction)


def _check_positive_int(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return value


def _read_bytes(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"corpus file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"corpus path {str(path)!r} is a directory, not a file") from None
    except OSError as exc:
        raise DataError(f"corpus file {str(path)!r} cannot be read: {exc.strerror or exc}") from None


def _to_tensor(data: bytes) -> torch.Tensor:
    # frombuffer shares memory; a bytearray gives it a writable buffer that the tensor keeps alive.
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    # Write next to the target, then rename: a reader sees either no file or the whole file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Corpus:
    """A byte sequence with a fixed train/val split.

    Build one with :meth:`from_stdlib`, :meth:`from_file` or :meth:`from_bytes`, or directly from a
    1-D ``torch.uint8`` tensor.
    """

    vocab_size: int = 256  # one token per byte value

    def __init__(self, data: torch.Tensor, val_fraction: float = 0.1, name: str = "corpus") -> None:
        val_fraction = _check_val_fraction(val_fraction)
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
            if isinstance(data, torch.Tensor):
                got = f"{data.dtype} tensor of shape {tuple(data.shape)}"
            else:
                got = type(data).__name__
            raise DataError(f"Corpus {name!r}: data must be a 1-D torch.uint8 tensor, got {got}")
        if data.numel() == 0:
            raise DataError(f"Corpus {name!r}: data is empty")
        self.data = data
        self.name = name
        self.val_fraction = val_fraction
        # round(), not int(): 0.9 * n can land just below an integer in floating point.
        self.n_train = round(data.numel() * (1.0 - val_fraction))
        self.cache_path: pathlib.Path | None = None  # set by from_stdlib to the file it used

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_bytes(cls, data: bytes, val_fraction: float = 0.1, name: str = "bytes") -> "Corpus":
        """A corpus of the given bytes."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DataError(f"Corpus.from_bytes: data must be bytes, got {type(data).__name__}")
        return cls(_to_tensor(bytes(data)), val_fraction=val_fraction, name=name)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], val_fraction: float = 0.1) -> "Corpus":
        """A corpus of one file's bytes (any text file; its encoding is not interpreted)."""
        val_fraction = _check_val_fraction(val_fraction)
        path = pathlib.Path(path)
        data = _read_bytes(path)
        if not data:
            raise DataError(f"corpus file {str(path)!r} is empty")
        return cls(_to_tensor(data), val_fraction=val_fraction, name=str(path))

    @classmethod
    def from_stdlib(
        cls,
        max_bytes: int = 16_000_000,
        val_fraction: float = 0.1,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> "Corpus":
        """The standard library's ``.py`` files, each followed by ``\\n``, cut at ``max_bytes``.

        The result is cached in ``cache_dir`` (default :func:`default_cache_dir`) under a name that
        hashes the Python version, the files used, their sizes and ``max_bytes``, so a different
        interpreter or limit never reads a stale cache.
        """
        max_bytes = _check_positive_int("max_bytes", max_bytes)
        val_fraction = _check_val_fraction(val_fraction)
        root = _stdlib_root()
        files = stdlib_source_files(root)
        if not files:
            raise DataError(f"Corpus.from_stdlib: no .py files found under {str(root)!r}")

        # Choose the files from their sizes alone, so a cache hit reads no source file.
        chosen: list[tuple[str, pathlib.Path, int]] = []
        total = 0
        for path in files:
            try:
                size = path.stat().st_size
            except OSError as exc:
                raise DataError(f"stdlib file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
            chosen.append((path.relative_to(root).as_posix(), path, size))
            total += size + 1  # + the "\n" separator
            if total >= max_bytes:
                break
        expected = min(total, max_bytes)

        h = hashlib.sha256()
        h.update(f"{sys.implementation.name}-{platform.python_version()}\0{max_bytes}\0".encode())
        for rel, _, size in chosen:
            h.update(f"{rel}\0{size}\0".encode())
        cache_root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cache_path = cache_root / f"stdlib-py{platform.python_version()}-{h.hexdigest()[:16]}.bin"
        name = f"stdlib-py{platform.python_version()}"

        cached = cls._load_cache(cache_path, expected)
        if cached is not None:
            corpus = cls(_to_tensor(cached), val_fraction=val_fraction, name=name)
            corpus.cache_path = cache_path
            return corpus

        parts: list[bytes] = []
        for _, path, _ in chosen:
            parts.append(_read_bytes(path))
            parts.append(b"\n")
        data = b"".join(parts)[:max_bytes]
        try:
            _write_atomic(cache_path, data)
        except OSError as exc:
            # The corpus is still usable; only the next run pays for the walk again.
            warnings.warn(
                f"Corpus.from_stdlib: could not write cache file {str(cache_path)!r}: {exc.strerror or exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            cache_path = None
        corpus = cls(_to_tensor(data), val_fraction=val_fraction, name=name)
        corpus.cache_path = cache_path
        return corpus

    @staticmethod
    def _load_cache(path: pathlib.Path, expected_len: int) -> bytes | None:
        """The cached bytes, or None when absent, unreadable or of the wrong length (then rebuilt)."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        # A source file edited since its size was hashed would change the length; rebuild then.
        return data if len(data) == expected_len else None

    # ---- access -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.data.numel()

    def __repr__(self) -> str:
        n_val = len(self) - self.n_train
        return f"Corpus(name={self.name!r}, bytes={len(self)}, train={self.n_train}, val={n_val})"

    def split(self, name: str) -> torch.Tensor:
        """The "train" or "val" bytes (a view, not a copy)."""
        if name == "train":
            return self.data[: self.n_train]
        if name == "val":
            return self.data[self.n_train :]
        raise ConfigError(f"split {name!r} is unknown; choose one of {list(_SPLITS)}")

    def get_batch(
        self,
        split: str,
        batch_size: int,
        block_size: int,
        generator: torch.Generator | None = None,
        device: str | torch.device = "cpu",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of ``split``: ``x`` and ``y = x`` shifted one byte ahead, int64 ``(B, T)``.

        Offsets come from ``generator`` (a CPU ``torch.Generator``), so equal seeds give equal batches.
        """
        batch_size = _check_positive_int("batch_size", batch_size)
        block_size = _check_positive_int("block_size", block_size)
        data = self.split(split)
        n = data.numel()
        if n < block_size + 1:
            raise DataError(
                f"split {split!r} of corpus {self.name!r} has {n} bytes, fewer than block_size + 1 "
                f"({block_size + 1}) needed for one (x, y) window"
            )
        # Highest start is n - block_size - 1 so that y's last byte is still inside the split.
        starts = torch.randint(n - block_size, (batch_size,), generator=generator)
        windows = data[starts[:, None] + torch.arange(block_size + 1)].long()
        x = windows[:, :-1].contiguous()
        y = windows[:, 1:].contiguous()
        device = torch.device(device)
        if device.type == "cuda":
            # Pinned host memory lets the copy overlap with compute already queued on the GPU.
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)
