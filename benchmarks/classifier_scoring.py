"""Documents per second per core of the classifier stage's `Scorer.score_many` vs datatrove 0.10.1's
`FastTextClassifierFilter`, scoring the same pages with the same fastText model.

    .venv/bin/python -m benchmarks classifier_scoring     # writes benchmarks/out/classifier_scoring.json
    make bench                                            # installs the `bench` extra (datatrove) first

The model is trained by the stage itself (`classifier.run`) on a small embedded set, with DCLM's
hyperparameters (dim 100, word bigrams, fastText's 2M hash rows: the size of table a real classifier's
bigrams are looked up in, which is most of what a prediction costs): positives the standard library's
docstrings and help topics (`download.Embedded`), negatives its source code (`download.EmbeddedCode`).
Contamination is not checked (nothing here is trained on for real).

The pages are the shared web sample (`web_corpus`: 697 Common Crawl pages, ../shared/data) when it is
there, else the embedded corpus's documents. Each side gets the same texts and the same loaded model
object (datatrove's filter holds a fastText model; it is handed ours rather than downloading one), and
every pass is timed in CPU seconds of this process (fastText predicts in the calling thread: one core),
the sides' passes taken in turn (ours, theirs, ours, ...), the fastest of `passes` kept:

    ours          `Scorer.score_many` over batches of BATCH texts: `to_line` per text, one multi-line
                  predict per batch
    predict       fastText's own `model.predict(to_line(text), k=-1)`, one call per text: the floor
                  any wrapper of the same model pays
    datatrove     `FastTextClassifierFilter.filter(doc)` per `Document` (document mode, no thresholds:
                  it annotates every label's score), newlines replaced by a space as ours join lines

With datatrove not installed, its side is skipped with a message saying how to install it, and ours and
the predict floor are still measured. The scores of each side are compared (largest difference).
"""

from __future__ import annotations

import inspect
import os
import time

from benchmarks import web_corpus
from stages import classifier
from stages.classifier import scoring
from stages.clean.config import Contamination
from stages.download.sources import Embedded, EmbeddedCode

BATCH = 256
TRAIN_DOCS = 2000          # per class


def measure(work_dir: str, passes: int = 5) -> dict:
    model_dir = os.path.join(work_dir, "classifier")
    config = classifier.Config(positives=Embedded(), negatives=EmbeddedCode(max_files=400),
                               max_docs=TRAIN_DOCS, contamination=Contamination(reference_sets=(), tasks=()))
    start = time.perf_counter()
    classifier.run(config, {}, model_dir, os.path.join(work_dir, "scratch"))
    train_s = time.perf_counter() - start
    scorer = classifier.scorer(model_dir)
    pages, corpus = _pages()
    texts = [p["text"] for p in pages]
    model = scoring._loaded(scorer.model_file)          # loaded once: every side scores with this object
    runs = {"ours": lambda: _ours(scorer, texts), "predict": lambda: _predict(model, texts)}
    why = web_corpus.datatrove_missing()
    if why is None:
        runs["datatrove"] = _theirs(model, scorer.model_file, texts)
    else:
        print(f"classifier_scoring: datatrove's side {why}")
    best = _interleaved(runs, passes)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    result = {"benchmark": "classifier_scoring", "corpus": corpus, "docs": len(texts), "mb": round(mb, 2),
              "model": classifier.summary(_Dir(model_dir)),
              "model_mb": round(os.path.getsize(scorer.model_file) / 1e6, 1), "train_s": round(train_s, 1),
              "batch": BATCH, "passes": passes, "datatrove": _version("datatrove") if why is None else why}
    scores = {}
    for name, (seconds, found) in best.items():
        result[f"{name}_docs_per_s"] = round(len(texts) / seconds, 1)
        result[f"{name}_mb_per_s"] = round(mb / seconds, 2)
        scores[name] = found
    result["ratio_ours_vs_predict"] = round(result["ours_docs_per_s"] / result["predict_docs_per_s"], 2)
    result["max_abs_diff_predict"] = _max_diff(scores["ours"], scores["predict"])
    if "datatrove" in scores:
        ratio = result["ours_docs_per_s"] / result["datatrove_docs_per_s"]
        result["ratio_ours_vs_datatrove"] = round(ratio, 2)
        result["max_abs_diff_datatrove"] = _max_diff(scores["ours"], scores["datatrove"])
    return result


def _pages() -> tuple[list[dict], str]:
    """The shared web sample, or (without it) the embedded corpus's documents."""
    if os.path.exists(web_corpus.CORPUS):
        return web_corpus.pages(), "cc-main-2019-30-sample"
    source = Embedded()
    return [d for unit in source.units() for d in source.read(unit) if d["text"]], "embedded"


def _ours(scorer, texts: list[str]) -> list[float]:
    out: list[float] = []
    for i in range(0, len(texts), BATCH):
        out += scorer.score_many(texts[i:i + BATCH]).tolist()
    return out


def _predict(model, texts: list[str]) -> list[float]:
    label = scoring.LABEL_PREFIX + "hq"
    out = []
    for text in texts:
        labels, probs = model.predict(scoring.to_line(text), k=-1)
        out.append(float(probs[labels.index(label)]))
    return out


def _theirs(model, model_file: str, texts: list[str]):
    """One pass of datatrove's filter over fresh Documents (it rewrites a document's text and metadata)."""
    from datatrove.data import Document
    from datatrove.pipeline.filters import FastTextClassifierFilter

    options = {}
    if "newline_replacement" in inspect.signature(FastTextClassifierFilter.__init__).parameters:
        options["newline_replacement"] = " "        # ours joins lines with a space (DCLM's join)
    filt = FastTextClassifierFilter(model_file, **options)
    # The same loaded model, not a download: datatrove's `model` property loads into `_model` when it is
    # unset (were it a cached property instead, the instance's own entry is what it reads first)
    filt._model = model
    filt.__dict__["model"] = model

    def one_pass() -> list[float]:
        docs = [Document(text=t, id=str(i), metadata={}) for i, t in enumerate(texts)]
        for doc in docs:
            filt.filter(doc)
        return [float(doc.metadata["__label__hq"]) for doc in docs]

    return one_pass


def _interleaved(runs: dict, passes: int) -> dict:
    """{name: (fastest CPU seconds, scores)} over `passes` passes of each, taken in turn."""
    best: dict = {}
    for _ in range(passes):
        for name, run in runs.items():
            start = time.process_time()
            found = run()
            seconds = time.process_time() - start
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, found)
    return best


def _max_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def _version(package: str) -> str:
    from importlib import metadata

    return metadata.version(package)


class _Dir:
    """A committed-like view of a directory, for `classifier.summary`."""

    def __init__(self, path: str):
        self.path = path

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)
