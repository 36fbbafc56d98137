"""The order training reads a source's windows in: a keyed, stateless permutation of range(M) per epoch.

    order = window_order.WindowOrder(num_windows=M, key=(seed,))     # a mixture's source: (seed, name seed)
    order.windows(np.arange(k0, k0 + B))     # (B,) int64: the windows the source gives as its examples k0..
    perm = window_order.Feistel(M, key=(seed, epoch))
    perm(np.array([0, 1, M - 1]))            # (3,) int64: one epoch's permutation at three positions

**Why stateless.** Example k of a source is window perm_e[k % M] of epoch e = k // M. Drawing perm_e as
`rng.permutation(np.arange(M))` holds M indices per epoch on every host, and an epoch boundary holds two:
M = 1.8e9 windows for 15T tokens at sequence 8,192, 7.3 GB of int32 each, before the copy that shuffling
makes. Here perm_e(i) is computed from (key, e, i) alone: a batch of B positions costs O(B) time and memory
and nothing is cached, so a resumed run or any process of a multi-host run computes any step's windows
directly (Levanter orders its data with a Feistel permutation for the same reason).

**How: a Feistel network over the smallest power of two, cycle-walked back into range.**
- Domain: n = (M - 1).bit_length() bits, the smallest 2^n >= M (so 2^n < 2M; M = 1 is n = 0, the identity).
- A round splits the n-bit state x into its low w bits R and its high n - w bits L and gives
      x' = (R << (n - w)) | ((L ^ F(R)) mod 2^(n - w)),
  a bijection of range(2^n) whatever F is: from x', R = x' >> (n - w) and L = (x' ^ F(R)) mod 2^(n - w).
  The halves swap each round, so w alternates n // 2, n - n // 2, ... (unbalanced when n is odd).
- F(R) = mix64(R ^ K_r): K_r is round r's 64-bit key, mix64 the splitmix64 finalizer (xor-shift 30,
  multiply 0xBF58476D1CE4E5B9, xor-shift 27, multiply 0x94D049BB133111EB, xor-shift 31; all mod 2^64).
- ROUNDS = 8 rounds. Luby and Rackoff: 3 rounds of random functions give a pseudorandom permutation, 4 a
  strong one; on domains of a few bits a round can hold little randomness (F of a 1-bit R takes 2 values).
  Where each position lands, counted over 20,000-40,000 keys at 8 rounds: within 2% of uniform for M <= 4,
  up to 11% off it for M = 5 to 7 (6 rounds: a chi-square about 4 times larger there), and as uniform as
  the count can tell from M = 9 to 256 (chi-square within 2.1 standard deviations of its degrees of
  freedom). A real source has thousands of windows or more.
- Keys: K_0 .. K_7 are the 64 bytes of blake2b(person=PERSON) over the key words (each an int in [0, 2^64),
  8 bytes little-endian), as eight little-endian uint64: the same on every host and under every numpy.
- Cycle walking: E is the 8-round network on range(2^n); perm(i) = the first of E(i), E(E(i)), ... that is
  < M. E permutes range(2^n), so following it from i < M returns into range(M) (at the latest back at i),
  and this is a bijection of range(M) (Black and Rogaway, 2002). Fewer than half of range(2^n) lies outside
  range(M), so a position takes under two steps on average.

The arithmetic is uint64 numpy, which wraps mod 2^64 by definition: a pass over a batch's positions is about
a hundred array operations, one pass per cycle-walk step, per epoch the batch spans (0.5-1.4 ms for 1,024
positions on a 2-core VM, `python -m benchmarks window_order`). tests/train/test_window_order.py holds a
scalar version of these rules, written from this docstring, to the vectorised one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

ROUNDS = 8
PERSON = b"refinery-window"       # blake2b's personalization: these keys are no other hash's
MAX_SIZE = 2**63 - 1              # positions and windows are int64
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


class Feistel:
    """A keyed bijection of range(size): `perm(positions)` maps an int array of positions to windows.

    `key`: ints in [0, 2^64) (a seed, a source's name seed, an epoch); another key gives another order.
    """

    def __init__(self, size: int, key: Sequence[int]):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= MAX_SIZE:
            raise ValueError(f"size={size!r} must be an int in [1, 2^63 - 1]: the number of windows")
        self.size = int(size)
        self.bits = (self.size - 1).bit_length()                       # n: 2^n >= size > 2^(n - 1)
        self.round_keys = round_keys(key)                              # (ROUNDS,) uint64
        low = [self.bits // 2, self.bits - self.bits // 2]
        self.low_bits = [low[r % 2] for r in range(ROUNDS)]             # w of each round
        # each round's (K, w, 2^w - 1, n - w, 2^(n - w) - 1) as uint64 scalars, made once
        self._rounds = [tuple(np.uint64(v) for v in (k, w, (1 << w) - 1, self.bits - w,
                                                      (1 << (self.bits - w)) - 1))
                        for k, w in zip(self.round_keys.tolist(), self.low_bits)]

    def __call__(self, positions) -> np.ndarray:
        """perm(positions): the same shape, int64. Raises IndexError for a position outside range(size)."""
        p = np.asarray(positions)
        if p.dtype.kind not in "iu":
            raise TypeError(f"positions must be integers, not {p.dtype}")
        if p.size and (p.min() < 0 or p.max() >= self.size):
            bad = p[(p < 0) | (p >= self.size)].flat[0]
            raise IndexError(f"position {bad} is outside range({self.size})")
        x = self.encrypt(p.astype(np.uint64).ravel())                  # (P,)
        outside = np.flatnonzero(x >= self.size)                       # cycle-walk these back into range
        while outside.size:
            x[outside] = self.encrypt(x[outside])
            outside = outside[x[outside] >= self.size]
        return x.astype(np.int64).reshape(p.shape)

    def encrypt(self, x: np.ndarray) -> np.ndarray:
        """The network E on range(2^bits): (P,) uint64 -> (P,) uint64, a permutation of range(2^bits)."""
        for k, w, low_mask, high_bits, high_mask in self._rounds:
            r = x & low_mask                                           # R: the low w bits
            x = (r << high_bits) | (((x >> w) ^ mix64(r ^ k)) & high_mask)
        return x


class WindowOrder:
    """A source's windows over epochs: its example k is window Feistel(M, key + (k // M,))(k % M)."""

    def __init__(self, num_windows: int, key: Sequence[int]):
        self.num_windows, self.key = int(num_windows), tuple(key)
        Feistel(self.num_windows, self.key)                            # checks M and the key now

    def windows(self, examples) -> np.ndarray:
        """The windows of examples k (any shape of ints >= 0): the same shape, int64."""
        k = np.asarray(examples, dtype=np.int64)
        if k.size and k.min() < 0:
            raise IndexError(f"example {k.min()} is negative; a source's examples count from 0")
        epochs, positions = np.divmod(k, self.num_windows)
        out = np.empty(k.shape, dtype=np.int64)
        for epoch in np.unique(epochs):                                # a batch spans one epoch or two
            at = epochs == epoch
            out[at] = Feistel(self.num_windows, (*self.key, int(epoch)))(positions[at])
        return out


def round_keys(key: Sequence[int]) -> np.ndarray:
    """(ROUNDS,) uint64 round keys from the key words: blake2b of the words, 8 bytes each, little-endian."""
    words = tuple(key)
    if not words or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or not 0 <= w < 2**64
                        for w in words):
        raise ValueError(f"key={words!r} must be one or more ints in [0, 2^64) (a seed, an epoch)")
    message = b"".join(int(w).to_bytes(8, "little") for w in words)
    digest = hashlib.blake2b(message, digest_size=8 * ROUNDS, person=PERSON).digest()
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


def mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on uint64 arrays (wrapping mod 2^64): a bijection that mixes every bit."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))
