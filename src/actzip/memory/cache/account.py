"""Per-step accounting of what the activation cache stored: bytes before and after, by rule.

``print(cache.last)`` shows the account as a plain-text table; :meth:`StepAccount.table` gives the same rows as
a ``rich`` table for programs that render with rich (an optional dependency).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from actzip.errors import MissingDependencyError

__all__ = ["RuleStats", "StepAccount"]

COLUMNS = ("rule", "tensors", "before", "after", "ratio")
TOTAL = "total (no leaf)"
COMPILED = "compiled"  # the rule name of a compiled graph's saves, kept uncompressed


@dataclass
class RuleStats:
    """What one rule decided in a step."""

    tensors: int = 0  # distinct tensors this rule decided
    dense_bytes: int = 0  # their size uncompressed
    stored_bytes: int = 0  # what the cache holds for them


@dataclass
class StepAccount:
    """What one ``with`` block of a cache saved. Duplicates are counted once; ``str()`` is a table.

    ``leaf`` tensors (parameters, inputs held elsewhere) are listed but left out of the activation totals:
    they are not activations and storing them costs nothing extra.
    """

    _by_rule: dict[str, RuleStats] = field(default_factory=dict)
    duplicates: int = 0  # saves answered by an already stored tensor
    duplicate_bytes: int = 0  # dense bytes those saves would have taken again
    # tensors torch.compile'd graphs saved through the rules inside the graph (actzip.memory.cache.graph_hooks)
    compiled_saves: int = 0
    # tensors a torch.compile'd graph saved where the rules could not run in the graph, kept uncompressed
    # (actzip.memory.cache.compiled)
    uncompressed_compiled: int = 0
    uncompressed_compiled_bytes: int = 0
    # Stored sizes known only on the device (arena payloads), summed when the account is first read.
    _deferred: dict[str, list] = field(default_factory=dict, repr=False)

    def add(self, rule: str, dense_bytes: int, stored_bytes) -> None:
        """Account one tensor. ``stored_bytes`` may be a one-element device tensor: it is read (a host
        synchronization) only when the account is read, never while the step runs."""
        s = self._by_rule.setdefault(rule, RuleStats())
        s.tensors += 1
        s.dense_bytes += dense_bytes
        if isinstance(stored_bytes, int):
            s.stored_bytes += stored_bytes
        else:
            self._deferred.setdefault(rule, []).append(stored_bytes)

    def add_compiled(self, dense_bytes: int) -> None:
        """Account one tensor a compiled graph saved, kept as it is (in the totals, under ``compiled``)."""
        self.add(COMPILED, dense_bytes, dense_bytes)
        self.uncompressed_compiled += 1
        self.uncompressed_compiled_bytes += dense_bytes

    def _settle(self) -> None:
        for rule, parts in self._deferred.items():
            self._by_rule[rule].stored_bytes += int(torch.stack([p.reshape(()) for p in parts]).sum())
        self._deferred.clear()

    @property
    def by_rule(self) -> dict[str, RuleStats]:
        """Stats per rule name (reading it settles device-side sizes: a host synchronization)."""
        self._settle()
        return self._by_rule

    def _activation_rules(self):
        self._settle()
        return (s for name, s in self.by_rule.items() if name != "leaf")

    @property
    def bytes_before(self) -> int:
        """Activation bytes autograd would have kept (distinct tensors, leaves excluded)."""
        return sum(s.dense_bytes for s in self._activation_rules())

    @property
    def bytes_after(self) -> int:
        """Activation bytes the cache keeps (distinct tensors, leaves excluded)."""
        return sum(s.stored_bytes for s in self._activation_rules())

    @property
    def ratio(self) -> float:
        return self.bytes_before / self.bytes_after if self.bytes_after else 1.0

    def as_dict(self) -> dict:
        self._settle()
        return {
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "duplicates": self.duplicates,
            "duplicate_bytes": self.duplicate_bytes,
            "compiled_saves": self.compiled_saves,
            "uncompressed_compiled": self.uncompressed_compiled,
            "uncompressed_compiled_bytes": self.uncompressed_compiled_bytes,
            "by_rule": {k: vars(v).copy() for k, v in self.by_rule.items()},
        }

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """The table's rows, as text: one per rule (sorted by name), then the activation total."""
        rows = []
        for name, s in sorted(self.by_rule.items()):
            r = s.dense_bytes / s.stored_bytes if s.stored_bytes else 1.0
            rows.append((name, str(s.tensors), _mib(s.dense_bytes), _mib(s.stored_bytes), f"{r:.2f}x"))
        rows.append((TOTAL, "", _mib(self.bytes_before), _mib(self.bytes_after), f"{self.ratio:.2f}x"))
        return rows

    def caption(self) -> str:
        """The lines under the table: duplicate saves, and a compiled graph's saves kept uncompressed, if any."""
        lines = []
        if self.duplicates:
            lines.append(f"{self.duplicates} duplicate saves stored once ({_mib(self.duplicate_bytes)} not stored again)")
        if self.compiled_saves:
            lines.append(f"{self.compiled_saves} of the tensors saved by torch.compile'd graphs, decided inside the "
                         "graphs")
        if self.uncompressed_compiled:
            lines.append(f"{self.uncompressed_compiled} tensors saved by torch.compile'd code kept uncompressed "
                         f"({_mib(self.uncompressed_compiled_bytes)}): the rules could not run inside those graphs "
                         "(see actzip.memory.cache.compiled)")
        return "\n".join(lines)

    def __str__(self) -> str:
        rows = [COLUMNS, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

        def line(row) -> str:  # the rule name left-aligned, the numbers right-aligned
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

        lines = [line(COLUMNS), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]]
        if self.caption():
            lines.append(self.caption())
        return "\n".join(lines)

    def table(self, title: str = "activation cache"):
        """The account as a ``rich.table.Table`` (needs rich: ``pip install 'actzip[bench]'``)."""
        try:
            from rich.table import Table  # optional: only programs that render with rich call this
        except ImportError:
            raise MissingDependencyError(
                "StepAccount.table() needs the rich package: pip install 'actzip[bench]' (or print the account: "
                "str(account) is a plain-text table)"
            ) from None
        t = Table(title=title)
        for col in COLUMNS:
            t.add_column(col, justify="left" if col == "rule" else "right")
        for row in self.rows():
            t.add_row(*row)
        if self.caption():
            t.caption = self.caption()
        return t


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
