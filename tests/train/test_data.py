import numpy as np
import pytest

from stages.io import llmc
from stages.train import data, window_order

SEQ = 8


def _shards(tmp_path, lengths, vocab_size=1000, seed=0):
    """Writes one llm.c shard per length; returns (paths, manifest, all tokens concatenated)."""
    rng = np.random.default_rng(seed)
    paths, pieces = [], []
    for i, n in enumerate(lengths):
        tokens = rng.integers(0, vocab_size, n)
        path = str(tmp_path / f"train-{i:05d}.bin")
        llmc.write(path, [tokens], vocab_size)
        paths.append(path)
        pieces.append(tokens)
    manifest = {"dtype": llmc.dtype_for(vocab_size).name, "vocab_size": vocab_size, "eos_id": 1,
                "header_bytes": llmc.HEADER_BYTES}
    return paths, manifest, np.concatenate(pieces)


def _windows(stream, seq_len=SEQ):
    m = (len(stream) - 1) // seq_len
    return [tuple(stream[w * seq_len: w * seq_len + seq_len + 1]) for w in range(m)]


def test_one_epoch_holds_every_window_once_with_exact_tokens(tmp_path):
    # 97 tokens over three shards (windows cross shard ends): M = 96 // 8 = 12 windows, 3 steps of 4.
    paths, manifest, stream = _shards(tmp_path, [50, 7, 40])
    td = data.TokenData(paths, manifest, seq_len=SEQ, global_batch=4, seed=3)
    assert td.num_windows == 12
    rows = np.concatenate([td.batch(s) for s in range(3)])
    assert rows.shape == (12, SEQ + 1) and rows.dtype == np.int32
    assert sorted(map(tuple, rows)) == sorted(_windows(stream))
    assert [tuple(r) for r in rows] != _windows(stream)        # shuffled, not in stream order


def test_uint32_shards_keep_large_ids(tmp_path):
    paths, manifest, stream = _shards(tmp_path, [30, 30], vocab_size=100_000)
    assert manifest["dtype"] == "uint32" and stream.max() > 65535
    td = data.TokenData(paths, manifest, seq_len=SEQ, global_batch=7, seed=0)
    rows = td.batch(0)
    assert sorted(map(tuple, rows)) == sorted(_windows(stream))    # M = 59 // 8 = 7


def test_batch_is_a_pure_function_of_step_and_seed(tmp_path):
    paths, manifest, _ = _shards(tmp_path, [300])
    a = data.TokenData(paths, manifest, seq_len=SEQ, global_batch=4, seed=5)
    b = data.TokenData(paths, manifest, seq_len=SEQ, global_batch=4, seed=5)
    later = [a.batch(s) for s in (40, 3, 17, 0)]                # out of order, across epochs (M = 37)
    np.testing.assert_array_equal(later, [b.batch(s) for s in (40, 3, 17, 0)])
    c = data.TokenData(paths, manifest, seq_len=SEQ, global_batch=4, seed=6)
    assert not np.array_equal(a.batch(0), c.batch(0))


def test_process_slices_tile_the_global_batch(tmp_path):
    paths, manifest, _ = _shards(tmp_path, [210])                  # M = 26: steps 4 and 8 straddle epochs
    whole = data.TokenData(paths, manifest, seq_len=SEQ, global_batch=6, seed=1)
    parts = [data.TokenData(paths, manifest, seq_len=SEQ, global_batch=6, seed=1, process_index=i,
                            process_count=3) for i in range(3)]
    for step in (8, 0, 4, 5, 11):                                  # out of order: no state between steps
        local = [p.batch(step) for p in parts]
        assert all(x.shape == (2, SEQ + 1) for x in local)
        np.testing.assert_array_equal(np.concatenate(local), whole.batch(step))
    with pytest.raises(ValueError, match="global_batch=6 does not divide by process_count=4"):
        data.TokenData(paths, manifest, seq_len=SEQ, global_batch=6, seed=1, process_count=4)


def test_epochs_wrap_with_a_new_permutation(tmp_path):
    paths, manifest, stream = _shards(tmp_path, [97])             # M = 12
    td = data.TokenData(paths, manifest, seq_len=SEQ, global_batch=4, seed=0)
    first = np.concatenate([td.batch(s) for s in range(3)])
    second = np.concatenate([td.batch(s) for s in range(3, 6)])
    assert sorted(map(tuple, second)) == sorted(_windows(stream))
    assert not np.array_equal(first, second)
    # A batch straddling the epoch end: global_batch 5, step 2 holds examples 10..14.
    td5 = data.TokenData(paths, manifest, seq_len=SEQ, global_batch=5, seed=0)
    epoch0, epoch1 = window_order.Feistel(12, key=(0, 0)), window_order.Feistel(12, key=(0, 1))
    windows = [*epoch0(np.array([10, 11])), *epoch1(np.arange(3))]
    expect = [stream[w * SEQ: w * SEQ + SEQ + 1] for w in windows]
    np.testing.assert_array_equal(td5.windows(2), windows)
    np.testing.assert_array_equal(td5.batch(2), expect)
    # keyed by (seed, epoch) only: the same examples are the same windows at another batch size
    np.testing.assert_array_equal(td5.order.windows(np.arange(36)), td.order.windows(np.arange(36)))


def test_too_few_tokens_and_wrong_dtype_are_clear_errors(tmp_path):
    paths, manifest, _ = _shards(tmp_path, [8])
    with pytest.raises(ValueError, match="fewer than seq_len"):
        data.TokenData(paths, manifest, seq_len=SEQ, global_batch=1, seed=0)
    with pytest.raises(ValueError, match="manifest says dtype=uint32"):
        data.TokenData(paths, dict(manifest, dtype="uint32"), seq_len=2, global_batch=1, seed=0)


def test_segment_ids_count_eos_strictly_before():
    eos = 1
    tokens = np.array([[5, 1, 7, 8, 1, 1, 3],
                       [1, 2, 3, 4, 5, 6, 7]])
    want = np.array([[0, 0, 1, 1, 1, 2, 3],
                     [0, 1, 1, 1, 1, 1, 1]])
    got = data.segment_ids(tokens, eos)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)

    import jax
    import jax.numpy as jnp

    np.testing.assert_array_equal(jax.jit(data.segment_ids, static_argnums=1)(jnp.asarray(tokens), eos), want)


def test_eval_batches_read_every_window_in_order(tmp_path):
    paths, manifest, stream = _shards(tmp_path, [60, 41])            # M = 100 // 8 = 12
    batches = list(data.eval_batches(paths, manifest, seq_len=SEQ, batch_size=5))
    assert [len(b) for b in batches] == [5, 5, 2]
    assert [tuple(r) for r in np.concatenate(batches)] == _windows(stream)
    dropped = list(data.eval_batches(paths, manifest, seq_len=SEQ, batch_size=5, drop_remainder=True))
    assert [len(b) for b in dropped] == [5, 5]
    # Two processes: each yields its half of every global batch; the last one is cut to an even size.
    halves = [list(data.eval_batches(paths, manifest, seq_len=SEQ, batch_size=4, process_index=i,
                                     process_count=2)) for i in range(2)]
    joined = np.concatenate([np.concatenate(pair) for pair in zip(*halves)])
    assert [tuple(r) for r in joined] == _windows(stream)


