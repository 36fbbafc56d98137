"""MinHash LSH near-duplicate detection for the clean stage: the pure parts (graph.py wires them into Beam).

    hasher = minhash.MinHasher(bands=14, rows=8, ngram=5, seed=1)     # FineWeb's parameters
    keys = hasher.band_keys(["first text ...", "second text ..."])    # per text: 14 band keys, or None
    forest = minhash.UnionFind(); forest.union(node_a, node_b); forest.find(node_b) == min(node_a, node_b)

The method is datatrove's (`datatrove.pipeline.dedup.minhash`, which FineWeb ran), written for numpy:

1. `simplify`: lowercase, runs of digits to "0", accents stripped (NFD, combining marks dropped), and every
   punctuation, symbol, control or space character a word break; then split on the breaks. This is
   datatrove's `simplify_text` with its default `TextNormConfig` followed by its word tokenizer, which on
   text without punctuation splits on spaces. Scripts written without spaces (Chinese, Japanese, Thai)
   give few words here and so few shingles: such documents are rarely matched (datatrove segments them).
2. Shingles: every `ngram` consecutive words. Each word is hashed once with 8 bytes of blake2b (cached
   per worker), and a shingle's 64-bit hash chains the `mix64` of its words' hashes in order. A text with
   fewer than `ngram` words has no shingle and no signature; it is never a near duplicate (as in datatrove).
3. Signature: `bands * rows` hash functions h_i(x) = (a_i * x + b_i) mod 2^64 with a_i odd, so each is a
   bijection of the 64-bit integers (a permutation, as MinHash wants) applied to shingle hashes that are
   already uniformly mixed. This is the universal hash datatrove uses, without its mod (2^61 - 1) that
   follows a uint64 product which has already wrapped. numpy uint64 array arithmetic wraps modulo 2^64 by
   definition (no overflow warning, no float rounding), which is the arithmetic meant here.
   signature[i] = min over the shingles of h_i, so P(signature[i] equal for two texts) is the Jaccard
   similarity s of their shingle sets. a_i and b_i come from blake2b(seed, i): the same on every worker,
   in every run, under every numpy version.
4. Bands: the signature in `bands` runs of `rows` values; each band's 8-byte values hashed to a 16-byte
   key. Texts sharing any (band, key) are candidates, with probability 1 - (1 - s^rows)^bands: for 14 x 8,
   0.9996 at s = 0.9, 0.92 at 0.8, 0.053 at 0.5, 0.0009 at 0.3 (the threshold (1/14)^(1/8) is about 0.72).
5. Clusters: the connected components of the candidate pairs (`UnionFind`; a~b and b~c join a, b, c
   even when a and c share no band). The survivor of a cluster is its smallest node: the smallest id,
   as exact dedup keeps (`node`).
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
import unicodedata
from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # numpy loads when hashing starts: clean.Config imports this module to check its
    import numpy as np  # parameters, and planning (a fully cached rerun included) imports no numpy

_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB   # splitmix64's multipliers
_NUMBERS = re.compile(r"\d+(?:[.,\u060c\u066b\u2396\u2397\u2398]\d+)?")   # 3.14 and 1,000 are one number
WORD_CACHE_LIMIT = 1 << 20      # words whose hash a worker remembers; cleared when full
CHUNK_SHINGLES = 1 << 14        # shingles hashed per numpy pass: (16384, 112) uint64 is 14 MiB


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on a uint64 array, in place: a bijection with full avalanche."""
    import numpy as np

    x ^= x >> np.uint64(30)
    x *= np.uint64(_M1)
    x ^= x >> np.uint64(27)
    x *= np.uint64(_M2)
    x ^= x >> np.uint64(31)
    return x


_NUMBERS_ASCII = re.compile(rb"[0-9]+(?:[.,][0-9]+)?")
# ASCII fast path: every ASCII byte that is not a letter or digit becomes a space (bytes.translate, C speed).
_ASCII_BREAKS = bytes(c if chr(c).isalnum() else 32 for c in range(128)) + bytes(range(128, 256))


@functools.cache
def _unicode_table() -> dict[int, str | None]:
    """For `str.translate` after NFD: combining marks (Mn) deleted, and every word break (punctuation P*,
    symbols S*, separators and spaces Z*, controls Cc, `_`) to a space. Built once per process (~0.2 s)."""
    table: dict[int, str | None] = {}
    for c in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(c))
        if cat == "Mn":
            table[c] = None
        elif cat[0] in "PSZ" or cat == "Cc":
            table[c] = " "
    return table


def simplify(text: str) -> list[bytes]:
    """The words MinHash shingles, UTF-8 encoded:
    `simplify("Héllo, World! 3.14 x_y")` == [b"hello", b"world", b"0", b"x", b"y"]."""
    text = text.lower()
    if text.isascii():
        raw = _NUMBERS_ASCII.sub(b"0", text.encode("ascii"))
        return raw.translate(_ASCII_BREAKS).split()
    text = _NUMBERS.sub("0", unicodedata.normalize("NFD", text))
    return text.translate(_unicode_table()).encode("utf-8", "surrogatepass").split()


def check_parameters(bands: int, rows: int, ngram: int) -> None:
    """ValueError naming the clean.Config field when a MinHash parameter is out of range."""
    for name, value in (("minhash_bands", bands), ("minhash_rows", rows), ("minhash_ngram", ngram)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"clean.Config.{name}={value!r} must be an int >= 1 "
                             "(FineWeb: minhash_bands=14, minhash_rows=8, minhash_ngram=5)")
    if bands > 255:
        raise ValueError(f"clean.Config.minhash_bands={bands!r} must be <= 255 (FineWeb: 14)")


class MinHasher:
    """Signatures and band keys for texts; picklable, and equal parameters give equal results anywhere."""

    def __init__(self, bands: int = 14, rows: int = 8, ngram: int = 5, seed: int = 1):
        import numpy as np

        check_parameters(bands, rows, ngram)
        self.bands, self.rows, self.ngram, self.seed = bands, rows, ngram, seed
        digests = [hashlib.blake2b(f"minhash:{seed}:{i}".encode(), digest_size=16).digest()
                   for i in range(bands * rows)]
        ab = np.frombuffer(b"".join(digests), dtype="<u8").astype(np.uint64).reshape(-1, 2)   # (K, 2)
        self.a, self.b = ab[:, 0] | np.uint64(1), ab[:, 1].copy()                            # (K,) each
        self._words: dict[bytes, bytes] = {}
        self._buffer = np.empty((CHUNK_SHINGLES, len(self.a)), np.uint64)   # reused: no page faults per call

    def __getstate__(self):   # Beam pickles the hasher into its DoFns: caches stay behind
        return {k: v for k, v in self.__dict__.items() if k not in ("_words", "_buffer")}

    def __setstate__(self, state):
        import numpy as np

        self.__dict__.update(state, _words={}, _buffer=np.empty((CHUNK_SHINGLES, len(state["a"])), np.uint64))

    def shingles(self, text: str) -> np.ndarray:
        """The 64-bit hashes of the text's `ngram`-word shingles, in order (repeats kept): (n,) uint64."""
        import numpy as np

        words = simplify(text)
        n = len(words) - self.ngram + 1
        if n <= 0:
            return np.zeros(0, np.uint64)
        cache = self._words
        if len(cache) > WORD_CACHE_LIMIT:
            cache.clear()
        parts = []
        for w in words:
            h = cache.get(w)
            if h is None:
                h = cache[w] = hashlib.blake2b(w, digest_size=8).digest()
            parts.append(h)
        word_hashes = np.frombuffer(b"".join(parts), dtype="<u8").astype(np.uint64)     # (words,)
        out = np.full(n, 0x9E3779B97F4A7C15, np.uint64)
        for j in range(self.ngram):       # order matters: "a b c d e" and "e d c b a" differ
            out ^= word_hashes[j:j + n]
            mix64(out)
        return out

    def signatures(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(signatures (D, bands * rows) uint64, has_signature (D,) bool): a text with no shingle gets a
        row of zeros and False. Texts are hashed together, CHUNK_SHINGLES at a time, so short texts
        do not pay numpy's per-call cost one by one."""
        import numpy as np

        sigs = np.zeros((len(texts), len(self.a)), np.uint64)
        shingles = [self.shingles(t) for t in texts]
        has = np.array([len(s) > 0 for s in shingles], bool)
        start = 0
        while start < len(texts):
            stop, total = start, 0
            while stop < len(texts) and (stop == start or total + len(shingles[stop]) <= CHUNK_SHINGLES):
                total += len(shingles[stop])
                stop += 1
            docs = [d for d in range(start, stop) if has[d]]
            if docs:
                flat = np.concatenate([shingles[d] for d in docs])                      # (N,)
                if len(flat) > len(self._buffer):   # one text longer than a chunk
                    self._buffer = np.empty((len(flat), len(self.a)), np.uint64)
                hashed = self._buffer[:len(flat)]                                       # (N, K)
                np.multiply(flat[:, None], self.a[None, :], out=hashed)                 # wraps mod 2^64
                hashed += self.b
                offsets = np.cumsum([0] + [len(shingles[d]) for d in docs[:-1]])
                sigs[docs] = np.minimum.reduceat(hashed, offsets, axis=0)               # (docs, K)
            start = stop
        return sigs, has

    def band_keys(self, texts: Sequence[str]) -> list[list[bytes] | None]:
        """Per text, its `bands` LSH keys (band index byte + 16 bytes of blake2b of the band's values),
        or None when it has no shingle. Texts sharing a key are near-duplicate candidates."""
        sigs, has = self.signatures(texts)
        width = self.rows * 8
        out: list[list[bytes] | None] = []
        for row, ok in zip(sigs.astype("<u8"), has):
            if not ok:
                out.append(None)
                continue
            raw = row.tobytes()
            out.append([bytes((b,)) + hashlib.blake2b(raw[b * width:(b + 1) * width], digest_size=16).digest()
                        for b in range(self.bands)])
        return out


def node(doc_id: str | None, key: bytes) -> tuple:
    """A document's node in the candidate graph, ordered as `order.doc_order` orders ids (a null id first),
    then by `key` (`clean.duplicate_key` of its text), so the smallest node of a cluster is the survivor."""
    return (doc_id is not None, doc_id or "", key)


def node_key(n: tuple) -> bytes:
    return n[2]


class UnionFind:
    """Disjoint sets of hashable, ordered nodes whose representative is always the set's smallest node,
    so the result depends only on the edges, not on their order (union by order, path halving)."""

    def __init__(self):
        self.parent: dict[Hashable, Hashable] = {}

    def find(self, x):
        parent = self.parent
        while True:
            p = parent.get(x, x)
            if p == x:
                return x
            grand = parent.get(p, p)
            parent[x] = grand       # path halving: point x at its grandparent and go on from there
            x = grand

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            low, high = (ra, rb) if ra < rb else (rb, ra)
            self.parent[high] = low
            self.parent.setdefault(low, low)

    def union_all(self, edges: Iterable[tuple]) -> None:
        for a, b in edges:
            self.union(a, b)

    def edges(self) -> list[tuple]:
        """(node, its set's smallest node) for every node but the smallest: a forest with the same sets."""
        return [(x, r) for x in self.parent if (r := self.find(x)) != x]

    def components(self) -> dict:
        """node -> its set's smallest node, for every node that was ever joined to another."""
        return {x: self.find(x) for x in self.parent}


def hasher(config) -> MinHasher:
    """The MinHasher of a clean.Config's minhash_* settings (a bad one fails here, naming itself)."""
    return MinHasher(bands=config.minhash_bands, rows=config.minhash_rows, ngram=config.minhash_ngram,
                     seed=config.minhash_seed)
