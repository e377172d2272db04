"""The step account: totals without leaves, a plain-text table for print(), rich only on request."""

import builtins

import pytest

from actzip.errors import MissingDependencyError
from actzip.memory.cache import StepAccount


def account() -> StepAccount:
    acct = StepAccount()
    acct.add("leaf", 4096, 4096)
    acct.add("sparse", 2 << 20, 1 << 20)
    acct.add("linear_input:quant4", 4 << 20, 1 << 20)
    acct.duplicates, acct.duplicate_bytes = 2, 3 << 20
    return acct


def test_totals_leave_leaves_out():
    acct = account()
    assert acct.bytes_before == 6 << 20 and acct.bytes_after == 2 << 20 and acct.ratio == 3.0
    assert acct.as_dict()["by_rule"]["sparse"] == {"tensors": 1, "dense_bytes": 2 << 20, "stored_bytes": 1 << 20}


def test_print_shows_a_plain_text_table():
    lines = str(account()).splitlines()
    assert lines[0].split() == ["rule", "tensors", "before", "after", "ratio"]
    assert set(lines[1]) <= {"-", " "}
    rows = {line.split()[0]: line.split() for line in lines[2:-1]}
    assert rows["linear_input:quant4"] == ["linear_input:quant4", "1", "4.00", "MiB", "1.00", "MiB", "4.00x"]
    assert rows["total"][-1] == "3.00x" and "total (no leaf)" in lines[-2]
    assert lines[-1] == "2 duplicate saves stored once (3.00 MiB not stored again)"
    # columns line up: every row has the ratio column ending at the same place
    assert len({len(line) for line in lines[2:-1]}) == 1
    assert "duplicate" not in str(StepAccount())  # no duplicates, no caption


def test_table_is_rich_when_rich_is_installed():
    pytest.importorskip("rich")
    t = account().table("step 1")
    assert t.title == "step 1" and t.row_count == 4 and "duplicate" in t.caption


def test_table_without_rich_names_the_extra(monkeypatch):
    real = builtins.__import__

    def no_rich(name, *args, **kwargs):
        if name == "rich" or name.startswith("rich."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rich)
    with pytest.raises(MissingDependencyError, match=r"pip install 'actzip\[bench\]'"):
        account().table()
