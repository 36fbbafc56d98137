"""Real web pages for the benchmarks against datatrove (`fineweb_filters`, `minhash_vs_datatrove`).

    pages = web_corpus.pages()      # [{"id", "text", "url"}], text normalized as the clean stage does
    web_corpus.missing()            # why a datatrove benchmark cannot run here, or None
    web_corpus.corpora(work_dir)    # {"cc": pages(), "warc": ..., "pypi": ...} (cc only when present)

The pages are `../shared/data/cc-main-2019-30-sample.jsonl.gz` (697 Common Crawl pages of July 2019 in
many languages, from the Dolma test data; its README says more). Both sides get the text after our
`normalize.normalize`, so a disagreement is a filter's, not a difference in what the filters saw.
Beyond that sample (`corpora`):

    warc   the WARC pages the tests build (tests/stages/warc_pages.py: paragraphs of Python's own
           documentation inside real-looking HTML), extracted by the download stage with trafilatura
    pypi   FineWeb-like rows shipped in benchmarks/data (pypi_pages.py: Apache-2.0 packages' project
           pages on pypi.org, main text by trafilatura)
"""

from __future__ import annotations

import gzip
import json
import os

from stages.clean import normalize

CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                      "cc-main-2019-30-sample.jsonl.gz")


def missing() -> str | None:
    """None when the corpus and datatrove are both here, else what to do about it."""
    if not os.path.exists(CORPUS):
        return (f"skipped: the real web corpus {os.path.normpath(CORPUS)} is absent "
                "(see ../shared/data/README.md)")
    return datatrove_missing()


def datatrove_missing() -> str | None:
    """None when datatrove and spaCy are installed, else what to do about it."""
    try:
        import datatrove  # noqa: F401
        import spacy  # noqa: F401
    except ImportError as e:
        return (f"skipped: {e.name} is not installed; `make bench` installs the `bench` extra "
                "(pip install -e '.[bench]')")
    return None


def pages() -> list[dict]:
    out = []
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            text = normalize.normalize(row.get("text") or "")
            if text:
                out.append({"id": row["id"], "text": text, "url": (row.get("metadata") or {}).get("url", "")})
    return out


def corpora(work_dir: str, warc_count: int = 240) -> dict[str, list[dict]]:
    """The real text sets by name: "cc" (only when the shared sample is here), "warc", "pypi"."""
    from benchmarks import pypi_pages

    out = {"cc": pages()} if os.path.exists(CORPUS) else {}
    out["warc"] = warc_pages(os.path.join(work_dir, "warc"), warc_count)
    out["pypi"] = _normalized(pypi_pages.rows())
    return out


def warc_pages(work_dir: str, count: int) -> list[dict]:
    """The text of `count` WARC pages that tests/stages/warc_pages.py builds, as the download stage
    extracts it (trafilatura, FineWeb's settings), pages without text left out."""
    from stages.download import warc
    from tests.stages import warc_pages as builder

    out = []
    for path in builder.crawl(work_dir, count=count, wet=0, files=1):
        if path.endswith(".warc.gz"):
            out += [{"id": d["id"], "text": d["text"], "url": d["url"]}
                    for d in warc.read(path, "trafilatura") if d.get("text")]
    return _normalized(out)


def _normalized(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        text = normalize.normalize(row["text"])
        if text:
            out.append({"id": row["id"], "text": text, "url": row.get("url", "")})
    return out


def write_jsonl(path: str, docs: list[dict]) -> None:
    """The documents as datatrove's JsonlReader reads them (one file: datatrove numbers them in order)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            row = {"id": d["id"], "text": d["text"], "metadata": {"url": d.get("url", "")}}
            f.write(json.dumps(row) + "\n")
