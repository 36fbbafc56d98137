"""What a mixture of sources or a mixture search gets wrong is one `error:` line and exit status 2 before any
stage runs (the table of tests/pipeline/test_bad_config.py, for mixtures), and a source whose documents the
filters all drop is one line at the stage that finds it, with no traceback.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_bad_mixture.py

Each used to be found late: an empty source file after the other sources' chains ran, a yardstick the search
targets after every proxy trained, a source named without bindings of its own never (the model read another
source's documents under its name).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline import config
from stages.io.committed import by_source
from tests.conftest import REPO
from tests.pipeline.test_bad_config import _case, _parquet, assert_one_error_line_before_work

PROSE_CODE = "gin/mixtures/prose_code.gin"
WITH_WEB = 'train.Mixture.phases=((0, {"prose": 0.5, "code": 0.25, "web": 0.25}),)'
CASE_WEB = WITH_WEB.replace("{", "{{").replace("}", "}}")        # a case's strings are filled by format()
WEB_FILES = ("web/download.Config.source=@web/download.Files()",
             'web/download.Files.paths=["{dir}/web/*.jsonl"]')

CASES = [
    _case("a_source_without_bindings_of_its_own",
          ["train.Mixture weighs sources 'prose' and 'web', which are one source: their download, score, "
           "clean, shard configs are identical ('web' has no gin binding of its own",
           "Give 'web' its own data"],
          CASE_WEB, gin_path=PROSE_CODE),
    _case("two_sources_bound_alike",
          ["sources 'code' and 'web', which are one source",
           "their scoped bindings change nothing that selects documents"],
          CASE_WEB, "web/download.Config.source=@download.EmbeddedCode()",
          "web/download.EmbeddedCode.max_files=150",
          "web/clean.Config.tidy_whitespace=False", "web/clean.Config.min_alpha_fraction=0.0",
          gin_path=PROSE_CODE),
    _case("a_source_whose_files_are_empty",
          "download[web]: download.Files.paths: the 2 file(s) matched hold no record ({dir}/web/a.jsonl, "
          "{dir}/web/b.jsonl: empty or blank)",
          CASE_WEB, *WEB_FILES, gin_path=PROSE_CODE, files=(("web/a.jsonl", ""), ("web/b.jsonl", "\n  \n"))),
    _case("a_source_whose_parquet_has_no_rows",
          "download[web]: download.Files.paths: the 1 file(s) matched hold no record",
          CASE_WEB, "web/download.Config.source=@web/download.Files()",
          'web/download.Files.paths=["{dir}/web/*.parquet"]', gin_path=PROSE_CODE,
          files=(("web/a.parquet", _parquet({"text": []})),)),
    _case("max_epochs_below_what_the_download_can_hold",
          ["train: train.Mixture: source 'code' would be read at least 0.122 times, past max_epochs=0.1",
           "its download holds at most 2,"], "train.Mixture.max_epochs=0.1", gin_path=PROSE_CODE),
    _case("mixsearch_target_not_a_yardstick",
          ["mixsearch.target = 'acc_norm/nope' is not a yardstick these runs will have",
           "choose one of: bpb/", "acc_norm/", "bpb/stdlib_code", "bpb/mean"],
          "mixsearch.target='acc_norm/nope'", command="mixsearch", gin_path="gin/mixsearch/prose_code.gin"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_mixture_is_one_error_line_before_anything_runs(case, tmp_path):
    assert_one_error_line_before_work(case, tmp_path)


def test_sources_with_data_of_their_own_pass(tmp_path):
    """The shipped mixture passes, and so does a third source with files of its own (one record is enough)."""
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "a.jsonl").write_text('\n{"text": "a page"}\n')
    root = f'pipeline.Settings.cache_root="{tmp_path / "cache"}"'
    plan = config.load([os.path.join(REPO, PROSE_CODE)],
                       [root, WITH_WEB, *(p.format(dir=tmp_path) for p in WEB_FILES)])
    assert plan.tree.sources == ("code", "prose", "web")
    from pipeline import checks

    assert checks.cannot_run(plan, [n for n in plan.stages if n.startswith("download")]) == ""


def test_a_mixture_of_one_source_reads_that_source_by_name(tmp_path):
    """tiny.gin with a mixture naming only `web` trains on web's chain: train reads its shard as shard[web]
    (it read it as "shard", a source named "", and refused: "its sources are: none")."""
    plan = config.load([os.path.join(REPO, "gin/tiny.gin")],
                       [f'pipeline.Settings.cache_root="{tmp_path}"', "train.Config.mixture=@train.Mixture()",
                        'train.Mixture.phases=((0, {"web": 1.0}),)'])
    assert plan.tree.sources == ("web",)
    train = plan.stages["train"]
    assert set(by_source(dict.fromkeys(train.input_names.values()), "shard")) == {"web"}
    assert plan.stages["tokenizer"].input_names == {"clean[web]": "clean[web]"}
    assert plan.stages["shard[web]"].input_names == {"clean[web]": "clean", "tokenizer": "tokenizer"}


def test_a_source_the_filters_empty_is_one_line_at_clean_without_a_traceback(tmp_path):
    """Every record shorter than tiny.gin's clean.Config.min_chars: clean refuses in one line naming the
    filter, the run fails, and no traceback is printed (download ran, and its output is kept)."""
    data = tmp_path / "short.jsonl"
    data.write_text("".join(f'{{"text": "a short line number {i}."}}\n' for i in range(5)))
    argv = [sys.executable, "-m", "pipeline", "run", "--gin", "gin/tiny.gin", "--stage", "clean",
            "--gin-param", f'pipeline.Settings.cache_root="{tmp_path / "cache"}"',
            "--gin-param", "download.Config.source=@download.Files()",
            "--gin-param", f'download.Files.paths=["{data}"]']
    out = subprocess.run(argv, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    line = [x for x in out.stderr.splitlines() if x.startswith("error: ")]
    assert len(line) == 1 and line[0].startswith("error: clean: clean kept 0 of 5 documents"), out.stderr
    assert "the filter that removed the most: " in line[0]
    assert out.stderr.splitlines()[-1].startswith("FAILED after ")


def test_a_sources_bound_holds_every_token_it_can_become(tmp_path):
    """`text_bound()` bounds the tokens shard writes (bos, eos, sentencepiece's dummy prefix, byte fallback)
    on texts built to make many tokens a byte: single characters, spaces, characters outside the vocabulary,
    escapes that JSON spends more bytes on than the text; and compressed files have no bound."""
    import gzip
    import json

    import sentencepiece as spm

    from stages.download import sources
    from tests.export import helpers

    sp = spm.SentencePieceProcessor(model_proto=helpers.tokenizer_model(320))
    texts = ["a", " ", "x y z", "\u00e9\u4e2d\U0001f600 \n\t", "The cat sat. " * 40, "\ud7ff" * 9, "q" * 3]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "b.txt").write_text("\u4e2d")
    # b.txt is one document whichever the unit: one character, three bytes, byte-fallback tokens
    tokens = sum(map(len, sp.encode([*texts, "\u4e2d"], add_bos=True, add_eos=True)))
    for unit in ("file", "paragraph"):
        files = sources.Files(paths=(str(tmp_path / "*.jsonl"), str(tmp_path / "*.txt")), txt_unit=unit)
        assert tokens <= files.text_bound(), (unit, tokens, files.text_bound())
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n'))
    assert sources.Files(paths=(str(tmp_path / "*.gz"),)).text_bound() is None
    assert sources.Files(paths=(str(tmp_path / "a.jsonl"),), template="alpaca").text_bound() is None
    code = sources.EmbeddedCode(max_files=3)
    docs = [d["text"] for unit in code.units() for d in code.read(unit)]
    assert sum(len(d.encode()) + sources.TOKENS_PER_DOC for d in docs) <= code.text_bound()
    prose = sources.Embedded(max_files=20)
    docs = [d["text"] for unit in prose.units() for d in prose.read(unit) if d["text"]]
    assert sum(len(d.encode()) + sources.TOKENS_PER_DOC for d in docs) <= prose.text_bound()
