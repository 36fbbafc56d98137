"""The word n-grams that push a fastText classifier's score up or down the most, read from its matrices.

    top(model, "hq", lines, count=20)     # {"most_positive": [{"ngram", "weight", "count"}], ...}

A supervised fastText model averages the input-matrix rows of a line's features (its words in the
vocabulary, and each run of up to wordNgrams words hashed into one of `bucket` rows after them) into a
hidden vector h, and scores each label by its output-matrix row: p = softmax(B h). With two labels and
softmax loss, the log-odds of the positive label is (B[pos] - B[neg]) . h, the mean over the line's
features of (B[pos] - B[neg]) . A[row]: that number is a feature's weight here, exactly the log-odds it
adds to a line made of it alone, and a document's log-odds is the mean of its features' weights (with more
labels, B[neg] is the mean of the other labels' rows, and the weight only ranks the features).

Words are the model's vocabulary (every one, weighed in one matrix product). Bigrams have no names in
the model, only hashed rows, so they are taken from text: the distinct word pairs of `lines` (training
text), each hashed as fastText hashes them (`bigram_rows`, checked against fastText's own predictions in
the tests). Two bigrams can share a row (a hash collision; rare with 2M rows), and then share a weight.
Only features seen at least `MIN_COUNT` times are listed (the vocabulary's counts for words, counts in
`lines` for bigrams): a rare feature's weight comes from a few documents, or from the common bigram it
shares a hash row with. A quantized model (.ftz) keeps
no plain matrices: nothing is listed for it. "</s>", the end-of-line token every line holds, is not
listed.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence

import numpy as np

from stages.classifier.scoring import LABEL_PREFIX

MIN_COUNT = 5       # a rarer feature's weight comes from a handful of documents (or a shared hash row)
EOS = "</s>"
METHOD = ("weight = (output[positive] - output[other]) . input row: the log-odds a feature adds, a "
          "document's log-odds being the mean of its features' weights (words: the model's vocabulary; "
          "bigrams: the word pairs of the training text sampled, hashed to their rows as fastText does)")
_SPLIT = re.compile(r"[ \t\v\f\r\0\n]+")        # fastText's word separators (Dictionary::readWord)
_BIGRAM_MULT = 116049371                        # Dictionary::addWordNgrams
_U64 = (1 << 64) - 1


def top(model, positive_label: str, lines: Iterable[str] = (), count: int = 20) -> dict:
    """{"most_positive": [...], "most_negative": [...]} (each up to `count` {"ngram", "weight", "count"},
    words and bigrams together, by weight), with "words" and "bigrams": how many of each were weighed."""
    if model.f.isQuant():
        return {"most_positive": [], "most_negative": [], "words": 0, "bigrams": 0,
                "skipped": "a quantized model keeps no plain matrices"}
    direction = _direction(model, LABEL_PREFIX + positive_label)        # (dim,)
    inputs = np.asarray(model.f.getInputMatrix())                      # (nwords + bucket, dim), a view
    words, freqs = model.get_words(include_freq=True)
    nwords = len(words)
    weights = inputs[:nwords] @ direction                              # (nwords,)
    found = [(w, float(weights[i]), int(c)) for i, (w, c) in enumerate(zip(words, freqs))
             if c >= MIN_COUNT and w != EOS]
    counted = {"words": len(found), "bigrams": 0}
    args = model.f.getArgs()
    if args.wordNgrams > 1 and args.bucket > 0:
        pairs = collections.Counter(p for line in lines for p in _pairs(line))
        pairs = {p: c for p, c in pairs.items() if c >= MIN_COUNT}
        rows = bigram_rows(list(pairs), nwords, args.bucket)                # (P,)
        bigram_weights = inputs[rows] @ direction if rows.size else np.empty(0)
        found += [(f"{a} {b}", float(w), c) for ((a, b), c), w in zip(pairs.items(), bigram_weights)]
        counted["bigrams"] = len(pairs)
    ranked = sorted(found, key=lambda f: (-f[1], f[0]))
    rows_out = [{"ngram": name, "weight": float(f"{weight:.5g}"), "count": c} for name, weight, c in ranked]
    return {"most_positive": rows_out[:count], "most_negative": rows_out[::-1][:count]} | counted


def _direction(model, label: str) -> np.ndarray:
    """(dim,): B[positive] minus the mean of the other labels' output rows."""
    outputs = np.asarray(model.get_output_matrix(), np.float64)         # (labels, dim)
    pos = list(model.labels).index(label)
    others = np.delete(outputs, pos, axis=0)
    return outputs[pos] - others.mean(axis=0)


def _pairs(line: str) -> Iterable[tuple[str, str]]:
    words = [w for w in _SPLIT.split(line) if w]
    return zip(words, words[1:])


def bigram_rows(pairs: Sequence[tuple[str, str]], nwords: int, bucket: int) -> np.ndarray:
    """(len(pairs),) int64: the input-matrix row fastText gives each word pair (nwords + the pair's hash %
    bucket, Dictionary::addWordNgrams): each word's 32-bit FNV-1a hash (`word_hash`), sign-extended to
    64 bits as fastText's int32 vector holds it, then h = h * 116049371 + next, modulo 2**64."""
    cache: dict[str, int] = {}

    def h(word: str) -> int:
        if word not in cache:
            cache[word] = _sign_extended(word_hash(word))
        return cache[word]

    return np.array([nwords + ((h(a) * _BIGRAM_MULT + h(b)) & _U64) % bucket for a, b in pairs], np.int64)


def word_hash(word: str) -> int:
    """fastText's hash of a word (Dictionary::hash): 32-bit FNV-1a over its UTF-8 bytes, each byte taken as
    a signed char first (so bytes >= 128 are xored in as 0xFFFFFFxx)."""
    h = 2166136261
    for byte in word.encode("utf-8"):
        h = ((h ^ (byte | 0xFFFFFF00 if byte >= 128 else byte)) * 16777619) & 0xFFFFFFFF
    return h


def _sign_extended(h: int) -> int:
    return h | 0xFFFFFFFF00000000 if h & 0x80000000 else h
