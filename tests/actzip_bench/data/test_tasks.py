"""The generated snippet-classification task: deterministic, disjoint splits, scored at the answer byte only."""

import pytest
import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.data import decode
from actzip_bench.data.tasks import (
    IGNORE,
    PAD,
    PROMPT,
    SnippetClassification,
    SnippetTaskConfig,
)


@pytest.fixture
def root(tmp_path):
    """A tiny standard library: two packages of four files each, every file tagged with its name."""
    for pkg, word in (("alpha", b"apple "), ("beta", b"berry ")):
        (tmp_path / pkg / "sub").mkdir(parents=True)
        for i in range(4):
            where = tmp_path / pkg / ("sub" if i == 3 else "") / f"f{i}.py"
            where.write_bytes((f"<{pkg}/f{i}> ".encode() + word + pkg.encode() + b" ") * 40)
    return tmp_path


def small(**kw):
    return SnippetTaskConfig(packages=("alpha", "beta"), min_len=20, max_len=40, train_size=64, test_size=32, **kw)


def test_deterministic_from_the_seed(root):
    a, b = SnippetClassification(small(), root), SnippetClassification(small(), root)
    c = SnippetClassification(small(seed=1), root)
    for split in ("train", "test"):
        assert all(torch.equal(x, y) for x, y in zip(a.split(split), b.split(split)))
    assert not torch.equal(a.split("train")[0], c.split("train")[0])


def test_examples_layout_and_labels(root):
    task = SnippetClassification(small(), root)
    ids, mask, labels, targets = task.split("train")
    assert ids.shape == (64, small().seq_len) and targets.tolist().count(0) + targets.tolist().count(1) == 64
    for i in range(8):
        n = int(mask[i].sum())
        assert mask[i, :n].all() and not mask[i, n:].any() and (ids[i, n:] == PAD).all()
        text = bytes(ids[i, :n].tolist())
        assert text[-len(PROMPT) - 1:-1] == PROMPT and text[-1] == ord("a") + int(targets[i])
        assert 20 <= n - len(PROMPT) - 1 <= 40
        scored = (labels[i] != IGNORE).nonzero().flatten().tolist()
        assert scored == [n - 1] and labels[i, n - 1] == ids[i, n - 1]
        snippet = decode(ids[i, :n - len(PROMPT) - 1])
        assert ("berry" if targets[i] == 0 else "apple") not in snippet  # each snippet from its own package
        assert "alpha" not in snippet and "beta" not in snippet  # package names blanked out


def test_train_and_test_come_from_disjoint_files(root):
    task = SnippetClassification(small(test_every=4), root)

    def files(split):
        ids = task.split(split)[0]
        return {tag for row in ids for tag in decode(row).split("<")[1:] if ">" in tag and "/f" in tag}

    train = {t.split(">")[0] for t in files("train")}
    test = {t.split(">")[0] for t in files("test")}
    assert test and train and not train & test
    assert all(t.endswith("f3") for t in test)  # the 4th file of each package (sorted by path)


def test_batches_and_accuracy(root):
    task = SnippetClassification(small(), root)
    b = task.get_batch("train", 5, torch.Generator().manual_seed(0))
    assert b["input_ids"].shape[1] == int(b["attention_mask"].sum(1).max())
    logits = torch.zeros(*b["input_ids"].shape, 256)
    pos = b["attention_mask"].sum(1) - 2
    logits[torch.arange(5), pos, task.answer_tokens[b["targets"]]] = 1.0
    correct, n = task.accuracy_counts(logits, b)
    assert int(correct) == n == 5
    assert sum(x["targets"].numel() for x in task.batches("test", 10)) == 32


def test_errors(root):
    with pytest.raises(DataError, match="'gamma'"):
        SnippetClassification(SnippetTaskConfig(packages=("alpha", "gamma"), min_len=20, max_len=40), root)
    with pytest.raises(ConfigError, match="packages"):
        SnippetTaskConfig(packages=("alpha",))
    with pytest.raises(ConfigError, match="min_len"):
        SnippetTaskConfig(min_len=50, max_len=10)
    with pytest.raises(ConfigError, match="train_size"):
        SnippetTaskConfig(train_size=0)
    with pytest.raises(ConfigError, match="split"):
        SnippetClassification(small(), root).split("val")


def test_real_standard_library_default_packages():
    task = SnippetClassification(SnippetTaskConfig(train_size=16, test_size=8))
    assert len(task) == 4 and task.split("test")[0].shape == (8, task.config.seq_len)
