"""FineWeb's quality filters, ours (stages/clean/quality.py) vs. datatrove 0.10.1's, on the same real pages.

    make bench                                       # installs the `bench` extra (datatrove, spaCy, NLTK)
    .venv/bin/python -m benchmarks fineweb_filters   # writes benchmarks/out/fineweb_filters.json

Every filter sees every page (697 Common Crawl pages, `web_corpus`), one filter at a time, so each
agreement is that filter's alone. datatrove runs with three word splitters, because that is where the
two implementations differ most:

    spacy   datatrove 0.10.1's default for English (`spacy.blank("en")` + its sentencizer)
    nltk    FineWeb's era: NLTK's `word_tokenize` rules (Treebank) with an UNTRAINED punkt sentence
            splitter, since punkt's trained English model cannot be downloaded here (see RESULTS.md)
    ours    datatrove's rules with our splitter (`stages.clean.words`): what is left is rule differences

Measured, in one run:
- agreement of keep/drop per filter (and of the reason when both drop, and of C4's rewritten text when
  both keep) for each splitter; every disagreement with its page id goes into the JSON;
- how the splitter alone changes datatrove's decisions (spacy vs ours, nltk vs ours, same rules);
- documents per second per core: each filter as a pure function over the pages (ours `check`/`apply`
  vs datatrove's `filter` with spaCy), and the whole chain (Gopher repetition, Gopher quality, C4,
  FineWeb, in FineWeb's order) as a job: our clean stage on Beam's FnApiRunner with one worker vs
  datatrove's LocalPipelineExecutor with one task and one worker. Ours runs over `copies` copies of the
  pages so that Beam's start-up (a second or two) does not dominate; docs/s is a rate either way.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import sys
import time

from benchmarks import web_corpus
from stages.clean import quality, words

FILTERS = ("gopher_repetition", "gopher_quality", "c4_quality", "fineweb_quality")
SPLITTERS = ("spacy", "nltk", "ours")
MAX_LISTED = 40           # disagreements listed per filter and splitter


def measure(work_dir: str, copies: int = 5) -> dict:
    why = web_corpus.missing()
    if why:
        print(f"fineweb_filters: {why}")
        return {"benchmark": "fineweb_filters", "skipped": why}
    _quiet_datatrove()
    pages = web_corpus.pages()
    ours = {name: _ours_decisions(name, pages) for name in FILTERS}
    theirs = {s: {name: _theirs_decisions(name, pages, s) for name in FILTERS} for s in SPLITTERS}

    result = {"benchmark": "fineweb_filters", "corpus": os.path.basename(web_corpus.CORPUS),
              "docs": len(pages),
              "datatrove": _version("datatrove"), "spacy": _version("spacy"), "nltk": _version("nltk")}
    for s in SPLITTERS:
        for name in FILTERS:
            result[f"agreement_{name}_{s}"] = _agreement(pages, ours[name][0], theirs[s][name][0])
    for s in ("spacy", "nltk"):           # same rules (datatrove's), different splitter
        for name in FILTERS:
            result[f"splitter_only_{name}_{s}_vs_ours"] = _agreement(pages, theirs["ours"][name][0],
                                                                      theirs[s][name][0])
    for name in FILTERS:
        ours_s, theirs_s = ours[name][1], theirs["spacy"][name][1]
        result[f"pure_docs_per_s_{name}_ours"] = round(len(pages) / ours_s)
        result[f"pure_docs_per_s_{name}_datatrove_spacy"] = round(len(pages) / theirs_s, 1)
        result[f"pure_docs_per_s_{name}_datatrove_nltk"] = round(len(pages) / theirs["nltk"][name][1], 1)
        result[f"pure_speedup_{name}"] = round(theirs_s / ours_s, 1)

    ours_job = _ours_job(pages, work_dir, copies)
    theirs_job = _theirs_job(pages, work_dir)
    result |= {"job_docs_ours": ours_job["docs"], "job_s_ours": round(ours_job["s"], 2),
               "job_docs_per_s_ours": round(ours_job["docs"] / ours_job["s"]),
               "job_docs_theirs": len(pages), "job_s_datatrove": round(theirs_job["s"], 2),
               "job_docs_per_s_datatrove": round(len(pages) / theirs_job["s"], 1),
               "job_speedup": round((ours_job["docs"] / ours_job["s"]) / (len(pages) / theirs_job["s"]), 1)}
    kept_ours, kept_theirs = ours_job["kept"], theirs_job["kept"]
    same_text = sum(kept_ours[i] == kept_theirs[i] for i in set(kept_ours) & set(kept_theirs))
    result["job_chain_agreement"] = {
        "kept_ours": len(kept_ours), "kept_datatrove": len(kept_theirs),
        "kept_by_both": len(set(kept_ours) & set(kept_theirs)), "same_text_when_both_keep": same_text,
        "only_ours_keeps": sorted(set(kept_ours) - set(kept_theirs)),
        "only_datatrove_keeps": sorted(set(kept_theirs) - set(kept_ours)),
        "decision_agreement": round(1 - len(set(kept_ours) ^ set(kept_theirs)) / len(pages), 4)}
    return result


# ---------------------------------------------------------------------------------------------
# Decisions: (per page (keep, reason, C4's text when kept), seconds for the whole pass)

def _ours_decisions(name: str, pages: list[dict]) -> tuple[list, float]:
    f = {"gopher_repetition": quality.GopherRepetition(), "gopher_quality": quality.GopherQuality(),
         "c4_quality": quality.C4Quality(), "fineweb_quality": quality.FineWebQuality()}[name]
    best, out = float("inf"), []
    for _ in range(3):        # fast enough to take the best of three
        words.words.cache_clear()
        start = time.perf_counter()
        if name == "c4_quality":
            decided = [f.apply({"text": p["text"]}) for p in pages]
            out = [(r is None, r, d["text"] if r is None else None) for r, d in decided]
        else:
            out = [(r is None, r, None) for r in (f.check({"text": p["text"]}) for p in pages)]
        best = min(best, time.perf_counter() - start)
    return out, best


def _theirs_decisions(name: str, pages: list[dict], splitter: str) -> tuple[list, float]:
    from datatrove.data import Document
    from datatrove.utils import text as dt_text

    f = _theirs_filters(_splitter(splitter))[name]
    dt_text.split_into_parts.cache_clear()
    out = []
    start = time.perf_counter()
    for p in pages:
        doc = Document(text=p["text"], id=p["id"])
        r = f.filter(doc)
        keep, reason = (r[0], r[1]) if isinstance(r, tuple) else (bool(r), None)
        if name == "c4_quality" and reason:
            reason = "c4_" + reason
        out.append((keep, None if keep else reason, doc.text if keep and name == "c4_quality" else None))
    return out, time.perf_counter() - start


def _theirs_filters(language) -> dict:
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    return {"gopher_repetition": GopherRepetitionFilter(language=language),
            "gopher_quality": GopherQualityFilter(language=language),
            # filter_no_terminal_punct=False: FineWeb's setting
            "c4_quality": C4QualityFilter(filter_no_terminal_punct=False, language=language),
            "fineweb_quality": FineWebQualityFilter(language=language)}


def _agreement(pages: list[dict], a: list, b: list) -> dict:
    decision = [i for i in range(len(pages)) if a[i][0] != b[i][0]]
    both_drop = [i for i in range(len(pages)) if not a[i][0] and not b[i][0]]
    both_keep = [i for i in range(len(pages)) if a[i][0] and b[i][0]]
    reason = [i for i in both_drop if a[i][1] != b[i][1]]
    text = [i for i in both_keep if a[i][2] != b[i][2]]
    listed = [{"id": pages[i]["id"], "url": pages[i]["url"], "ours": a[i][1] or "keep",
               "theirs": b[i][1] or "keep"} for i in decision[:MAX_LISTED]]
    return {"docs": len(pages), "kept_a": sum(x[0] for x in a), "kept_b": sum(x[0] for x in b),
            "decision_agreement": round(1 - len(decision) / len(pages), 4), "decision_differs": len(decision),
            "reason_differs_when_both_drop": len(reason), "c4_text_differs_when_both_keep": len(text),
            "disagreements": listed,
            "reason_disagreements": [{"id": pages[i]["id"], "ours": a[i][1], "theirs": b[i][1]}
                                     for i in reason[:MAX_LISTED]]}


# ---------------------------------------------------------------------------------------------
# Word splitters for datatrove (its filters take a WordTokenizer instance as `language`)

def _splitter(name: str):
    from datatrove.utils.word_tokenizers import WordTokenizer

    if name == "spacy":
        from datatrove.utils.word_tokenizers import load_word_tokenizer

        load_word_tokenizer("en").word_tokenize("Warm up.")     # spaCy loads outside the timed pass
        return "en"

    if name == "nltk":
        from nltk.tokenize import NLTKWordTokenizer
        from nltk.tokenize.punkt import PunktSentenceTokenizer

        class Nltk(WordTokenizer):
            """`nltk.word_tokenize` (punkt sentences, then Treebank rules per sentence) with an untrained
            punkt: its English model is a download (punkt_tab), which is not possible here."""

            def __init__(self):
                super().__init__("en")
                self.punkt, self.treebank = PunktSentenceTokenizer(), NLTKWordTokenizer()

            def word_tokenize(self, text):
                return [t for s in self.punkt.tokenize(text) for t in self.treebank.tokenize(s) if t.strip()]

            def sent_tokenize(self, text):
                return [s.strip() for s in self.punkt.tokenize(text) if s.strip()]

            def span_tokenize(self, text):
                return list(self.punkt.span_tokenize(text))

        return Nltk()

    class Ours(WordTokenizer):
        """stages.clean.words: NLTK's rules as one regular expression."""

        def __init__(self):
            super().__init__("en")

        def word_tokenize(self, text):
            return list(words.words(text))

        def sent_tokenize(self, text):
            return [text[a:b].strip() for a, b in self.span_tokenize(text)]

        def span_tokenize(self, text):     # one span per sentence `words.sentences` counts
            ends = [m.end() for m in words._SENTENCE_END.finditer(text)] + [len(text)]
            return list(zip([0] + ends[:-1], ends)) if text.strip() else []

    return Ours()


# ---------------------------------------------------------------------------------------------
# The chain as a job: our clean stage on FnApiRunner vs datatrove's LocalPipelineExecutor, one core each

def _ours_job(pages: list[dict], work_dir: str, copies: int) -> dict:
    from stages import beam_runner, clean
    from stages.clean import graph
    from stages.io import documents, storage

    src = os.path.join(work_dir, "ours-in", documents.shard_name(0, 1))
    docs = [{"id": f"{p['id']}#{c}", "text": p["text"], "url": p["url"], "source": "cc"}
            for c in range(copies) for p in pages]
    documents.write(src, docs)
    config = clean.Config(min_chars=0, max_chars=10**9, min_alpha_fraction=0, dedup=False, minhash=False,
                          gopher_repetition=True, gopher_quality=True, c4_quality=True, fineweb_quality=True,
                          num_shards=1, runner=beam_runner.Runner(options=("--direct_num_workers=1",)))
    out = os.path.join(work_dir, "ours-out")
    start = time.perf_counter()
    graph.run(config, [src], out)
    seconds = time.perf_counter() - start
    kept = {d["id"][:-2]: d["text"] for d in documents.read(storage.join(out, documents.shard_name(0, 1)))
            if d["id"].endswith("#0")}
    return {"docs": len(docs), "s": seconds, "kept": kept}


def _theirs_job(pages: list[dict], work_dir: str) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    src, out = os.path.join(work_dir, "dt-in"), os.path.join(work_dir, "dt-out")
    web_corpus.write_jsonl(os.path.join(src, "pages.jsonl"), pages)
    executor = LocalPipelineExecutor(
        pipeline=[JsonlReader(src), *_theirs_filters("en").values(), JsonlWriter(out)],
        tasks=1, workers=1, logging_dir=os.path.join(work_dir, "dt-logs"))
    start = time.perf_counter()
    executor.run()
    seconds = time.perf_counter() - start
    kept = {}
    for path in glob.glob(os.path.join(out, "*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                kept[row["id"]] = row["text"]
    return {"s": seconds, "kept": kept}


def _quiet_datatrove() -> None:
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    from benchmarks.__main__ import main  # writes the JSON and prints the table

    sys.exit(main(["fineweb_filters"]))
