"""Scoring documents with a fastText classifier: the probability of its positive label, one float64 per text.

    scorer = classifier.load_scorer(committed.path, "hq")        # a directory holding model.bin, or the file
    scorer.score_many(["Why is the sky blue? Because ...", "Buy cheap ..."])    # array([0.93, 0.02])
    model_header("openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin")["labels"]  # ['__label__hq', ...]

A `Scorer` holds the model file's path and the label, never the model: Beam pickles a DoFn with its
state and ships it to workers, and a fastText model (hundreds of MB to GB) has no business in that. The
model is loaded on first use, once per process and file (`_loaded`; a gs:// file is copied to local disk
first, since fastText reads only local files), and kept for every later call in that process.

`to_line` turns a document into the one line fastText reads, for training and scoring alike: training
on one spelling of a text and scoring another would score text the model never saw. fastText reads a
line per example (a newline ends the document: in training the rest becomes an example without a label,
and `predict` refuses one), so lines are joined with a space, as DCLM's scorer does
(`" ".join(text.strip().splitlines())`, baselines/mappers/enrichers in github.com/mlfoundations/dclm);
the same join, rather than only "\n" replaced, keeps the scores of DCLM's published classifier what
DCLM's own code gives. A word starting with fastText's label prefix ("__label__") would be read as a
label: in training, a second label of the document; in `predict` it is skipped as if absent. `to_line`
removes such words, so training sees what `predict` sees, and a score is unchanged by it.

The scores are fastText's probabilities as `predict` returns them (softmax + 1e-5: fastText adds 1e-5
before taking the log, so a score can exceed 1 by that much), cast from float32 to float64 exactly:
`score_many(texts)[i] == dict(zip(*model.predict(to_line(texts[i]), k=-1)))["__label__hq"]`.
`score_many` batches through fastText's multi-line predict when the bound `fasttext` module has it (the
full build's `multilinePredict`), one call per batch, otherwise it predicts text by text.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import struct
import tempfile
from collections.abc import Sequence

import numpy as np

from stages.io import storage

log = logging.getLogger(__name__)

MODEL_FILE = "model.bin"
LABEL_PREFIX = "__label__"          # fastText's default: a word starting with it is a label
# fastText splits words on these bytes (Dictionary::readWord); "\n" ends a line, and `to_line` removed it
_LABEL_WORD = re.compile(r"(?<![^ \t\v\f\r\0])__label__[^ \t\v\f\r\0]*")
_MAGIC, _VERSION = 793712314, 12    # the first two int32 of a fastText model file (.bin or quantized .ftz)
_LOSSES = {1: "hs", 2: "ns", 3: "softmax", 4: "ova"}
_MODELS = {1: "cbow", 2: "skipgram", 3: "supervised"}


def to_line(text: str) -> str:
    """The one line fastText reads for `text`: its lines joined by spaces (DCLM's join), words that start
    with the label prefix removed (see the module docstring)."""
    line = " ".join(text.strip().splitlines())
    return _LABEL_WORD.sub("", line) if LABEL_PREFIX in line else line


@dataclasses.dataclass(frozen=True)
class Scorer:
    """Scores texts with the fastText model at `model_file` (local or gs://): the probability of
    `positive_label` (without the "__label__" prefix). Picklable: it holds the path, not the model."""

    model_file: str
    positive_label: str = "hq"

    def score_many(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts),) float64: the positive label's probability of each text (see the module docstring)."""
        return probabilities(_loaded(self.model_file), texts, self.positive_label, self.model_file)


def probabilities(model, texts: Sequence[str], positive_label: str, where: str = "the model") -> np.ndarray:
    """(len(texts),) float64: `positive_label`'s probability of each text under the loaded fastText `model`
    (`where` names it in the error when it has no such label). `Scorer.score_many`, and the stage's own
    held-out scores, are this."""
    label = LABEL_PREFIX + positive_label
    if label not in model.labels:
        raise ValueError(f"{where} has no label {positive_label!r}; its labels are "
                         f"{plain_labels(model.labels)}")
    lines = [to_line(t) for t in texts]
    if not lines:
        return np.empty(0, np.float64)
    if hasattr(getattr(model, "f", None), "multilinePredict"):     # the full build: one call for all
        all_labels, all_probs = model.predict(lines, k=-1)
    else:                                                           # fasttext-predict: one at a time
        all_labels, all_probs = zip(*(model.predict(line, k=-1) for line in lines))
    out = np.empty(len(lines), np.float64)
    for i, (labels, probs) in enumerate(zip(all_labels, all_probs)):
        out[i] = probs[labels.index(label)]
    return out


def load_scorer(model_dir_or_file: str, positive_label: str = "hq") -> Scorer:
    """A `Scorer` of a model file, or of a directory holding `model.bin` (the classifier stage's output).
    Nothing is loaded here: the model loads where `score_many` is first called."""
    path = model_dir_or_file
    if not path.endswith((".bin", ".ftz")) and storage.exists(storage.join(path, MODEL_FILE)):
        path = storage.join(path, MODEL_FILE)
    return Scorer(path, positive_label)


@functools.lru_cache(maxsize=4)
def _loaded(path: str):
    """The fastText model at `path`, loaded once per process; a remote file is copied to local disk for
    fastText, which reads the whole model into memory, and the copy is removed."""
    import fasttext

    if storage.is_local(path):
        return fasttext.load_model(storage.local_path(path))
    with tempfile.TemporaryDirectory(prefix="refinery-fasttext-") as tmp:
        local = os.path.join(tmp, os.path.basename(path))
        with storage.open(path, "rb") as src, open(local, "wb") as dst:
            while chunk := src.read(1 << 24):
                dst.write(chunk)
        log.info("classifier: loading %s (%.0f MB)", path, os.path.getsize(local) / 1e6)
        return fasttext.load_model(local)


def plain_labels(labels: Sequence[str]) -> list[str]:
    """Labels without fastText's "__label__" prefix: ['hq', 'cc']."""
    return [label.removeprefix(LABEL_PREFIX) for label in labels]


def model_header(path: str) -> dict:
    """What a fastText model file says of itself before its matrices, read without loading it: {"labels"
    (with their prefix, in the model's order), "words", "dim", "word_ngrams", "bucket", "loss", "model",
    "min_count", "epoch"}. Reads the arguments and the dictionary (for DCLM's 2.4 GB classifier about
    50 MB; the labels come after every word); the matrices are never read. ValueError when the file is
    not a fastText model of the version this reads (12, every release since 0.9)."""
    with storage.open(path, "rb") as f:
        reader = _Reader(f, f"{path} is not a fastText model file: it ends inside the header")
        magic, version = reader.unpack("<ii")
        if (magic, version) != (_MAGIC, _VERSION):
            raise ValueError(f"{path} is not a fastText model file (magic {magic}, version {version}; "
                             f"expected {_MAGIC}, {_VERSION})")
        (dim, _ws, epoch, min_count, _neg, word_ngrams, loss, model, bucket, _minn, _maxn, _lr_update,
         _t) = reader.unpack("<12id")
        size, nwords, _nlabels, _ntokens, _prune = reader.unpack("<iiiqq")
        labels = []
        for _ in range(size):
            word = reader.until_zero()
            _count, kind = reader.unpack("<qb")
            if kind == 1:                  # entry_type::label; words (0) come first, then the labels
                labels.append(word.decode("utf-8", "replace"))
    return {"labels": labels, "words": nwords, "dim": dim, "word_ngrams": word_ngrams, "bucket": bucket,
            "loss": _LOSSES.get(loss, str(loss)), "model": _MODELS.get(model, str(model)),
            "min_count": min_count, "epoch": epoch}


class _Reader:
    """Reads a binary stream in 1 MB chunks: fixed-size fields and zero-terminated strings."""

    def __init__(self, f, short: str):
        self.f, self.buf, self.pos, self.short = f, b"", 0, short     # short: the error at a premature end

    def _fill(self, need: int) -> None:
        while len(self.buf) - self.pos < need:
            chunk = self.f.read(1 << 20)
            if not chunk:
                raise ValueError(self.short)
            self.buf = self.buf[self.pos:] + chunk
            self.pos = 0

    def unpack(self, fmt: str) -> tuple:
        n = struct.calcsize(fmt)
        self._fill(n)
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return out

    def until_zero(self) -> bytes:
        end = self.buf.find(b"\0", self.pos)
        while end < 0:
            self._fill(len(self.buf) - self.pos + 1)
            end = self.buf.find(b"\0", self.pos)
        out = self.buf[self.pos:end]
        self.pos = end + 1
        return out
