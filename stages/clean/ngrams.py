"""Repeated and most frequent n-grams of a document's words, for Gopher repetition's rules, from a
rolling (polynomial) hash of every n-gram in numpy.

    grams = NGrams(words)                            # words: one document's, a tuple of str
    tops, repeats = grams.scan([2, 3, 4], [5, 6])    # upper bounds of both values, for each n
    top_n_gram_chars(words, 2, grams)                # the commonest 2-gram's characters times its count
    repeated_chars(words, 5, grams)                  # the characters in repeated 5-grams

`top_n_gram_chars` and `repeated_chars` are the exact values, as Gopher (and datatrove) count them; `scan`
bounds them from above in one numpy sort per document, so a filter computes an exact value only where a bound
trips its rule (`gopher.GopherRepetition.check`). Hashes only say where two n-grams may be equal: every exact
value compares the strings, so a hash collision costs time, never a different number (and only raises a
bound). numpy loads on first use: planning (a fully cached rerun included) imports the filters' configs and
no numpy.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # numpy loads when a repetition check runs (above)
    import numpy as np


def top_n_gram_chars(words: tuple[str, ...], n: int, grams: NGrams | None = None) -> int:
    """Characters of the most frequent n-gram (joined by spaces) times its count; the first one seen
    wins a tie, as in `Counter.most_common`. With `grams` (the words' `NGrams`), the n-grams are counted
    by hash in numpy and the winner's positions compared as words (a collision falls back to `Counter`)."""
    if grams is not None and n > 1:
        found = grams.top(n)
        if found is not None:
            i, top = found
            return (int(grams.offsets[i + n] - grams.offsets[i]) + n - 1) * top
    counts = Counter(zip(*(words[i:] for i in range(n))))
    values = list(counts.values())
    top = max(values)
    gram = next(itertools.islice(counts, values.index(top), None))    # the first seen with that count
    return (sum(map(len, gram)) + n - 1) * top


def repeated_chars(words: tuple[str, ...], n: int, grams: NGrams | None = None,
                    limit: tuple[int, float] = (1, math.inf)) -> int:
    """Characters in repeated n-grams, counted as Gopher (and datatrove) count them: walk the words;
    an n-gram seen before adds its characters and the walk jumps past it, else it is remembered and
    the walk steps one word. Here (as in datatrove) an n-gram is its words joined WITHOUT spaces, so
    `ab c` repeats `a bc`.

    The walk only has to stop at positions whose n-gram occurred earlier, so it visits those in
    Python and skips the rest: most documents have few or none. Which positions may repeat is found
    in numpy from a hash of each n-gram's characters (`NGrams.candidates`); their strings are then
    compared, so a hash collision costs time, never a different count. `grams` is the words' `NGrams`,
    built once per document for every n. With `limit` (chars, fraction), the walk stops once the count
    over `chars` is above `fraction` (a rule's test): what it returns then passes that test (the count can
    only grow), but is not the count.
    """
    grams = grams or NGrams(words)
    candidates = grams.candidates(n)              # every position whose n-gram may repeat, ascending
    if not len(candidates):
        return 0
    starts, text = candidates.tolist(), grams.text
    begins, ends = grams.offsets[candidates], grams.offsets[candidates + n]
    strings = [text[a:b] for a, b in zip(begins.tolist(), ends.tolist())]
    first = dict(zip(reversed(strings), reversed(starts)))      # each string's first position: its name
    firsts = list(map(first.__getitem__, strings))
    # An n-gram is remembered when the walk has stood on any of its positions. Every position not
    # jumped over is stood on; `jumped[p]` says whether p was jumped over. A first occurrence (left out
    # here) is stood on, or jumped over, and adds nothing. An n-gram is named by its first position.
    seen: set[int] = set()
    jumped = bytearray(len(words) + n)
    over = b"\1" * (n - 1)
    position = total = 0
    later = map(operator.ne, starts, firsts)
    for i, first_i, chars in itertools.compress(zip(starts, firsts, (ends - begins).tolist()), later):
        if i < position:                          # jumped over
            continue
        if first_i in seen or not jumped[first_i]:
            total += chars
            if total / limit[0] > limit[1]:
                break
            jumped[i + 1:i + n] = over
            position = i + n
        else:
            position = i + 1
        seen.add(first_i)
    return total


class NGrams:
    """One document's words, for finding its repeated n-grams in numpy, for every n.

    `text` is the words joined without spaces, and prefix sums give the hash of any run of its
    characters in O(1): h(text[a:b]) = sum_t text[a+t] * B^t = (S[b] - S[a]) * B^-a mod 2^64, with
    S[k] = sum_{j<k} text[j] * B^j (B odd, so B^-1 exists mod 2^64; numpy uint64 arithmetic wraps
    modulo 2^64 by definition, the arithmetic meant here). Equal strings have equal hashes; unequal
    ones rarely do, and the caller compares strings. The powers of B and B^-1 are tables shared by
    every document (`_powers`).

    Most documents have a few hundred words, where numpy's cost per call, not per element, dominates:
    hence `scan`, one set of calls for every n of both rules.
    """

    _BASE = 0x9E3779B97F4A7C15                       # odd
    _COMBINE = 0xA24BAED4963EE407                    # odd: combines the words' hashes into an n-gram's
    _MIX = 0xBF58476D1CE4E5B9                        # odd: carries a hash's low bits up (`_position_sort`)
    _PAD = 16                                        # `_ends` slices for n up to the shortest n + 16

    def __init__(self, words: tuple[str, ...]):
        import numpy as np

        m = len(words)
        self.words = words
        self.text = "".join(words)
        # word i is text[offsets[i]:offsets[i+1]]; past offsets[m], the text's end again `_PAD` times, so
        # that the ends of the spans of n words from every position, min(i + n, m), are a slice (`_ends`)
        self._bounds = np.empty(m + 1 + self._PAD, dtype=np.int64)
        self._bounds[0] = 0
        np.fromiter(map(len, words), dtype=np.int64, count=m).cumsum(out=self._bounds[1:m + 1])
        self._bounds[m + 1:] = self._bounds[m]
        self.offsets = self._bounds[:m + 1]
        codes = np.frombuffer(self.text.encode("utf-32-le"), dtype=np.uint32)
        self._sums = np.empty(len(codes) + 1, dtype=np.uint64)
        self._sums[0] = 0
        np.multiply(codes, _powers(self._BASE, len(codes)), out=self._sums[1:])
        np.cumsum(self._sums[1:], out=self._sums[1:])
        self._inverse = _powers(_inverse(self._BASE), len(codes))
        # `scan`'s hashes of runs of whole words, times M (`_MIX`): text[offsets[i]:offsets[j]] hashes
        # to (_at[j] - _at[i]) * _unit[i]; `_at_bounds` runs on as `_bounds` does
        self._at_bounds = self._sums[self._bounds]                                # (m + 1 + _PAD,)
        self._at = self._at_bounds[:m + 1]
        self._unit = self._inverse[self.offsets[:-1]] * np.uint64(self._MIX)   # (m,)
        self._word_keys = (self._at[1:] - self._at[:-1]) * self._unit         # (m,): each word's
        self._scanned: tuple = ([], [], None, None, 0)   # `scan`'s ns (top, repeat), rows, `same`, mask

    def _ends(self, values: np.ndarray, n: int, width: int) -> np.ndarray:
        """values[min(i + n, m)] for i < width, (width,), of `_bounds` or `_at_bounds`: a slice where
        their padding reaches, else a gather."""
        import numpy as np

        m = len(self.words)
        if n + width <= m + 1 + self._PAD:
            return values[n:n + width]
        return values[np.minimum(np.arange(n, n + width), m)]

    def _row(self, n: int, top: bool) -> tuple[np.ndarray, np.ndarray, int]:
        """`scan`'s sorted row for n (of the top n-grams, else of the repeated ones), its `same` and mask;
        for an n `scan` made no row for, the same of n alone."""
        import numpy as np

        top_ns, repeat_ns, ordered, same, mask = self._scanned
        if n in (top_ns if top else repeat_ns):
            row = top_ns.index(n) if top else len(top_ns) + repeat_ns.index(n)
            return ordered[row], same[row], mask
        keys = np.empty((1, len(self.words) - n + 1), dtype=np.uint64)
        (self._word_gram_keys if top else self._char_gram_keys)([n], keys)
        ordered, mask = _position_sort(keys)
        return ordered[0], _same_as_before(ordered, mask)[0], mask

    def top(self, n: int) -> tuple[int, int] | None:
        """(the first position of the commonest n-gram of words, its count), from a hash of each word
        sequence (a polynomial in the words' hashes); None when the winner's positions do not all hold
        the same words (a collision: the caller counts them itself). Of the hashes with the top count,
        the one at the first position wins, as the first seen wins `Counter.most_common`'s ties: the
        longest run of equal hashes in position order (`_position_sort`), of those the first seen. From
        the row `scan` sorted, if it did (its suffixes, in a run, fail the comparison), else a sort."""
        import numpy as np

        ordered, same, mask = self._row(n, top=True)
        position = np.arange(len(ordered))
        start = np.maximum.accumulate(np.where(same, 0, position))          # where its run starts
        first = (ordered[start] & mask).view(np.int64)                      # its run's first position
        end = int((((position - start) << mask.bit_length()) | (mask - first)).argmax())   # its last
        begin, i = int(start[end]), int(first[end])
        gram = self.words[i:i + n]
        if any(self.words[p:p + n] != gram for p in (ordered[begin + 1:end + 1] & mask).tolist()):
            return None
        return i, end - begin + 1

    def scan(self, top_ns: Iterable[int], repeat_ns: Iterable[int]) -> tuple[dict[int, int], dict[int, int]]:
        """Upper bounds of `top_n_gram_chars(words, n)` for each n of `top_ns`, and of
        `repeated_chars(words, n)` for each n of `repeat_ns` (`_repeat_bounds`), in one sort of a row of
        hashes per n (k rows), with their positions (`_position_sort`), so that equal ones lie together
        in position order: the exact values, in Python or from these rows, are needed only where a
        bound trips its rule. A row holds (width,) hashes, the shortest n's count of positions; past its
        own last position, the hashes of shorter runs (the text's suffixes)."""
        import numpy as np

        m = len(self.words)
        top_ns = sorted({n for n in top_ns if n <= m})
        repeat_ns = sorted({n for n in repeat_ns if n < m})            # two positions or more
        if not top_ns and not repeat_ns:
            return {}, {}
        width = m - min(top_ns[:1] + repeat_ns[:1]) + 1
        keys = np.empty((len(top_ns) + len(repeat_ns), width), dtype=np.uint64)
        if top_ns:
            self._word_gram_keys(top_ns, keys[:len(top_ns)])
        if repeat_ns:
            self._char_gram_keys(repeat_ns, keys[len(top_ns):])
        ordered, mask = _position_sort(keys)
        same = _same_as_before(ordered, mask)
        self._scanned = top_ns, repeat_ns, ordered, same, mask
        tops = self._top_bounds(top_ns, ordered[:len(top_ns)], same[:len(top_ns)])
        return tops, self._repeat_bounds(repeat_ns, ordered[len(top_ns):], same[len(top_ns):], mask)

    def _word_gram_keys(self, ns: list[int], keys: np.ndarray) -> None:
        """Fill `keys` (len(ns), width) with a hash of each n-gram of words, sum over t of h(word i + t) *
        C^t mod 2^64, for each n of `ns` (ascending); past a row's last n-gram, its shorter suffixes."""
        import numpy as np

        width = keys.shape[1]
        hashes = np.zeros(width + ns[-1] - 1, dtype=np.uint64)         # the words', then 0s
        hashes[:len(self._word_keys)] = self._word_keys
        gram = hashes[:width]
        if 1 in ns:
            keys[0] = gram
        for t, power in enumerate(_combine_powers(self._COMBINE, ns[-1])[1:], 1):
            out = keys[ns.index(t + 1)] if t + 1 in ns else None
            gram = np.add(gram, hashes[t:t + width] * power, out=out)

    def _char_gram_keys(self, ns: list[int], keys: np.ndarray) -> None:
        """Fill `keys` (len(ns), width) with a hash of each n-gram of characters (its words joined without
        spaces), (_at[i + n] - _at[i]) * _unit[i], for each n of `ns`; past a row's last n-gram, its shorter
        suffixes."""
        import numpy as np

        width = keys.shape[1]
        for row, n in enumerate(ns):
            np.subtract(self._ends(self._at_bounds, n, width), self._at[:width], out=keys[row])
        keys *= self._unit[:width]

    def _top_bounds(self, ns: list[int], ordered: np.ndarray, same: np.ndarray) -> dict[int, int]:
        """For each n of `ns` (a row each of `scan`), an upper bound of `top_n_gram_chars(words, n)`: the
        row's longest run of equal hashes (the top count or more: a collision only lengthens a run) times
        the characters of its longest n-gram (a suffix past the last is shorter than it)."""
        import numpy as np

        if not ns:
            return {}
        width = ordered.shape[1]
        index = np.arange(same.size)                                    # flat: numpy's 1-D loops are faster
        runs = np.maximum.accumulate(np.where(same.ravel(), 0, index))   # where each one's run starts
        counts = (index - runs).reshape(same.shape).max(axis=1) + 1
        starts = self.offsets[:width]
        return {n: int(count) * (int((self._ends(self._bounds, n, width) - starts).max()) + n - 1)
                for n, count in zip(ns, counts.tolist())}

    def _repeat_bounds(self, ns: list[int], ordered: np.ndarray, same: np.ndarray,
                       mask: int) -> dict[int, int]:
        """For each n of `ns` (a row each of `scan`), an upper bound of `repeated_chars(words, n)`: the
        characters of the union of the n-grams whose hash equals an earlier position's. The walk counts
        n-grams equal to an earlier one (so are their hashes) and never two that overlap, so at most the
        union's characters; a hash collision only widens the union."""
        import numpy as np

        if not same.any():                               # most documents: no n-gram twice
            return dict.fromkeys(ns, 0)
        m = len(self.words)
        later = same.ravel().nonzero()[0]                # flat
        # by row, then position (one key), each row's characters then shifted past the previous row's, so
        # that the union of the spans, in order, adds each span less what the one before it covers; a
        # suffix's span (cut at the end) is text too, and only widens a union
        order = later // ordered.shape[1] * (m + 1) + (ordered.ravel()[later] & mask).view(np.int64)
        order.sort()
        row, start = np.divmod(order, m + 1)
        shift = row * (int(self.offsets[-1]) + 1)
        begin = self.offsets[start] + shift
        end = self.offsets[np.minimum(start + np.array(ns)[row], m)] + shift
        spans = end - begin
        spans[1:] = end[1:] - np.maximum(begin[1:], end[:-1])
        return dict(zip(ns, np.bincount(row, weights=spans, minlength=len(ns)).astype(np.int64).tolist()))

    def candidates(self, n: int) -> np.ndarray:
        """Every position whose n-gram may equal another's, ascending, (count,): those in a run of two or
        more equal high bits of the sorted row for n (`_row`)."""
        import numpy as np

        if len(self.words) - n < 1:                      # one position at most
            return np.empty(0, dtype=np.int64)
        ordered, same, mask = self._row(n, top=False)
        runs = same.copy()                               # in a run of two or more: as the one before or after
        runs[:-1] |= same[1:]
        starts = (ordered[runs] & mask).view(np.int64)
        starts = starts[starts <= len(self.words) - n]   # not a suffix
        starts.sort()
        return starts


def _same_as_before(ordered: np.ndarray, mask: int) -> np.ndarray:
    """(k, width): whether each of `_position_sort`'s keys (k, width) has the high bits of the one
    before it in its row, in one pass over the flat array (faster than a 2-D one)."""
    import numpy as np

    flat = ordered.ravel()
    same = np.empty(flat.shape, dtype=bool)
    same[0] = False
    np.less_equal(flat[1:] ^ flat[:-1], mask, out=same[1:])
    same[::ordered.shape[1]] = False
    return same.reshape(ordered.shape)


def _position_sort(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """(`keys`, hashes times M (`NGrams._MIX`), with their low bits replaced by their position along the
    last axis, sorted along it; the mask of those bits), in place. Equal keys come out together in
    position order, as by a stable argsort, at the cost of a plain sort (several times less), and the
    mask reads their positions (`ordered & mask`). Keys whose high bits are equal come together too,
    like a hash collision: equal high bits (`ordered[1:] ^ ordered[:-1] <= mask`) say two n-grams may be
    equal, never that they are. M (odd, so a bijection: Fibonacci hashing) carries the low bits of a
    polynomial hash, which hold its first character, up."""
    import numpy as np

    mask = (1 << max(keys.shape[-1] - 1, 1).bit_length()) - 1
    keys &= np.uint64(2**64 - 1 - mask)
    keys |= np.arange(keys.shape[-1], dtype=np.uint64)
    keys.sort(axis=-1)
    return keys, mask


_POWERS: dict[int, np.ndarray] = {}       # base: base^0 .. base^(2^k - 1) mod 2^64
_POWERS_KEPT = 1 << 20                    # the longest table kept (8 MiB); a longer text computes its own


def _powers(base: int, count: int) -> np.ndarray:
    """base^0 .. base^(count-1) mod 2^64, (count,): a read-only slice of a table per base and process,
    grown to the next power of two when a longer text comes, so that a document costs a slice rather
    than a cumprod of its own."""
    import numpy as np

    table = _POWERS.get(base)
    if table is None or len(table) < count:
        table = np.full(max(1024, 1 << (count - 1).bit_length()), base, dtype=np.uint64)
        table[0] = 1
        np.cumprod(table, out=table)
        table.flags.writeable = False
        if len(table) <= _POWERS_KEPT:
            _POWERS[base] = table
    return table[:count]


@functools.cache
def _combine_powers(combine: int, count: int) -> tuple[np.uint64, ...]:
    """combine^0 .. combine^(count-1) mod 2^64, as numpy scalars."""
    import numpy as np

    return tuple(np.uint64(pow(combine, t, 2**64)) for t in range(count))


@functools.cache
def _inverse(base: int) -> int:
    """base^-1 mod 2^64 (base odd)."""
    return pow(base, -1, 2**64)
