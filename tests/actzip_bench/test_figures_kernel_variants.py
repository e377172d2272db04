"""The sparse kernels' variant figures: read from their results files, a variant that was not exact refused."""

import json
import shutil
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench.figures_kernel_variants import DECODE, ENCODE, ENCODE_PARTS, encode_parts, kernel_variants

REPO = Path(__file__).resolve().parents[2]


def test_both_figures_render_from_their_files():
    assert f"`{DECODE}`" in kernel_variants(REPO) and f"`{ENCODE}`" in kernel_variants(REPO)
    text = encode_parts(REPO)
    assert f"`{ENCODE_PARTS}`" in text and "compaction pass alone" in text


def test_an_atomic_variant_that_did_not_match_is_refused(tmp_path):
    (tmp_path / ENCODE_PARTS).parent.mkdir(parents=True)
    shutil.copy(REPO / ENCODE_PARTS, tmp_path / ENCODE_PARTS)
    rec = json.loads((tmp_path / ENCODE_PARTS).read_text())
    rec["rows"][-1]["exact"] = False
    (tmp_path / ENCODE_PARTS).write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="did not match"):
        encode_parts(tmp_path)
