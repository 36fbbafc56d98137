"""Reference text in bits per byte: a yardstick that no data or tokenizer choice can move.

    from stages.train import scoring
from stages.yardstick_data import reference
    scorer = scoring.Scorer(net, prefix_id=eos_id)
    docs = reference.embedded_documents()                   # [(title, text)], from package data
    reference.bits_per_byte(scorer, sp.encode, docs)        # {"bpb", "low", "high", "docs", "bytes"}

Each document is scored with rolling windows (every token predicted once, `Scorer.loglikelihood_rolling`);
its negative log-likelihood in nats, over ln 2, is its bits (`document_bits`: the one per-document figure,
which the perplexity stage's column divides by each document's bytes too). The set's figure is total bits /
total UTF-8 bytes of the documents' TEXT (never counted from tokens, so two tokenizers are scored over the
same bytes), with a 95% bootstrap interval over documents (fixed seed).

The embedded default's set (`EMBEDDED`) is Aesop's fables in George Fyler Townsend's 1867 translation
(public domain; see data/README.md), read straight from this package: no download, clean or tokenizer
setting touches it, and it is not part of the embedded training corpus (Python's stdlib docstrings and
pydoc topics), which tests/stages/test_reference.py checks 13-gram by 13-gram.
"""

from __future__ import annotations

import importlib.resources
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # numpy loads when bits per byte are computed: clean.Config checks its reference set
    import numpy as np  # names here while planning, and planning imports no numpy (docs/ARCHITECTURE.md)

EMBEDDED = "aesop_fables"            # the embedded default's reference set: data/aesop_fables.txt
SEPARATOR = "\n----\n"               # between documents in a packaged set's .txt
RESAMPLES = 1000
SEED = 0


def embedded_documents(name: str = EMBEDDED) -> list[tuple[str, str]]:
    """[(title, text)] of the packaged set `name` (data/<name>.txt: documents separated by a line
    "----"; a document's first line is its title, and part of its text)."""
    path = importlib.resources.files("stages.yardstick_data").joinpath("data", f"{name}.txt")
    if not path.is_file():
        raise ValueError(f"reference set {name!r}: no packaged file data/{name}.txt "
                         f"the packaged sets are {packaged_sets()}")
    text = path.read_text(encoding="utf-8")
    return [(doc.split("\n", 1)[0], doc) for doc in text.strip("\n").split(SEPARATOR)]


def packaged_sets() -> list[str]:
    data = importlib.resources.files("stages.yardstick_data").joinpath("data")
    return sorted(p.name[:-4] for p in data.iterdir() if p.name.endswith(".txt"))


def bits_per_byte(scorer, encode: Callable[[str], list[int]], documents: Sequence[tuple[str, str]], *,
                  seed: int = SEED, resamples: int = RESAMPLES) -> dict:
    """{"bpb", "low", "high", "docs", "bytes"} of `documents` [(name, text)] under `scorer`
    (`scoring.Scorer`), each text tokenized with `encode` (e.g. a SentencePieceProcessor's encode)."""
    import numpy as np

    texts = [text for _, text in documents]
    nbytes = np.asarray([len(text.encode("utf-8")) for text in texts], np.float64)       # (N,)
    empty = [name for (name, _), n in zip(documents, nbytes) if n == 0]
    if not texts or empty:
        raise ValueError(f"reference documents: {len(texts)} given, empty ones {empty[:5]}; every document "
                         f"needs text")
    bits = document_bits(scorer, [encode(text) for text in texts])
    return bits_per_byte_of(bits, nbytes, seed=seed, resamples=resamples)


def document_bits(scorer, documents: Sequence[Sequence[int]]) -> np.ndarray:
    """(N,) float64: each tokenized document's bits under `scorer` (`scoring.Scorer`, duck-typed): every
    token predicted once (`loglikelihood_rolling_many`: rolling windows of the scorer's length, the first
    after its prefix token, all documents' windows packed together), minus the summed log-prob (nats) over
    ln 2. A document of no tokens has 0 bits."""
    import numpy as np

    logprobs = scorer.loglikelihood_rolling_many([list(ids) for ids in documents]) if documents else []
    return -np.asarray(logprobs, np.float64).reshape(len(documents)) / math.log(2)


def bits_per_byte_of(bits, nbytes, *, seed: int = SEED, resamples: int = RESAMPLES) -> dict:
    """{"bpb", "low", "high", "docs", "bytes"} from each document's bits (`document_bits`) and UTF-8 bytes."""
    import numpy as np

    nbytes = np.asarray(nbytes, np.float64)                                              # (N,)
    bits = np.asarray(bits, np.float64)                                                  # (N,)
    low, high = bootstrap_ratio(bits, nbytes, seed=seed, resamples=resamples)
    return {"bpb": float(bits.sum() / nbytes.sum()), "low": low, "high": high, "docs": len(bits),
            "bytes": int(nbytes.sum())}


def bootstrap_ratio(num: np.ndarray, den: np.ndarray, *, seed: int, resamples: int) -> tuple[float, float]:
    """95% percentile interval of sum(num) / sum(den) over documents resampled with replacement."""
    import numpy as np

    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(num), size=(resamples, len(num)))                      # (R, N)
    ratios = num[picks].sum(axis=1) / den[picks].sum(axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)
