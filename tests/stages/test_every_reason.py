"""Every removal reason has a test that makes it appear: the reasons no other test produced on its own.

An audit of every reason string the clean stage's filters return (stages/clean/) and the download stage
gives a record without text (stages/download/) found each asserted by some test, except these, tested
here with real objects and real input (no mocks):

- `near_duplicate` when exact dedup is off (`clean.Config.dedup=False`): graph.WriteShard drops it on a
  code path of its own, which no other test ran (tests/stages/test_minhash.py runs with dedup on).
- `undecodable` for a WET `conversion` record (warc.to_document's first `undecodable`), and each WARC
  reason per record: tests/stages/test_warc.py asserts them only as counts in stats.json.

`test_every_filter_reason_is_known` pins the full list of filter reasons, so a new reason fails it until
it is added there (and given a test).
"""

import json
import os
import random
import re

from pipeline import cache
from stages import clean
from stages.download import warc
from stages.io import documents, storage
from tests.stages.warc_pages import Writer

# Every reason a filter of `clean.build_filters` can return with every step on, in pipeline order, and
# the test that makes each appear (Gopher repetition's are built from its default n-gram settings).
GOPHER_REPETITION = ("dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac",
                     "top_2_gram", "top_3_gram", "top_4_gram",
                     *(f"duplicated_{n}_n_grams" for n in range(5, 11)))
GOPHER_QUALITY = ("gopher_short_doc", "gopher_long_doc", "gopher_below_avg_threshold",
                  "gopher_above_avg_threshold", "gopher_too_many_hashes", "gopher_too_many_ellipsis",
                  "gopher_too_many_bullets", "gopher_too_many_end_ellipsis", "gopher_below_alpha_threshold",
                  "gopher_enough_stop_words")
FILTER_REASONS = {
    "too_short": "test_filters.py::test_each_reason",
    "too_long": "test_filters.py::test_each_reason",
    "too_few_alpha": "test_filters.py::test_each_reason",
    **dict.fromkeys(("url_domain", "url_listed", "url_banned_word", "url_soft_words", "url_banned_subword"),
                    "test_langid_url_pii.py::test_url_filter_reasons"),
    **dict.fromkeys(("language", "language_score"), "test_langid_url_pii.py::test_language_reasons"),
    # Gopher repetition's first, FineWeb's too (after C4 removed every line): one name, where it first is
    "empty": "test_quality.py::test_fineweb_empty_after_c4_removed_every_line",
    **dict.fromkeys(GOPHER_REPETITION, "test_quality.py::test_gopher_repetition_reasons"),
    **dict.fromkeys(GOPHER_QUALITY, "test_quality.py::test_gopher_quality_reasons"),
    **dict.fromkeys(("c4_lorem_ipsum", "c4_curly_bracket", "c4_too_few_sentences"),
                    "test_quality.py::test_c4_reasons"),
    **dict.fromkeys(("line_punct_ratio", "short_line_ratio", "char_dup_ratio", "list_ratio"),
                    "test_quality.py::test_fineweb_reasons"),
}

ALL_ON = {name: cls() for name, cls in clean.FILTERS.items()}     # every step of FineWeb's recipe, defaults


def test_every_filter_reason_is_known():
    built = clean.build_filters(clean.Config(**ALL_ON))
    listed = list(dict.fromkeys(reason for f in built for reason in f.reasons()))
    assert listed == list(FILTER_REASONS)        # a new reason: add it above, with the test that makes it
    for ref in set(FILTER_REASONS.values()):     # and every test named there exists
        file, name = ref.split("::")
        with open(os.path.join(os.path.dirname(__file__), file)) as f:
            assert re.search(rf"^def {name}\(", f.read(), re.MULTILINE), ref


# ---------------------------------------------------------------------------------------------
# near_duplicate with exact dedup off (graph.WriteShard's `not self.config.dedup` branch)

def _words(rng, n):
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def test_near_duplicate_is_dropped_when_exact_dedup_is_off(tmp_path):
    rng = random.Random(7)
    base = _words(rng, 300)
    near = list(base)
    for i in (75, 225):                           # 2 of 300 words: 5-gram Jaccard ~0.935, p(candidate) 0.9996
        near[i] = "q" + near[i]
    a, b = " ".join(base), " ".join(near)
    docs = [{"id": "b", "text": b}, {"id": "a", "text": a}, {"id": "c", "text": a},
            {"id": "d", "text": " " + a}]
    root = str(tmp_path)

    def write(config, inputs, out_dir, work_dir):
        documents.write(storage.join(out_dir, documents.shard_name(0, 1)), docs)

    download = cache.run_stage(cache_root=root, stage="download", key="d", config=clean.Config(),
                               upstream={}, fn=write)
    done = cache.run_stage(cache_root=root, stage="clean", key="c",
                           config=clean.Config(dedup=False, minhash=True, num_shards=2),
                           upstream={"download": download}, fn=clean.run)
    stats = storage.read_json(done.file("stats.json"))
    assert stats["dropped"] == {"near_duplicate": 1}      # exact copies of the survivor stay: dedup is off
    kept = sorted(d["id"] for p in documents.shards_of(done) for d in documents.read(p))
    assert kept == ["a", "c", "d"]
    sample = json.loads(storage.read_text(done.file("rejected/near_duplicate.jsonl")).splitlines()[0])
    assert sample["id"] == "b" and sample["reason"] == "near_duplicate"


# ---------------------------------------------------------------------------------------------
# WARC / WET: each record's own reason (warc.to_document), one branch per case

LINKS = b"<html><body><ul><li><a href='/a'>A</a></li><li><a href='/b'>B</a></li></ul></body></html>"
WARC_CASES = [      # (url, how to write it, its error)
    ("https://x.org/png", lambda w, u: w.response(u, b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png",
                                                   identified="image/png"), "non_html"),
    ("https://x.org/json", lambda w, u: w.response(u, b'{"a": 1}', "application/json"), "non_html"),
    ("https://x.org/untyped", lambda w, u: w.response(u, b"plain words, no markup", None), "non_html"),
    ("https://x.org/gzip", lambda w, u: w.response(u, b"\x1f\x8b\x08\x00broken", "text/html",
                                                    http_extra=(("Content-Encoding", "gzip"),)),
     "undecodable"),
    ("https://x.org/nul", lambda w, u: w.response(u, b"<html><body>\x00\x00" + bytes(range(1, 40)) * 20
                                                   + b"</body></html>"), "undecodable"),
    ("https://x.org/links", lambda w, u: w.response(u, LINKS), "empty_extraction"),
]
WET_CASES = [
    ("https://x.org/wet-nul", b"text \x00\x00\x00 with NUL characters", "undecodable"),
    ("https://x.org/wet-blank", b" \n\t\n ", "empty_extraction"),
    ("https://x.org/wet-ok", b"Some plain text of a page.", None),
]


def test_each_warc_record_gets_its_own_reason(tmp_path):
    path = tmp_path / "mixed.warc.gz"
    with Writer(path) as w:
        for url, write, _ in WARC_CASES:
            write(w, url)
        w.request("https://x.org/req")
        w.metadata("https://x.org/meta")
    got = {d["url"]: d["error"] for d in warc.read(str(path), "trafilatura")}
    assert {u: e for u, e in got.items() if e != "not_a_response"} == {u: e for u, _, e in WARC_CASES}
    assert got["https://x.org/req"] == got["https://x.org/meta"] == "not_a_response"


def test_a_wet_record_that_is_binary_is_undecodable(tmp_path):
    path = tmp_path / "mixed.warc.wet.gz"
    with Writer(path) as w:
        for url, text, _ in WET_CASES:
            w.conversion(url, text)
    docs = [d for d in warc.read(str(path), "trafilatura") if d["error"] != "not_a_response"]
    assert [(d["url"], d["error"]) for d in docs] == [(u, e) for u, _, e in WET_CASES]
    assert docs[0]["text"] is None and docs[2]["text"] == "Some plain text of a page."
