import os
import pathlib
import sysconfig

import pytest
import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.data import Corpus, decode, default_cache_dir, stdlib_source_files

SMALL = 200_000


@pytest.fixture(scope="module")
def stdlib_files():
    return stdlib_source_files()


# ---- stdlib file list -----------------------------------------------------------------------------


def test_stdlib_files_nonempty_sorted_deterministic(stdlib_files):
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    assert len(stdlib_files) > 100
    rel = [p.relative_to(root).as_posix() for p in stdlib_files]
    assert rel == sorted(rel)
    assert len(set(rel)) == len(rel)
    assert all(p.suffix == ".py" and p.is_file() for p in stdlib_files)
    assert not any({"site-packages", "dist-packages", "__pycache__"} & set(p.parts) for p in stdlib_files)
    assert "os.py" in rel
    assert stdlib_source_files() == stdlib_files


def test_stdlib_files_skips_third_party_and_caches(tmp_path):
    for rel in [
        "b.py",
        "a/z.py",
        "a/b.py",
        "a/notes.txt",
        "site-packages/pkg/mod.py",
        "x/dist-packages/mod.py",
        "a/__pycache__/b.py",
        "A.py",
    ]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("pass\n")
    got = [p.relative_to(tmp_path).as_posix() for p in stdlib_source_files(tmp_path)]
    assert got == ["A.py", "a/b.py", "a/z.py", "b.py"]


def test_stdlib_files_bad_root(tmp_path):
    with pytest.raises(DataError, match="nope"):
        stdlib_source_files(tmp_path / "nope")


# ---- stdlib corpus and its cache ------------------------------------------------------------------


def test_from_stdlib_builds_caches_and_reloads(tmp_path, stdlib_files):
    cache = tmp_path / "cache"
    first = Corpus.from_stdlib(max_bytes=SMALL, cache_dir=cache)
    assert len(first) == SMALL
    assert first.data.dtype == torch.uint8 and first.data.dim() == 1
    assert first.vocab_size == 256
    assert first.name.startswith("stdlib")
    # Contents: the files in order, each followed by a newline.
    head = stdlib_files[0].read_bytes() + b"\n" + stdlib_files[1].read_bytes()
    n = min(len(head), SMALL)
    assert bytes(first.data[:n].tolist()) == head[:n]

    files = list(cache.iterdir())
    assert files == [first.cache_path]  # one cache file, no temporary left behind
    assert first.cache_path.read_bytes() == bytes(first.data.tolist())

    second = Corpus.from_stdlib(max_bytes=SMALL, cache_dir=cache)
    assert second.cache_path == first.cache_path
    assert torch.equal(second.data, first.data)


def test_from_stdlib_reads_the_cache_file(tmp_path):
    cache = tmp_path / "cache"
    first = Corpus.from_stdlib(max_bytes=SMALL, cache_dir=cache)
    # Overwrite the cache with marker bytes of the same length: a cache hit must return them.
    first.cache_path.write_bytes(b"x" * SMALL)
    second = Corpus.from_stdlib(max_bytes=SMALL, cache_dir=cache)
    assert bytes(second.data[:10].tolist()) == b"x" * 10
    # A cache of the wrong length is treated as damaged and rebuilt.
    first.cache_path.write_bytes(b"short")
    third = Corpus.from_stdlib(max_bytes=SMALL, cache_dir=cache)
    assert torch.equal(third.data, first.data)
    assert first.cache_path.stat().st_size == SMALL


def test_from_stdlib_cache_key_depends_on_max_bytes(tmp_path):
    a = Corpus.from_stdlib(max_bytes=SMALL, cache_dir=tmp_path)
    b = Corpus.from_stdlib(max_bytes=SMALL // 2, cache_dir=tmp_path)
    assert a.cache_path != b.cache_path
    assert len(b) == SMALL // 2
    assert torch.equal(b.data, a.data[: SMALL // 2])


def test_cache_dir_defaults_to_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path / "envcache"))
    assert default_cache_dir() == tmp_path / "envcache"
    corpus = Corpus.from_stdlib(max_bytes=10_000)
    assert corpus.cache_path.parent == tmp_path / "envcache"
    assert corpus.cache_path.is_file()
    monkeypatch.delenv("ACTZIP_CACHE_DIR")
    assert default_cache_dir() == pathlib.Path.home() / ".cache" / "actzip"


# ---- other sources and splits ---------------------------------------------------------------------


def test_split_sizes_and_contents():
    data = bytes(range(256)) * 4  # 1024 bytes
    corpus = Corpus.from_bytes(data, val_fraction=0.25, name="ramp")
    assert corpus.name == "ramp" and len(corpus) == 1024
    train, val = corpus.split("train"), corpus.split("val")
    assert train.numel() == 768 and val.numel() == 256
    assert bytes(train.tolist()) + bytes(val.tolist()) == data
    assert Corpus.from_bytes(b"a" * 1000, val_fraction=0.1).split("train").numel() == 900


def test_from_file_reads_bytes(tmp_path):
    path = tmp_path / "text.txt"
    text = "héllo wörld\n" * 50
    path.write_text(text, encoding="utf-8")
    corpus = Corpus.from_file(path)
    assert len(corpus) == len(text.encode())
    assert decode(corpus.data) == text
    assert str(path) in corpus.name


def test_decode():
    assert decode(torch.tensor([104, 105], dtype=torch.long)) == "hi"
    assert decode(b"\xff") == "\ufffd"
    with pytest.raises(DataError, match="tokens"):
        decode([300])


def test_get_batch_shapes_shift_and_determinism():
    data = bytes((i * 7) % 251 for i in range(5000))
    corpus = Corpus.from_bytes(data)
    x, y = corpus.get_batch("train", 8, 32, generator=torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (8, 32)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    train = corpus.split("train").long()
    for row_x, row_y in zip(x, y):
        # Locate each window in the split and check y is the next byte of every x.
        starts = [s for s in range(train.numel() - 32) if torch.equal(train[s : s + 32], row_x)]
        assert starts and torch.equal(train[starts[0] + 1 : starts[0] + 33], row_y)

    x2, y2 = corpus.get_batch("train", 8, 32, generator=torch.Generator().manual_seed(1))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = corpus.get_batch("train", 8, 32, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(x, x3)


def test_get_batch_stays_inside_split():
    # train is all 'a', val all 'b': a window crossing the boundary would mix them.
    corpus = Corpus.from_bytes(b"a" * 90 + b"b" * 10, val_fraction=0.1)
    g = torch.Generator().manual_seed(0)
    x, y = corpus.get_batch("val", 64, 9, generator=g)  # val has exactly block_size + 1 bytes
    assert (x == ord("b")).all() and (y == ord("b")).all()
    x, y = corpus.get_batch("train", 64, 89, generator=g)
    assert (x == ord("a")).all() and (y == ord("a")).all()


# ---- errors ---------------------------------------------------------------------------------------


def test_missing_file_names_path(tmp_path):
    missing = tmp_path / "missing.txt"
    with pytest.raises(DataError, match="missing.txt"):
        Corpus.from_file(missing)
    with pytest.raises(DataError, match="directory"):
        Corpus.from_file(tmp_path)


def test_empty_file_is_rejected(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        Corpus.from_file(empty)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_names_path(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("x")
    path.chmod(0)
    with pytest.raises(DataError, match="secret.txt"):
        Corpus.from_file(path)


def test_too_short_split_names_split_length_and_block():
    corpus = Corpus.from_bytes(b"z" * 100, val_fraction=0.1)
    with pytest.raises(DataError, match=r"'val'.*10 bytes.*11"):
        corpus.get_batch("val", 1, 10)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5, True])
def test_bad_val_fraction(fraction, tmp_path):
    with pytest.raises(ConfigError, match="val_fraction"):
        Corpus.from_bytes(b"abc" * 10, val_fraction=fraction)
    with pytest.raises(ConfigError, match="val_fraction"):
        Corpus.from_stdlib(max_bytes=1000, val_fraction=fraction, cache_dir=tmp_path)


def test_bad_split_name():
    corpus = Corpus.from_bytes(b"abc" * 10)
    with pytest.raises(ConfigError, match="'test'"):
        corpus.split("test")
    with pytest.raises(ConfigError, match="'test'"):
        corpus.get_batch("test", 1, 2)


def test_bad_batch_args():
    corpus = Corpus.from_bytes(b"abc" * 10)
    with pytest.raises(ConfigError, match="batch_size"):
        corpus.get_batch("train", 0, 2)
    with pytest.raises(ConfigError, match="max_bytes"):
        Corpus.from_stdlib(max_bytes=0)


def test_unwritable_cache_warns_and_still_builds(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    with pytest.warns(RuntimeWarning, match="not-a-dir"):
        corpus = Corpus.from_stdlib(max_bytes=10_000, cache_dir=blocker)
    assert len(corpus) == 10_000 and corpus.cache_path is None
