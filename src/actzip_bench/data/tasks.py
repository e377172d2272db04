"""Fine-tuning tasks generated from the running interpreter's standard library: no download, fixed by a seed.

:class:`SnippetClassification` asks which standard-library package a snippet of source comes from. Each example
is ``snippet + "\\n# package: "`` followed by one answer byte (``"0"``, ``"1"``, ...), right-padded with byte 0
(which never occurs in source) to a common length, with an attention mask and causal-LM labels that are -100
everywhere except at the answer byte. Train and test snippets come from disjoint files of each package, so the
test accuracy measures what was learned about the package, not the file. The package names themselves are
blanked out of the snippets (``asyncio`` -> ``_______``), so that the task cannot be solved by spotting them.
"""

from __future__ import annotations

import pathlib
import re
import sysconfig
from dataclasses import dataclass

import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.data.corpus import stdlib_source_files

PAD = 0  # padding byte (absent from source files)
PROMPT = b"\n# package: "
IGNORE = -100  # label of every position that is not scored


@dataclass
class SnippetTaskConfig:
    """Which packages, how long the snippets, how many examples; everything else follows from ``seed``."""

    packages: tuple[str, ...] = ("asyncio", "email", "unittest", "xml")  # one class each, in this order
    min_len: int = 64  # snippet bytes, drawn uniformly in [min_len, max_len]
    max_len: int = 160
    train_size: int = 4096  # examples
    test_size: int = 1024
    test_every: int = 4  # every test_every-th file of a package (sorted by path) is a test file
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.packages) < 2 or len(self.packages) > 10:
            raise ConfigError(f"SnippetTaskConfig.packages: 2 to 10 packages (one answer digit each), got "
                              f"{len(self.packages)}")
        if len(set(self.packages)) != len(self.packages):
            raise ConfigError(f"SnippetTaskConfig.packages: {list(self.packages)} has duplicates")
        if not (1 <= self.min_len <= self.max_len):
            raise ConfigError(f"SnippetTaskConfig: need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")
        for name in ("train_size", "test_size", "test_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (2 if name == "test_every" else 1):
                raise ConfigError(f"SnippetTaskConfig.{name} must be an int >= {2 if name == 'test_every' else 1}, "
                                  f"got {v!r}")

    @property
    def seq_len(self) -> int:
        return self.max_len + len(PROMPT) + 1


def _package_files(root: pathlib.Path, package: str, test_every: int) -> tuple[list[bytes], list[bytes]]:
    files = stdlib_source_files(root / package) if (root / package).is_dir() else []
    texts = [p.read_bytes() for p in files]
    blank = re.compile(re.escape(package.encode()))
    texts = [blank.sub(b"_" * len(package), t).replace(bytes([PAD]), b" ") for t in texts]
    train = [t for i, t in enumerate(texts) if i % test_every != test_every - 1]
    test = [t for i, t in enumerate(texts) if i % test_every == test_every - 1]
    return train, test


class SnippetClassification:
    """The examples of one :class:`SnippetTaskConfig`, as padded tensors on the CPU.

    ``split("train")`` / ``split("test")`` give ``(input_ids, attention_mask, labels, targets)``: int64
    ``[n, seq_len]`` ids and mask, labels with the answer byte at its position and -100 elsewhere, and the class
    index ``[n]``. ``answer_tokens`` are the byte values of the answers, in class order.
    """

    def __init__(self, config: SnippetTaskConfig | None = None, root: str | pathlib.Path | None = None) -> None:
        self.config = cfg = config or SnippetTaskConfig()
        root = pathlib.Path(root) if root is not None else pathlib.Path(sysconfig.get_paths()["stdlib"])
        g = torch.Generator().manual_seed(cfg.seed)
        self.answer_tokens = torch.tensor([ord("a") + i for i in range(len(cfg.packages))])
        sources = {}
        for package in cfg.packages:
            train, test = _package_files(root, package, cfg.test_every)
            if not test or sum(len(t) >= cfg.max_len for t in train) == 0 or all(len(t) < cfg.max_len for t in test):
                raise DataError(f"SnippetClassification: package {package!r} under {str(root)!r} has too few source "
                                f"files of at least {cfg.max_len} bytes for a train and a test split")
            sources[package] = (train, test)
        self._splits = {
            "train": self._make([s[0] for s in sources.values()], cfg.train_size, g),
            "test": self._make([s[1] for s in sources.values()], cfg.test_size, g),
        }

    def _make(self, per_class: list[list[bytes]], n: int, g: torch.Generator):
        cfg = self.config
        ids = torch.full((n, cfg.seq_len), PAD, dtype=torch.long)
        mask = torch.zeros(n, cfg.seq_len, dtype=torch.long)
        labels = torch.full((n, cfg.seq_len), IGNORE, dtype=torch.long)
        targets = torch.randint(len(per_class), (n,), generator=g)
        for i in range(n):
            files = [t for t in per_class[int(targets[i])] if len(t) >= cfg.max_len]
            weights = torch.tensor([float(len(t)) for t in files])  # a byte of any file equally likely
            text = files[int(torch.multinomial(weights, 1, generator=g))]
            length = int(torch.randint(cfg.min_len, cfg.max_len + 1, (1,), generator=g))
            start = int(torch.randint(len(text) - length + 1, (1,), generator=g))
            seq = text[start:start + length] + PROMPT + bytes([int(self.answer_tokens[targets[i]])])
            ids[i, :len(seq)] = torch.tensor(list(seq))
            mask[i, :len(seq)] = 1
            labels[i, len(seq) - 1] = ids[i, len(seq) - 1]
        return ids, mask, labels, targets

    def split(self, name: str):
        if name not in self._splits:
            raise ConfigError(f"SnippetClassification: split {name!r} is unknown; choose 'train' or 'test'")
        return self._splits[name]

    def __len__(self) -> int:
        return len(self.config.packages)

    def get_batch(self, split: str, batch_size: int, generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """A random batch (rows drawn with ``generator``): ``input_ids``, ``attention_mask``, ``labels``,
        ``targets``, trimmed to the longest example in the batch."""
        ids, mask, labels, targets = self.split(split)
        rows = torch.randint(ids.shape[0], (batch_size,), generator=generator)
        return self._rows(ids, mask, labels, targets, rows, device)

    def batches(self, split: str, batch_size: int, device: str | torch.device = "cpu"):
        """Every example of ``split`` once, in order, in batches of ``batch_size`` (the last may be smaller)."""
        ids, mask, labels, targets = self.split(split)
        for i in range(0, ids.shape[0], batch_size):
            yield self._rows(ids, mask, labels, targets, torch.arange(i, min(i + batch_size, ids.shape[0])), device)

    @staticmethod
    def _rows(ids, mask, labels, targets, rows, device) -> dict[str, torch.Tensor]:
        m = mask[rows]
        width = int(m.sum(1).max())
        out = {"input_ids": ids[rows, :width], "attention_mask": m[:, :width], "labels": labels[rows, :width],
               "targets": targets[rows]}
        return {k: v.to(device) for k, v in out.items()}

    def accuracy_counts(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """Correct answers in ``batch`` (a device scalar) and the batch size: the class whose answer byte has the
        highest logit at the position before the answer."""
        pos = batch["attention_mask"].sum(1) - 2  # the answer is the last real byte; it is predicted one earlier
        scores = logits[torch.arange(logits.shape[0], device=logits.device), pos][:, self.answer_tokens.to(logits.device)]
        return (scores.argmax(-1) == batch["targets"]).sum(), logits.shape[0]
