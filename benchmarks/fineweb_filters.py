"""FineWeb's quality filters, ours (stages/clean/gopher.py, c4.py, fineweb.py) vs. datatrove 0.10.1's, on
the same real pages.

    make bench                                       # installs the `bench` extra (datatrove, spaCy, NLTK)
    .venv/bin/python -m benchmarks fineweb_filters   # writes benchmarks/out/fineweb_filters.json

Three sets of real text (`web_corpus.corpora`): "cc", the 697 Common Crawl pages of the shared sample
(when `../shared/data` is here), "warc", the WARC pages the tests build, extracted with trafilatura,
and "pypi", FineWeb-like rows shipped in benchmarks/data. Every filter sees every page, one filter at a
time, so each agreement is that filter's alone. The word splitter is where the implementations differ
most, so both sides run with each reference splitter (`words.SPLITTERS`; ours through each filter's
`splitter` field, datatrove's through its `language`, which takes a WordTokenizer):

    spacy   datatrove 0.10.1's default for English (`spacy.blank("en")` + its sentencizer)
    nltk    FineWeb's era: NLTK's `word_tokenize` (punkt sentences, Treebank rules per sentence); with
            an UNTRAINED punkt when its trained English model (punkt_tab, an NLTK data download) is not
            installed, as here (the JSON's `nltk_punkt` says which ran)
    spacy_rules  ours only (the default): spaCy's English rules written out, no library (spacy_rules.py),
            compared with datatrove + spaCy
    fast    ours only: NLTK's rules as regular expressions, compared with both references

Measured, in one run, per corpus:
- keep/drop agreement per filter and pair (`agreement[corpus][filter][ours_vs_ref]`: spacy_vs_spacy,
  nltk_vs_nltk, spacy_rules_vs_spacy, fast_vs_spacy, fast_vs_nltk), and of the reason when both drop and
  of C4's rewritten text when both keep; every disagreement with its page id goes into the JSON;
- documents per CPU second, each filter as a pure function over the pages (ours `check`/`apply`,
  datatrove's `filter`), per splitter, and the ratio to datatrove with the same reference splitter
  measured in the same run (`speed[corpus][filter]`; fast against both references). CPU seconds of
  this process (`time.process_time`), not wall time, so that other load on the machine moves the
  ratios less; each side's fastest of up to five passes (fewer once its passes took over 10 s), the
  sides' passes taken in turn (ours, datatrove's, ours, ...) so that a ratio compares passes of the same
  minutes (this VM's speed drifts by 10-20% over minutes, both sides' alike). Each pass starts cold:
  our splitters' caches (the last texts' words; spacy_rules' tokens per chunk) are emptied, so a pass
  pays for every distinct chunk of its pages once, as a worker would on new pages;
- on "cc", the whole chain (Gopher repetition, Gopher quality, C4, FineWeb, in FineWeb's order) as a
  job: our clean stage on Beam's FnApiRunner with one worker vs datatrove's LocalPipelineExecutor with
  one task and one worker. Ours runs over `copies` copies of the pages so that Beam's start-up (a second
  or two) does not dominate; docs/s is a rate either way.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import sys
import time

from benchmarks import web_corpus
from stages.clean import c4, fineweb, gopher, spacy_rules, words

FILTERS = ("gopher_repetition", "gopher_quality", "c4_quality", "fineweb_quality")
REFERENCES = ("spacy", "nltk")                    # datatrove's splitters
PAIRS = (("spacy", "spacy"), ("nltk", "nltk"), ("spacy_rules", "spacy"), ("fast", "spacy"),
         ("fast", "nltk"))   # (ours, datatrove's)
MAX_LISTED = 40           # disagreements listed per filter and pair
GOAL_AGREEMENT, GOAL_SPEEDUP = 0.995, 10
PASSES, PASS_BUDGET_S = 5, 10    # each side's time: its fastest pass, up to 5 unless they take over 10 s


def measure(work_dir: str, copies: int = 5) -> dict:
    why = web_corpus.datatrove_missing()
    if why:
        print(f"fineweb_filters: {why}")
        return {"benchmark": "fineweb_filters", "skipped": why}
    _quiet_datatrove()
    result = {"benchmark": "fineweb_filters", "datatrove": _version("datatrove"), "spacy": _version("spacy"),
              "nltk": _version("nltk"), "trafilatura": _version("trafilatura"),
              "nltk_punkt": words.punkt_model(), "docs": {}, "agreement": {}, "speed": {}}
    # Our "nltk" splitter refuses to run without punkt's trained model (datatrove's side then runs NLTK's
    # rules after an untrained punkt, `_splitter`): its pairs are left out, and the JSON says why.
    splitters = [s for s in words.SPLITTERS if not words.problem(s)]
    pairs = [(a, b) for a, b in PAIRS if a in splitters]
    if skipped := {s: words.problem(s) for s in words.SPLITTERS if s not in splitters}:
        result["skipped_splitters"] = skipped
    if not os.path.exists(web_corpus.CORPUS):
        result["cc"] = web_corpus.missing()
    corpora = web_corpus.corpora(work_dir)
    for corpus, pages in corpora.items():
        ours, theirs = {s: {} for s in splitters}, {s: {} for s in REFERENCES}
        for f in FILTERS:
            passes = {("ours", s): _ours_pass(f, pages, s) for s in splitters}
            passes |= {("datatrove", s): _theirs_pass(f, pages, s) for s in REFERENCES}
            timed = _interleaved(passes)
            for s in splitters:
                # Beside the goal's cold passes, one pass with spacy_rules' tokens of every chunk of the pages
                # already known (a worker's steady state on pages like those it has seen): after a pass
                # that learns them (the other splitters' passes forgot them).
                warm = None
                if s == "spacy_rules":
                    passes["ours", s]()
                    warm = passes["ours", s](cold=False)[1]
                ours[s][f] = (*timed["ours", s], warm)
            for s in REFERENCES:
                theirs[s][f] = timed["datatrove", s]
        result["docs"][corpus] = len(pages)
        result["agreement"][corpus] = {
            f: {f"{a}_vs_{b}": _agreement(pages, ours[a][f][0], theirs[b][f][0]) for a, b in pairs}
            for f in FILTERS}
        result["speed"][corpus] = {f: _speed(len(pages), ours, theirs, f, pairs) for f in FILTERS}
    result["summary"] = _summary(result)

    if "cc" in corpora:
        pages = corpora["cc"]
        ours_job = _ours_job(pages, work_dir, copies)
        theirs_job = _theirs_job(pages, work_dir)
        ours_rate, theirs_rate = ours_job["docs"] / ours_job["s"], len(pages) / theirs_job["s"]
        result |= {"job_docs_ours": ours_job["docs"], "job_s_ours": round(ours_job["s"], 2),
                   "job_docs_per_s_ours": round(ours_rate),
                   "job_docs_theirs": len(pages), "job_s_datatrove": round(theirs_job["s"], 2),
                   "job_docs_per_s_datatrove": round(theirs_rate, 1),
                   "job_speedup": round(ours_rate / theirs_rate, 1)}
        kept_ours, kept_theirs = ours_job["kept"], theirs_job["kept"]
        same_text = sum(kept_ours[i] == kept_theirs[i] for i in set(kept_ours) & set(kept_theirs))
        result["job_chain_agreement"] = {
            "kept_ours": len(kept_ours), "kept_datatrove": len(kept_theirs),
            "kept_by_both": len(set(kept_ours) & set(kept_theirs)), "same_text_when_both_keep": same_text,
            "only_ours_keeps": sorted(set(kept_ours) - set(kept_theirs)),
            "only_datatrove_keeps": sorted(set(kept_theirs) - set(kept_ours)),
            "decision_agreement": round(1 - len(set(kept_ours) ^ set(kept_theirs)) / len(pages), 4)}
    return result


def _speed(docs: int, ours: dict, theirs: dict, name: str, pairs: list) -> dict:
    """docs/s of each side and ours / datatrove's per pair (`PAIRS`)."""
    out = {f"ours_{s}": round(docs / ours[s][name][1], 1) for s in ours}
    out["ours_spacy_rules_warm"] = round(docs / ours["spacy_rules"][name][2], 1)
    warm = ours["spacy_rules"][name][2]
    out["speedup_spacy_rules_warm_vs_spacy"] = round(theirs["spacy"][name][1] / warm, 2)
    out |= {f"datatrove_{s}": round(docs / theirs[s][name][1], 1) for s in REFERENCES}
    out |= {f"speedup_{a}_vs_{b}": round(theirs[b][name][1] / ours[a][name][1], 2) for a, b in pairs}
    return out


def _summary(result: dict) -> dict:
    """The goals, per corpus and filter: the lowest agreement with the matching reference splitter
    (ours with spacy/nltk vs datatrove with the same), and the default splitter's (words.DEFAULT) agreement
    with and speed-up over datatrove with spaCy, its default; the fast splitter's beside them."""
    out = {}
    default = words.DEFAULT
    for corpus, by_filter in result["agreement"].items():
        for f, pairs in by_filter.items():
            matching = min(pairs[p]["decision_agreement"]
                           for p in ("spacy_vs_spacy", "nltk_vs_nltk") if p in pairs)
            agreement = pairs[f"{default}_vs_spacy"]["decision_agreement"]
            speed = result["speed"][corpus][f]
            out[f"{corpus}/{f}"] = {
                "matching": matching, f"{default}_vs_spacy": agreement,
                f"{default}_speedup_vs_spacy": speed[f"speedup_{default}_vs_spacy"],
                "fast_vs_spacy": pairs["fast_vs_spacy"]["decision_agreement"],
                "fast_vs_nltk": pairs["fast_vs_nltk"]["decision_agreement"],
                "fast_speedup_vs_spacy": speed["speedup_fast_vs_spacy"],
                "goals_met": (min(matching, agreement) >= GOAL_AGREEMENT
                              and speed[f"speedup_{default}_vs_spacy"] >= GOAL_SPEEDUP)}
    return out


# ---------------------------------------------------------------------------------------------
# Decisions: (per page (keep, reason, C4's text when kept), seconds for the whole pass)

WARM_UP = {"text": "Warm the word splitter up before the timed pass."}


def _ours_pass(name: str, pages: list[dict], splitter: str):
    """A function that runs one pass of our filter `name` over the pages: (decisions, CPU seconds)."""
    cls = {"gopher_repetition": gopher.GopherRepetition, "gopher_quality": gopher.GopherQuality,
           "c4_quality": c4.C4Quality, "fineweb_quality": fineweb.FineWebQuality}[name]
    f = cls(splitter=splitter)

    def one_pass(cold=True):
        if cold:
            words.words.cache_clear()
            spacy_rules.cache_clear()
        _decide(f, name, WARM_UP)           # loads the splitter's library; forgets the last text's words
        start = time.process_time()
        out = [_decide(f, name, p) for p in pages]
        return out, time.process_time() - start

    return one_pass


def _interleaved(passes: dict) -> dict:
    """{key: (its decisions, its fastest pass in CPU seconds)} of each pass function in `passes`, run in turn,
    pass by pass (ours, datatrove's, ours, ...), so that both sides' fastest passes come from the same
    minutes of the machine (a VM's speed drifts by 10-20% over minutes); up to PASSES each, fewer once a
    side's passes took over PASS_BUDGET_S."""
    out, best, spent = {}, dict.fromkeys(passes, float("inf")), dict.fromkeys(passes, 0.0)
    for _ in range(PASSES):
        for key, one_pass in passes.items():
            if spent[key] <= PASS_BUDGET_S:
                out[key], seconds = one_pass()
                best[key], spent[key] = min(best[key], seconds), spent[key] + seconds
    return {key: (out[key], best[key]) for key in passes}


def _decide(f, name: str, page: dict) -> tuple:
    if name == "c4_quality":
        r, d = f.apply({"text": page["text"]})
        return r is None, r, d["text"] if r is None else None
    r = f.check({"text": page["text"]})
    return r is None, r, None


def _theirs_pass(name: str, pages: list[dict], splitter: str):
    """A function that runs one pass of datatrove's filter `name` over the pages: (decisions, CPU seconds)."""
    from datatrove.data import Document
    from datatrove.utils import text as dt_text

    f = _theirs_filters(_splitter(splitter))[name]

    def one_pass():
        dt_text.split_into_parts.cache_clear()
        out = []
        start = time.process_time()
        for p in pages:
            doc = Document(text=p["text"], id=p["id"])
            r = f.filter(doc)
            keep, reason = (r[0], r[1]) if isinstance(r, tuple) else (bool(r), None)
            if name == "c4_quality" and reason:
                reason = "c4_" + reason
            out.append((keep, None if keep else reason, doc.text if keep and name == "c4_quality" else None))
        return out, time.process_time() - start

    return one_pass


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
    return {"docs": len(pages), "kept_ours": sum(x[0] for x in a), "kept_datatrove": sum(x[0] for x in b),
            "decision_agreement": round(1 - len(decision) / len(pages), 4), "decision_differs": len(decision),
            "reason_differs_when_both_drop": len(reason), "c4_text_differs_when_both_keep": len(text),
            "disagreements": listed,
            "reason_disagreements": [{"id": pages[i]["id"], "ours": a[i][1], "theirs": b[i][1]}
                                     for i in reason[:MAX_LISTED]]}


# ---------------------------------------------------------------------------------------------
# Word splitters for datatrove (its filters take a WordTokenizer instance as `language`)

def _splitter(name: str):
    """datatrove's English splitter for "spacy"; for "nltk", NLTK's own code as FineWeb ran it (not ours)."""
    from datatrove.utils.word_tokenizers import WordTokenizer

    if name == "spacy":
        from datatrove.utils.word_tokenizers import load_word_tokenizer

        load_word_tokenizer("en").word_tokenize("Warm up.")     # spaCy loads outside the timed pass
        return "en"

    import nltk
    from nltk.tokenize import NLTKWordTokenizer
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        punkt = nltk.tokenize.PunktTokenizer("english")          # what nltk.word_tokenize uses
    except LookupError:
        punkt = PunktSentenceTokenizer()                          # untrained: see the docstring

    class Nltk(WordTokenizer):
        """`nltk.word_tokenize`: punkt sentences, then the Treebank rules per sentence."""

        def __init__(self):
            super().__init__("en")
            self.punkt, self.treebank = punkt, NLTKWordTokenizer()

        def word_tokenize(self, text):
            return [t for s in self.punkt.tokenize(text) for t in self.treebank.tokenize(s) if t.strip()]

        def sent_tokenize(self, text):
            return [s.strip() for s in self.punkt.tokenize(text) if s.strip()]

        def span_tokenize(self, text):
            return list(self.punkt.span_tokenize(text))

    return Nltk()


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
                          gopher_repetition=gopher.GopherRepetition(),
                          gopher_quality=gopher.GopherQuality(), c4_quality=c4.C4Quality(),
                          fineweb_quality=fineweb.FineWebQuality(), num_shards=1,
                          runner=beam_runner.Runner(options=("--direct_num_workers=1",)))
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
