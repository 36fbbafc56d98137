"""Real web pages for the benchmarks against datatrove (`fineweb_filters`, `minhash_vs_datatrove`).

    pages = web_corpus.pages()      # [{"id", "text", "url"}], text normalized as the clean stage does
    web_corpus.missing()            # why a datatrove benchmark cannot run here, or None

The pages are `../shared/data/cc-main-2019-30-sample.jsonl.gz` (697 Common Crawl pages of July 2019 in
many languages, from the Dolma test data; its README says more). Both sides get the text after our
`normalize.normalize`, so a disagreement is a filter's, not a difference in what the filters saw.
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


def write_jsonl(path: str, docs: list[dict]) -> None:
    """The documents as datatrove's JsonlReader reads them (one file: datatrove numbers them in order)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            row = {"id": d["id"], "text": d["text"], "metadata": {"url": d.get("url", "")}}
            f.write(json.dumps(row) + "\n")
