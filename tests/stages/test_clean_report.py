"""The clean stage's report.md and removed.png: every reason in pipeline order, the samples, a real PNG."""

import glob
import inspect
import re
import struct

import pytest

from pipeline import cache
from stages import clean
from stages.clean import c4, fineweb, gopher, report
from stages.io import documents, storage
from tests.stages.test_clean import DROPPED, SHARDS, _clean

# The order a document meets the steps: download's errors (alphabetically, as download's stats.json
# lists them), normalization, the filters of build_filters, dedup.
ORDER = ["invalid_utf8", "malformed_json", "missing_text", "non_string_text", "null_text", "empty",
         "too_short", "too_long", "too_few_alpha", "duplicate"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _download(root, shards, key="d", errors=True):
    """A committed download of `shards`, with the stats.json (its error names) the real stage writes."""
    def write(config, inputs, out_dir, work_dir):
        for i, docs in enumerate(shards):
            documents.write(storage.join(out_dir, documents.shard_name(i, len(shards))), docs)
        if errors:
            names = sorted({d["error"] for docs in shards for d in docs if d.get("error")})
            storage.write_json(storage.join(out_dir, "stats.json"), {"errors": dict.fromkeys(names, 1)})
    return cache.run_stage(cache_root=root, stage="download", key=key, config={}, upstream={}, fn=write)


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("cache"))
    evil = {"id": "evil|<b>", "url": "http://x/`y`",
            "text": "*bold* <script>x</script>\n[a](b) _u_ | ~~s~~ &amp;"}
    shards = [SHARDS[0] + [evil], SHARDS[1]]
    done = _clean(root, _download(root, shards), num_shards=2, samples_per_reason=2, minhash=False)
    return done, storage.read_text(done.file("report.md"))


def _table_reasons(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\| [^|]+ \| `([a-z0-9_]+)` \|", text, re.M)]


def test_report_lists_every_reason_in_pipeline_order_with_counts(reported):
    done, text = reported
    assert {"report.md", "removed.png"} <= set(done.files)
    assert _table_reasons(text) == ORDER
    stats = storage.read_json(done.file("stats.json"))
    assert set(ORDER) == set(stats["dropped"]) == set(DROPPED)
    assert "| download | `malformed_json` | 1 |" in text
    assert f"| Length | `too_short` | 4 | {100 * 4 / stats['docs_in']:.1f}% |" in text   # 3 + the evil one
    assert "| dedup | `duplicate` | 2 |" in text
    assert f"Kept **{stats['docs_kept']:,}** of {stats['docs_in']:,} documents" in text
    assert f"| kept | | {stats['docs_kept']:,} |" in text
    assert "Filters, in the order they run: `Length`, `AlphaFraction`" in text
    headings = re.findall(r"^### `([a-z0-9_]+)`", text, re.M)
    assert headings == ORDER


def test_report_shows_the_sampled_documents_escaped(reported):
    _, text = reported
    short = text.split("### `too_short`")[1].split("###")[0]
    assert "[rejected/too_short.jsonl](rejected/too_short.jsonl)" in short
    assert short.count("\n- **") == 2                              # samples_per_reason=2, smallest ids
    assert "- **evil\\|\\<b\\>** http://x/\\`y\\`: \\*bold\\* \\<script\\>x\\</script\\> ⏎ \\[a\\](b) " \
           "\\_u\\_ \\| \\~\\~s\\~\\~ \\&amp;" in short
    assert "**short-a**: tiny a" in short and "short-b" not in short
    long = text.split("### `too_long`")[1].split("###")[0]
    assert "- **long**: " + "word" * 75 + "…" in long                # the first 300 characters
    assert "- **err-json** f.jsonl:3: (no text)" in text


def test_removed_png_is_a_real_png(reported):
    done, _ = reported
    data = storage.read_bytes(done.file("removed.png"))
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    width, height = struct.unpack(">II", data[16:24])             # the IHDR chunk comes first
    assert width > 500 and height > 200


def test_report_is_written_even_when_min_docs_fails(tmp_path):
    root = str(tmp_path)
    with pytest.raises(ValueError, match=r"what each filter removed: .*report\.md"):
        _clean(root, _download(root, [SHARDS[0][3:5]]), min_docs=1, minhash=False)
    written = glob.glob(f"{root}/clean/*/attempt-*/report.md")
    assert len(written) == 1 and "`too_short`" in storage.read_text(written[0])
    assert glob.glob(f"{root}/clean/*/attempt-*/removed.png")


QUALITY_ON = {"gopher_repetition": gopher.GopherRepetition(), "gopher_quality": gopher.GopherQuality(),
              "c4_quality": c4.C4Quality(), "fineweb_quality": fineweb.FineWebQuality()}


def test_quality_reasons_follow_the_filters_and_unknown_reasons_go_last():
    config = clean.Config(**QUALITY_ON)
    stats = {"dropped": dict.fromkeys(["zz_new", "near_duplicate", "line_punct_ratio", "c4_curly_bracket",
                                       "gopher_short_doc", "top_3_gram", "dup_line_frac", "too_short",
                                       "empty", "aa_new", "duplicate", "io_error"], 1)}
    order = report.ordered_reasons(stats, report.steps(config, errors=("io_error",)))
    assert order == [("download", "io_error"), ("text", "empty"), ("Length", "too_short"),
                     ("GopherRepetition", "dup_line_frac"), ("GopherRepetition", "top_3_gram"),
                     ("GopherQuality", "gopher_short_doc"), ("C4Quality", "c4_curly_bracket"),
                     ("FineWebQuality", "line_punct_ratio"), ("dedup", "duplicate"),
                     ("minhash", "near_duplicate"), (report.UNKNOWN, "aa_new"), (report.UNKNOWN, "zz_new")]
    # Without download's stats.json its errors are unknown too: last, alphabetically.
    errors_unknown = {"dropped": {"b_err": 1, "empty": 1, "a_err": 1}}
    assert report.ordered_reasons(errors_unknown, report.steps(config)) == [
        ("text", "empty"), (report.UNKNOWN, "a_err"), (report.UNKNOWN, "b_err")]


def test_every_filter_lists_the_reasons_it_returns():
    config = clean.Config(**QUALITY_ON)
    for f in clean.build_filters(config):
        name = type(f).__name__
        assert hasattr(f, "reasons"), f"{name} has no reasons(): list what its check can return (report.py)"
        source = inspect.getsource(type(f))
        literal = set(re.findall(r"""return\s+(?:\S+\s+if\s+.*?else\s+)?["']([a-z0-9_]+)["']""", source))
        literal |= set(re.findall(r"""return\s+["']([a-z0-9_]+)["'], doc""", source))
        literal |= set(re.findall(r"""return\s+["']([a-z0-9_]+)["']\s+if""", source))
        assert literal and literal <= set(f.reasons()), (name, literal - set(f.reasons()))
        assert len(set(f.reasons())) == len(f.reasons()), name
    rep = gopher.GopherRepetition(top_n_grams=((2, 0.2),), dup_n_grams=((7, 0.1),))
    assert rep.reasons()[-2:] == ("top_2_gram", "duplicated_7_n_grams")
