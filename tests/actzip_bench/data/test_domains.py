"""The code and prose domains: comments and docstrings leave the code for the prose, nothing else does."""

import pytest

from actzip.errors import DataError
from actzip_bench.data.domains import DOMAINS, domain_corpora, split_code_and_prose

SOURCE = '''"""Module doc."""
import os  # the os

def f(x):
    """Add one."""
    return x + 1  # plus
s = "not a docstring"
'''


def test_split_moves_comments_and_docstrings_only():
    code, prose = split_code_and_prose(SOURCE)
    assert prose == "Module doc.\nthe os\nAdd one.\nplus\n"
    assert "Module doc" not in code and "#" not in code and "Add one" not in code
    assert 'return x + 1' in code and 's = "not a docstring"' in code and code.count("\n") == 4


def test_domain_corpora_are_disjoint_in_kind_and_sized():
    corpora = domain_corpora(20_000)
    assert set(corpora) == set(DOMAINS)
    assert all(len(c) == 20_000 for c in corpora.values())
    prose = bytes(corpora["prose"].data.tolist()).decode("utf-8", errors="replace")
    code = bytes(corpora["code_late"].data.tolist()).decode("utf-8", errors="replace")
    assert "def " in code and "#" not in code.split("\n", 1)[1][:2000]
    assert code.count("def ") > prose.count("def ")


def test_empty_standard_library_is_named(monkeypatch):
    import actzip_bench.data.domains as domains

    monkeypatch.setattr(domains, "stdlib_source_files", lambda: [])
    with pytest.raises(DataError, match="no standard-library"):
        domain_corpora(1000)
