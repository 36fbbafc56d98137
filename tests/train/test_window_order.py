"""The stateless window order (stages/train/window_order.py): a bijection of range(M) for every key, equal at
any position to the closed form its docstring gives (written here again as plain Python integers), and
another order for another epoch or seed. That batches then depend on the step alone (a resumed run, each
process of several) is held in test_data.py and test_mixture.py, and for whole trainings in test_loop.py.
"""

import hashlib

import numpy as np
import pytest

from stages.train import window_order
from stages.train.window_order import Feistel, WindowOrder

MASK = 2**64 - 1


def reference(size: int, key: tuple[int, ...], position: int) -> int:
    """perm(position) by the docstring's rules, one position at a time in Python integers."""
    n = (size - 1).bit_length()
    digest = hashlib.blake2b(b"".join(w.to_bytes(8, "little") for w in key), digest_size=64,
                             person=b"refinery-window").digest()
    keys = [int.from_bytes(digest[8 * r: 8 * r + 8], "little") for r in range(8)]

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def network(x):
        for r, k in enumerate(keys):
            w = n // 2 if r % 2 == 0 else n - n // 2          # R's bits: n // 2 first, then the rest
            low, high = x & ((1 << w) - 1), x >> w
            x = (low << (n - w)) | ((high ^ mix(low ^ k)) & ((1 << (n - w)) - 1))
        return x

    x = network(position)
    while x >= size:                                          # cycle-walk back into range(size)
        x = network(x)
    return x


@pytest.mark.parametrize("key", [(0, 0), (1, 0), (5, 3), (2**64 - 1, 2**40, 7)])
def test_a_bijection_of_range_m_for_every_m_to_300(key):
    for m in range(1, 301):
        order = Feistel(m, key)(np.arange(m))
        assert order.dtype == np.int64 and order.shape == (m,)
        assert np.array_equal(np.sort(order), np.arange(m)), f"M={m} key={key}: not a permutation"


# M just under, at and just over powers of two (the domain doubles at 2^k + 1, where cycle walking starts),
# up to the largest M an int64 holds: the order is computed at any position without holding M of anything.
SIZES = sorted({m for k in (1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 47, 61, 62) for m in (2**k - 1, 2**k, 2**k + 1)}
               | {3, 12, 97, 2**63 - 1})


@pytest.mark.parametrize("size", SIZES)
def test_every_position_matches_the_closed_form(size):
    rng = np.random.default_rng(size % 2**32)
    ends = [0, 1, 2, size // 2, size - 3, size - 2, size - 1]
    positions = np.unique(np.array([p for p in ends if 0 <= p < size]
                                   + list(rng.integers(0, size, 24, dtype=np.int64)), dtype=np.int64))
    for key in [(0, 0), (9, 2), (2**63 + 11, 5, 123)]:
        got = Feistel(size, key)(positions)
        want = [reference(size, key, int(p)) for p in positions]
        assert got.tolist() == want, f"size={size} key={key}"
        assert all(0 <= w < size for w in want)
    # a scalar position gives a 0-d array; a 2-d batch keeps its shape
    assert int(Feistel(size, (1, 1))(size - 1)) == reference(size, (1, 1), size - 1)
    grid = positions[: len(positions) // 2 * 2].reshape(2, -1)
    assert Feistel(size, (1, 1))(grid).shape == grid.shape


@pytest.mark.parametrize("size", [1, 7, 1000, 2**31 + 3, 2**40 - 1])
def test_window_order_is_each_epochs_permutation_keyed_by_the_epoch(size):
    """Example k of a source is window perm_e(k % M) of epoch e = k // M, perm_e keyed by (*key, e)."""
    key = (42, 17)
    ks = np.array([0, 1, size - 1, size, size + 1, 2 * size - 1, 2 * size, 5 * size + size // 3], np.int64)
    got = WindowOrder(size, key).windows(ks)
    want = [reference(size, (*key, int(k) // size), int(k) % size) for k in ks]
    assert got.tolist() == want


def test_epochs_and_seeds_give_orders_unrelated_to_each_other_and_to_the_identity():
    m = 1000
    orders = {(seed, epoch): WindowOrder(m, (seed,)).windows(np.arange(epoch * m, (epoch + 1) * m))
              for seed in range(4) for epoch in range(3)}
    keys = sorted(orders)
    for i, a in enumerate(keys):
        # a random permutation agrees with a fixed one at 1 position in expectation (Poisson(1)); its
        # rank correlation with it is 0 +- 0.03
        assert np.sum(orders[a] == np.arange(m)) < 8, a
        assert abs(np.corrcoef(np.arange(m), orders[a])[0, 1]) < 0.15, a
        for b in keys[i + 1:]:
            assert np.sum(orders[a] == orders[b]) < 8, (a, b)
            assert abs(np.corrcoef(orders[a], orders[b])[0, 1]) < 0.15, (a, b)
    # consecutive positions land far apart: no runs of neighbouring windows
    steps = np.abs(np.diff(orders[0, 0]))
    assert np.median(steps) > m / 5


def test_bad_sizes_keys_and_positions_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"size=0 must be an int in \[1, 2\^63 - 1\]"):
        Feistel(0, (1,))
    with pytest.raises(ValueError, match=r"size=9223372036854775808 must be"):
        Feistel(2**63, (1,))
    with pytest.raises(ValueError, match=r"key=\(-1, 0\) must be one or more ints in \[0, 2\^64\)"):
        Feistel(10, (-1, 0))
    with pytest.raises(ValueError, match=r"key=\(\) must be"):
        window_order.round_keys(())
    with pytest.raises(IndexError, match=r"position 10 is outside range\(10\)"):
        Feistel(10, (1,))(np.array([3, 10]))
    with pytest.raises(IndexError, match=r"example -1 is negative"):
        WindowOrder(10, (1,)).windows([-1])
    with pytest.raises(TypeError, match="positions must be integers, not float64"):
        Feistel(10, (1,))(np.array([1.0]))
