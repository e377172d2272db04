"""The instruction suite: answers follow from the prompt, splits stay apart, batches score the answers only."""

import os
import random
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from actzip.errors import ConfigError, DataError, MissingDependencyError
from actzip_bench.data import instruction_families as fams
from actzip_bench.data.instruction_families import (
    COMPOSED,
    FAMILIES,
    MAX_ANSWER,
    MAX_INSTRUCTION,
    MAX_LABEL,
    MAX_QUERY,
    Family,
    countries,
    get_family,
)
from actzip_bench.data.instructions import (
    ANSWER_END,
    IGNORE,
    LABEL_WORDS,
    PAD,
    SPLITS,
    InstructionSuite,
    InstructionSuiteConfig,
    Task,
    answer_ids,
    decode,
    example_text,
    instruction_batch,
    instruction_rows,
    prompt_ids,
    query_ids,
    split_examples,
)
from actzip_bench.data.instruction_wordings import SLOTS, WORDINGS, grid, render

LABELS = {"a": "cat", "b": "dog", "c": "sun"}
CASES = [  # (family, params, query, answer), worked out by hand
    ("reverse", {}, "abc", "cba"), ("uppercase", {}, "bolet", "BOLET"), ("first_letter", {}, "kemo", "k"),
    ("last_letter", {}, "kemo", "o"), ("length", {}, "sadupe", "6"),
    ("add", {"k": 7}, "5", "12"), ("subtract", {"k": 9}, "40", "31"), ("multiply", {"k": 3}, "14", "42"),
    ("modulo", {"k": 7}, "23", "2"),
    ("sort_digits", {}, "3 1 4 1", "1 1 3 4"), ("reverse_digits", {}, "3 1 4", "4 1 3"),
    ("max_digit", {}, "3 9 4 1", "9"), ("sum_digits", {}, "3 1 4 1 5", "14"),
    ("month_number", {}, "March", "3"), ("next_month", {}, "December", "January"), ("month_name", {}, "9", "September"),
    ("weekday_number", {}, "Sunday", "7"), ("next_weekday", {}, "Friday", "Saturday"),
    ("letter_position", {}, "e", "5"), ("next_letter", {}, "z", "a"),
    ("country_code", {}, "France", "FR"), ("country_code3", {}, "Japan", "JPN"),
    ("parity", LABELS, "14", "cat"), ("parity", LABELS, "7", "dog"), ("at_least_50", LABELS, "50", "cat"),
    ("at_least_50", LABELS, "49", "dog"), ("vowel_start", LABELS, "obal", "cat"), ("vowel_start", LABELS, "bal", "dog"),
    ("long_word", LABELS, "kamel", "cat"), ("long_word", LABELS, "kame", "dog"),
    ("digit_order", LABELS, "1 4 7", "cat"), ("digit_order", LABELS, "9 5 0", "dog"),
    ("digit_order", LABELS, "1 1 2", "sun"),
    ("reverse_upper", {}, "abc", "CBA"), ("last_upper", {}, "kemo", "O"), ("sort_reverse", {}, "3 1 4", "4 3 1"),
    ("multiply_add", {"k": 3, "m": 4}, "10", "34"), ("sum_parity", LABELS, "3 1 4", "cat"),
    ("sum_parity", LABELS, "3 1 5", "dog"), ("next_month_number", {}, "December", "1"),
]


@pytest.fixture(scope="module")
def suite():
    return InstructionSuite()


def _task(name, params):
    f = get_family(name)
    wanted = [n for n, _ in f.numbers] + list("abc"[:f.labels])
    items = tuple((n, params[n]) for n in wanted)
    return Task(name, f.kind, "train", f.paraphrases[0].format(**params), items, f.paraphrases[0])


def _sample(suite, split, n, seed=0):
    rng = random.Random(seed)
    return [suite.sample_task(rng, split) for _ in range(n)]


def _holds_out(name, held, fraction=0.2):
    """Whether ``held`` is as many wordings of ``name`` as ``fraction`` asks: at least its share of them (rounded
    half up, at least one), and less than that plus one core's wordings (cores are held out whole)."""
    f = get_family(name)
    want = max(1, int(fraction * len(f.paraphrases) + 0.5)) if fraction else 0
    group = max(Counter(w[1:] for w in f.paraphrase_parts).values())
    return want <= len(held) < want + group


def _parts_by_template(name):
    f = get_family(name)
    return dict(zip(f.paraphrases, f.paraphrase_parts))


def _widest(f):
    """The parameters that fill a family's templates longest."""
    out = {n: max((str(v) for v in values), key=len) for n, values in f.numbers}
    return out | {n: "x" * MAX_LABEL for n in "abc"[:f.labels]}


def test_the_suite_has_train_and_heldout_families_of_every_kind(suite):
    kinds = {get_family(n).kind for n in suite.train_families}
    assert kinds == {"string", "arithmetic", "list", "lookup", "bijection"}
    assert 20 <= len(suite.train_families) <= 28 and set(suite.heldout_families) == set(COMPOSED)
    assert 5 <= len(COMPOSED) <= 6 and all(get_family(n).kind == "composed" for n in COMPOSED)
    for name in COMPOSED:  # every composed family chains two train families over its query type
        parts = [get_family(p) for p in get_family(name).parts]
        assert len(parts) == 2 and all(p.name in suite.train_families for p in parts)
        assert parts[0].query_type == get_family(name).query_type


@pytest.mark.parametrize("name,params,query,answer", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_answers_on_hand_checked_cases(name, params, query, answer):
    assert _task(name, params).answer(query) == answer


def test_every_family_has_a_hand_checked_case():
    assert {c[0] for c in CASES} == {f.name for f in FAMILIES}


def test_a_query_of_the_wrong_type_is_a_data_error():
    with pytest.raises(DataError, match="month_name"):
        _task("month_name", {}).answer("13")
    with pytest.raises(DataError, match="letter_position"):
        _task("letter_position", {}).answer("ab")


def test_deterministic_from_the_seed(suite):
    a = instruction_batch(suite, 16, 96, torch.Generator().manual_seed(3))
    b = instruction_batch(InstructionSuite(), 16, 96, torch.Generator().manual_seed(3))
    c = instruction_batch(suite, 16, 96, torch.Generator().manual_seed(4))
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and not torch.equal(a[0], c[0])
    assert suite.tasks("train", 2, seed=1) == suite.tasks("train", 2, seed=1) != suite.tasks("train", 2, seed=2)
    other = InstructionSuite(InstructionSuiteConfig(seed=1))
    assert other.heldout_labels != suite.heldout_labels
    assert any(other.paraphrases(n, "heldout_paraphrase") != suite.paraphrases(n, "heldout_paraphrase")
               for n in suite.train_families)


def test_the_same_query_gets_different_answers_under_different_prompts(suite):
    rng = random.Random(0)
    by_type = defaultdict(list)
    for name in suite.train_families:
        for t in (suite.task_for(name, rng) for _ in range(4)):
            by_type[t.query_type].append(t)
    assert set(by_type) == set(fams.QUERY_TYPES)
    for qtype, tasks in by_type.items():
        assert len({t.family for t in tasks}) >= 2, qtype  # no query type is answered by one family alone
        for q in tasks[0].sample_queries(20, rng):
            answers = set()
            for t in tasks:
                try:
                    answers.add(t.answer(q))
                except DataError:  # outside this family's queries (a month number above 12)
                    pass
            assert len(answers) >= 2, (qtype, q, answers)


def test_heldout_paraphrases_never_appear_in_training(suite):
    held = {n: set(suite.paraphrases(n, "heldout_paraphrase")) for n in suite.train_families}
    assert all(_holds_out(n, h) for n, h in held.items())
    train = _sample(suite, "train", 3000)
    assert all(t.template not in held[t.family] and t.split == "train" for t in train)
    assert all(t.instruction == t.template.format(**dict(t.params)) for t in train)
    evaluation = _sample(suite, "heldout_paraphrase", 500)
    assert all(t.template in held[t.family] for t in evaluation)
    assert {t.family for t in evaluation} == set(suite.train_families)


def test_every_family_has_at_least_24_wordings_composed_from_parts():
    assert set(WORDINGS) == {f.name for f in FAMILIES}
    for f in FAMILIES:
        assert len(f.paraphrases) >= 24 and len(set(f.paraphrases)) == len(f.paraphrases), f.name
        assert f.paraphrase_parts == WORDINGS[f.name] and all(len(w) == SLOTS for w in f.paraphrase_parts)
        assert [render(w) for w in f.paraphrase_parts] == list(f.paraphrases)
        assert list(f.paraphrases) == sorted(f.paraphrases)  # a fixed order, not the order of a set
        wanted = {n for n, _ in f.numbers} | set("abc"[:f.labels])
        for t in f.paraphrases:  # every wording names exactly the family's parameters, once each
            assert {m for m in re.findall(r"\{(\w+)\}", t)} == wanted and len(re.findall(r"\{", t)) == len(wanted)
            filled = t.format(**_widest(f))
            assert filled.isascii() and len(filled) <= MAX_INSTRUCTION and "\n" not in filled and "=" not in filled
            assert filled[0].isupper() and filled[-1] in ".?", t
        leads = {w[0] for w in f.paraphrase_parts}  # the first part is a lead-in, the empty one among them
        assert "" in leads and all(len(p) <= 10 and p.endswith(" ") for p in leads - {""}), (f.name, leads)
        for slot in range(SLOTS):  # every slot but a fixed one varies somewhere: wordings are combinations
            assert len({w[slot] for w in f.paraphrase_parts}) >= (1 if slot == SLOTS - 1 else 2), (f.name, slot)


@pytest.mark.parametrize("seed,fraction", [(0, 0.2), (1, 0.2), (7, 0.1), (3, 0.5)])
def test_heldout_wordings_are_new_combinations_of_trained_parts(seed, fraction):
    suite = InstructionSuite(InstructionSuiteConfig(seed=seed, heldout_paraphrase_fraction=fraction))
    for name in suite.train_families + suite.heldout_families:
        f = get_family(name)
        if name in suite.heldout_families:  # a held-out family is evaluated in any of its wordings
            assert suite.paraphrases(name, "heldout_family") == f.paraphrases
            continue
        train, held = suite.paraphrases(name, "train"), suite.paraphrases(name, "heldout_paraphrase")
        assert _holds_out(name, held, fraction) and not set(held) & set(train)
        assert sorted(held + train) == sorted(f.paraphrases)
        parts = _parts_by_template(name)
        seen = [{parts[t][slot] for t in train} for slot in range(SLOTS)]
        trained_cores = {parts[u][1:] for u in train}
        for t in held:
            assert parts[t][1:] not in trained_cores  # an unseen combination, even without its lead-in ...
            assert all(p in seen[slot] for slot, p in enumerate(parts[t])), (name, t)  # ... of seen parts


def test_about_a_fifth_of_each_familys_wordings_are_held_out_by_default(suite):
    assert InstructionSuiteConfig().heldout_paraphrase_fraction == 0.2
    for name in suite.train_families:
        share = len(suite.paraphrases(name, "heldout_paraphrase")) / len(get_family(name).paraphrases)
        assert 0.15 <= share <= 0.25, name


def test_composed_families_are_worded_from_parts_too():
    for name in COMPOSED:
        f = get_family(name)
        assert len(f.paraphrases) >= 24 and all(len(w) == SLOTS for w in f.paraphrase_parts)
    chained = [w for w in get_family("multiply_add").paraphrase_parts if w[2] in (", then ", " and ")]
    assert chained and all("{k}" in w[1] and "{m}" in w[3] for w in chained)  # k in the first step, m in the second


_DIGEST = """
import hashlib, json, random
from actzip_bench.data.instruction_families import FAMILIES
from actzip_bench.data.instructions import InstructionSuite, InstructionSuiteConfig

def digest():
    rows = [[f.name, f.paraphrases, f.paraphrase_parts] for f in FAMILIES]
    for seed in (0, 1):
        s = InstructionSuite(InstructionSuiteConfig(seed=seed))
        rows.append([[n, s.paraphrases(n, sp)] for n in s.train_families for sp in ("train", "heldout_paraphrase")])
        rng = random.Random(seed)
        rows.append([s.sample_task(rng, sp).instruction for sp in ("train", "heldout_paraphrase") for _ in range(50)])
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()
"""


def test_wordings_and_splits_are_the_same_in_every_process():
    space = {}
    exec(_DIGEST, space)
    here = space["digest"]()
    src = str(Path(__file__).resolve().parents[3] / "src")
    procs = []
    for hash_seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in [env.get("PYTHONPATH")] if p])
        procs.append(subprocess.Popen([sys.executable, "-c", _DIGEST + "\nprint(digest())"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.strip() == here


def test_the_wording_grids():
    assert grid(("", "please "), ("flip",), (" it",), (".", "!")) == [
        ("", "flip", " it", "."), ("", "flip", " it", "!"), ("please ", "flip", " it", "."),
        ("please ", "flip", " it", "!")]
    assert render(("task: ", "flip", " it", ".")) == "Task: flip it." and render(("", "flip", "", "?")) == "Flip?"
    with pytest.raises(ValueError, match="4 slots"):
        grid(("a",), ("b",))


def test_heldout_labels_and_families_never_appear_in_training(suite):
    assert len(suite.heldout_labels) == 8 and set(suite.train_labels) | set(suite.heldout_labels) == set(LABEL_WORDS)
    assert not set(suite.train_labels) & set(suite.heldout_labels)
    train = _sample(suite, "train", 3000)
    assert not {t.family for t in train} & set(suite.heldout_families)
    assert {t.family for t in train} == set(suite.train_families)
    assert all(set(t.labels) <= set(suite.train_labels) for t in train)
    for t in _sample(suite, "heldout_labels", 500):
        assert get_family(t.family).kind == "bijection" and set(t.labels) & set(suite.heldout_labels)
        assert t.template in suite.paraphrases(t.family, "train")
    composed = _sample(suite, "heldout_family", 500)
    assert {t.family for t in composed} == set(COMPOSED)
    assert all(set(t.labels) <= set(suite.train_labels) for t in composed)


def test_bijection_answers_are_the_prompts_label_words(suite):
    rng = random.Random(0)
    for split in ("train", "heldout_labels", "heldout_family"):
        for t in _sample(suite, split, 300):
            if not t.labels:
                continue
            assert len(set(t.labels)) == len(t.labels)
            assert all(re.search(rf"\b{w}\b", t.instruction) for w in t.labels)  # the prompt names them all
            answers = [a for _, a in t.examples(40, rng)]
            assert set(answers) == set(t.labels), (t, answers)  # every class shows up, nothing else does


def test_lengths_and_ascii(suite):
    rng = random.Random(0)
    for split in SPLITS:
        for t in _sample(suite, split, 400):
            assert t.instruction.isascii() and len(t.instruction) <= MAX_INSTRUCTION and "\n" not in t.instruction
            for q, a in t.examples(4, rng):
                assert q.isascii() and a.isascii() and 1 <= len(q) <= MAX_QUERY and 1 <= len(a) <= MAX_ANSWER
                assert "\n" not in q + a and "=" not in q + a
    assert all(len(name) <= MAX_QUERY for name, _, _ in countries()) and len(countries()) > 150


def test_words_are_lowercase_pseudo_words_of_3_to_7_letters():
    rng = random.Random(0)
    words = [fams.pseudo_word(rng) for _ in range(2000)]
    assert all(w.isalpha() and w.islower() and 3 <= len(w) <= 7 for w in words)
    assert len(set(words)) > 1500 and any(w[0] in fams.VOWELS for w in words)


def test_queries_are_distinct_where_the_space_allows(suite):
    rng = random.Random(0)
    word = suite.task_for("reverse", rng)
    assert len(set(word.sample_queries(50, rng))) == 50 and word.n_queries is None
    day = suite.task_for("next_weekday", rng)
    queries = day.sample_queries(10, rng)
    assert day.n_queries == 7 and len(queries) == 10 and len(set(queries[:7])) == 7
    sub = suite.task_for("subtract", rng)
    k = dict(sub.params)["k"]
    assert all(int(q) >= k for q in sub.sample_queries(200, rng))  # never a negative answer


def test_split_examples_share_no_query(suite):
    for t in suite.tasks("train", 1, seed=0) + suite.tasks("heldout_family", 1, seed=0):
        n = min(t.n_queries or 32, 32)
        fit, test = split_examples(t, n // 2, n - n // 2, seed=5)
        assert len(fit) == n // 2 and len(test) == n - n // 2
        assert not {q for q, _ in fit} & {q for q, _ in test}
        assert all(t.answer(q) == a for q, a in fit + test)
        assert split_examples(t, n // 2, n - n // 2, seed=5) == (fit, test)
    day = suite.task_for("weekday_number", random.Random(0))
    fit, test = suite.split_examples(day, 16, 24)  # 7 weekdays, shared out in proportion
    assert (len(fit), len(test)) == (3, 4) and not {q for q, _ in fit} & {q for q, _ in test}
    assert [len(x) for x in split_examples(day, 1, 24)] == [1, 6]
    with pytest.raises(DataError, match="7 distinct"):
        split_examples(day, 4, 4, strict=True)


def test_text_format_helpers(suite):
    t = _task("add", {"k": 7})
    assert decode(prompt_ids(t)) == t.instruction + "\n" and prompt_ids(t).dtype == torch.long
    assert decode(query_ids("5")) == "5 = " and decode(answer_ids("12")) == "12" + ANSWER_END
    assert example_text(t, [("5", "12"), ("1", "8")]) == t.instruction + "\n5 = 12\n1 = 8\n"
    with pytest.raises(DataError, match="ASCII"):
        query_ids("caf\u00e9")


def test_batch_targets_are_exactly_the_answers(suite):
    x, y = instruction_batch(suite, 64, 96, 7)
    rows = instruction_rows(suite, 64, 96, 7)
    assert x.shape == y.shape == (64, 96) and x.dtype == y.dtype == torch.long
    for i, (task, pairs) in enumerate(rows):
        assert 1 <= len(pairs) <= 4
        text = example_text(task, pairs)
        full = (text.encode() + bytes(97))[:97]
        assert x[i].tolist() == list(full[:96])
        scored = (y[i] != IGNORE).nonzero().flatten()
        assert torch.equal(y[i, scored], torch.tensor(list(full[1:]))[scored])  # next-byte targets
        assert decode(y[i, scored]) == "".join(a + "\n" for _, a in pairs)[:len(scored)]
        if len(text) <= 97:
            assert decode(y[i, scored]) == "".join(a + "\n" for _, a in pairs)
            assert (x[i, len(text):] == PAD).all()


def test_batch_splits_and_pairs(suite):
    rows = instruction_rows(suite, 32, 200, random.Random(0), split="heldout_family", pairs=(3, 3))
    assert all(t.family in COMPOSED and len(p) == 3 for t, p in rows)
    assert all(len({q for q, _ in p}) == 3 for _, p in rows)  # no query repeated within a row
    short = instruction_rows(suite, 32, 24, random.Random(0), pairs=(4, 4))  # only the first pair, cut
    assert all(len(p) == 1 for _, p in short)
    x, y = instruction_batch(suite, 32, 24, 0, pairs=(4, 4))
    assert x.shape == (32, 24)


def test_batch_is_fast(suite):
    instruction_batch(suite, 64, 96, 0)
    start = time.perf_counter()
    for seed in range(5):
        instruction_batch(suite, 64, 96, seed)
    assert (time.perf_counter() - start) / 5 < 0.05


@pytest.mark.parametrize("kwargs,field", [
    ({"seed": "0"}, "seed"),
    ({"heldout_paraphrase_fraction": 0.6}, "heldout_paraphrase_fraction"),
    ({"heldout_paraphrase_fraction": -0.1}, "heldout_paraphrase_fraction"),
    ({"heldout_paraphrase_fraction": "0.2"}, "heldout_paraphrase_fraction"),
    ({"heldout_paraphrase_fraction": True}, "heldout_paraphrase_fraction"),
    ({"heldout_paraphrase_fraction": float("nan")}, "heldout_paraphrase_fraction"),
    ({"heldout_labels": 30}, "heldout_labels"),
    ({"heldout_labels": 1.5}, "heldout_labels"),
    ({"heldout_families": ("nope",)}, "heldout_families"),
    ({"heldout_families": ("add", "add")}, "heldout_families"),
    ({"heldout_families": tuple(f.name for f in FAMILIES)}, "heldout_families"),
    ({"label_words": ("cat", "Dog", "sun", "red")}, "label_words"),
    ({"label_words": ("cat", "cat", "sun", "red")}, "label_words"),
])
def test_bad_config_values_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        InstructionSuiteConfig(**kwargs)


def test_bad_arguments_are_named(suite):
    with pytest.raises(ConfigError, match="split"):
        suite.sample_task(random.Random(0), "test")
    with pytest.raises(ConfigError, match="heldout_labels"):
        InstructionSuite(InstructionSuiteConfig(heldout_labels=0)).sample_task(random.Random(0), "heldout_labels")
    with pytest.raises(ConfigError, match="heldout_paraphrase_fraction"):
        InstructionSuite(InstructionSuiteConfig(heldout_paraphrase_fraction=0)).sample_task(random.Random(0),
                                                                                           "heldout_paraphrase")
    for args, name in (((0, 32, (1, 4)), "batch_size"), ((2, 1, (1, 4)), "seq_len"), ((2, 32, (2, 1)), "pairs")):
        with pytest.raises(ConfigError, match=name):
            instruction_batch(suite, args[0], args[1], 0, pairs=args[2])
    with pytest.raises(ConfigError, match="generator_or_rng"):
        instruction_batch(suite, 2, 32, 1.0)
    with pytest.raises(ConfigError, match="unknown instruction family"):
        suite.family("nope")


def test_a_family_must_name_its_parameters_in_every_paraphrase():
    add = get_family("add")
    with pytest.raises(ConfigError, match="must name exactly"):
        wordings = tuple(f"Add {{k}}, {i}." for i in range(4)) + ("Add it.",)  # the last forgets k
        Family("bad", "arithmetic", "number", wordings, add.solve, add.sampler, numbers=add.numbers)
    with pytest.raises(ConfigError, match="kind"):
        Family("bad", "magic", "number", add.paraphrases, add.solve, add.sampler, numbers=add.numbers)
    with pytest.raises(ConfigError, match="MAX_INSTRUCTION"):
        wordings = tuple(f"Add {{k}}, {i}." for i in range(4)) + ("Add {k} to the number" + "." * 50,)
        Family("bad", "arithmetic", "number", wordings, add.solve, add.sampler, numbers=add.numbers)


def test_a_familys_parts_must_compose_its_paraphrases():
    add = get_family("add")
    plain = Family("plain", "arithmetic", "number", add.paraphrases[:5], add.solve, add.sampler, numbers=add.numbers)
    assert plain.paraphrase_parts == tuple((t,) for t in add.paraphrases[:5])  # by default a wording is one part
    bad_parts = (add.paraphrase_parts[:4] + (add.paraphrase_parts[5],),  # one renders to another wording
                 add.paraphrase_parts[:4],  # one short
                 add.paraphrase_parts[:4] + (add.paraphrase_parts[4][:3],))  # a different number of parts
    for parts in bad_parts:
        with pytest.raises(ConfigError, match="paraphrase_parts"):
            Family("bad", "arithmetic", "number", add.paraphrases[:5], add.solve, add.sampler, numbers=add.numbers,
                   paraphrase_parts=parts)


def test_missing_pycountry_names_the_bench_extra(monkeypatch):
    countries.cache_clear()
    monkeypatch.setitem(sys.modules, "pycountry", None)
    try:
        with pytest.raises(MissingDependencyError, match="bench"):
            countries()
    finally:
        countries.cache_clear()
