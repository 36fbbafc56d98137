"""Training data: memory-mapped llm.c shards cut into windows; the batch is a pure function of the step.

    with storage.local_files(shard.paths("train-*.bin")) as files:     # memory mapping needs local files
        batches = data.TokenData(files, manifest, seq_len=256, global_batch=16, seed=0,
                                 process_index=jax.process_index(), process_count=jax.process_count())
        tokens = batches.batch(step)                         # (16 // process_count, 257) int32
        inputs, targets = tokens[:, :-1], tokens[:, 1:]      # (B, T) each
        ids = data.segment_ids(inputs, manifest["eos_id"])   # (B, T): which packed document each token is in
        for val in data.eval_batches(files, manifest, seq_len=256, batch_size=16): ...

The shards are one token stream, cut into M = (total_tokens - 1) // seq_len windows of seq_len + 1
tokens (window w starts at token w * seq_len, so consecutive windows overlap by the one token that is
the last target of one and the first input of the next). Global example g = step * global_batch + i
is window perm_e(g % M) of epoch e = g // M, where perm_e is a keyed Feistel permutation of range(M) with
key (seed, e) (window_order.py), computed for the batch's positions alone: nothing of size M is ever held.
No iterator state exists, so a resumed run needs nothing but the step to replay the same batches.

A mixture of sources (`train.Mixture`, stages/train/mixture.py) reads each source's shards as a stream of
its own: `MixedTokenData(streams, mixture, ...)` takes each step's rows of each source as the mixture
apportions them, each source in its own seeded epochs; `batch(step)` stays a pure function of the step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from stages.io import llmc
from stages.train.window_order import WindowOrder


class TokenData:
    """Shuffled training batches over memory-mapped shards; `batch(step)` depends only on (step, seed).

    Each of `process_count` processes gets rows [process_index * B_local, (process_index + 1) * B_local)
    of the global batch, B_local = global_batch // process_count; together they tile it.
    """

    def __init__(self, shard_paths: Sequence[str], manifest: Mapping, *, seq_len: int, global_batch: int,
                 seed: int, process_index: int = 0, process_count: int = 1):
        if seq_len < 1 or global_batch < 1:
            raise ValueError(f"seq_len={seq_len} and global_batch={global_batch} must both be >= 1")
        _check_processes(global_batch, process_index, process_count, "global_batch")
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed
        self.local_batch = global_batch // process_count
        self.row_start = process_index * self.local_batch
        self.stream = TokenStream(shard_paths, manifest)
        self.num_windows = self.stream.num_windows(seq_len)            # M
        if self.num_windows < 1:
            raise ValueError(f"the {len(shard_paths)} shards hold {self.stream.total_tokens} tokens, "
                             f"fewer than seq_len + 1 = {seq_len + 1}: lower seq_len or shard more text")
        self.order = WindowOrder(self.num_windows, key=(seed,))        # epoch e: Feistel key (seed, e)

    def batch(self, step: int) -> np.ndarray:
        """This process's rows of the global batch at `step`.

        Returns (global_batch // process_count, seq_len + 1) int32.
        """
        return np.stack([self.stream.window(int(w), self.seq_len) for w in self.windows(step)])

    def windows(self, step: int) -> np.ndarray:
        """The windows of this process's rows at `step`: (global_batch // process_count,) int64."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        g = step * self.global_batch + self.row_start + np.arange(self.local_batch, dtype=np.int64)  # (B,)
        return self.order.windows(g)


class MixedTokenData:
    """Training batches over several sources (`mixture.Mixture`); `batch(step)` depends only on (seed, step,
    mixture), so a resumed run, a run on another number of processes and a run with a later phase added see
    the same batches up to where they differ.

    Step b takes `mixture.step_rows(b)` rows of each source, in an order seeded by (seed, b). The k-th row a
    source ever gives (k counted over all steps before, `mixture.rows_before`) is window perm(k % M) of its
    epoch k // M, where M is its window count and perm the Feistel permutation keyed by (seed, the source's
    name seed, epoch) (window_order.py): each source is a stream of its own with its own epochs, and adding
    a source changes no other's.
    Process i takes rows [i * B_local, (i + 1) * B_local) of the global batch, as in TokenData.
    """

    def __init__(self, streams: Mapping[str, TokenStream], mix, *, seq_len: int, global_batch: int,
                 seed: int, process_index: int = 0, process_count: int = 1):
        _check_processes(global_batch, process_index, process_count, "global_batch")
        if missing := [s for s in mix.sources if s not in streams]:
            raise ValueError(f"the mixture names source(s) {missing} that have no shards; sources with "
                             f"shards: {sorted(streams)}")
        self.mix, self.seq_len, self.global_batch, self.seed = mix, seq_len, global_batch, seed
        self.local_batch = global_batch // process_count
        self.row_start = process_index * self.local_batch
        self.sources = mix.sources
        self.streams = {name: streams[name] for name in self.sources}
        self.num_windows = {name: s.num_windows(seq_len) for name, s in self.streams.items()}
        for name, m in self.num_windows.items():
            if m < 1:
                tokens = self.streams[name].total_tokens
                raise ValueError(f"source {name!r} holds {tokens} tokens, fewer than seq_len + 1 = "
                                 f"{seq_len + 1}: lower seq_len or give it more text")
        self.orders = {name: WindowOrder(m, key=(seed, _name_seed(name)))    # epoch e: (seed, name seed, e)
                       for name, m in self.num_windows.items()}

    def rows(self, step: int) -> list[tuple[str, int]]:
        """The global batch of `step` as (source, that source's row number k), in batch order."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        counts = self.mix.step_rows(step, self.global_batch)
        before = self.mix.rows_before(step, self.global_batch)
        slots = np.repeat(np.arange(len(self.sources)), [counts[s] for s in self.sources])      # (G,)
        slots = np.random.default_rng([self.seed, step]).permutation(slots)
        seen = dict.fromkeys(self.sources, 0)
        out = []
        for i in slots:
            name = self.sources[int(i)]
            out.append((name, before[name] + seen[name]))
            seen[name] += 1
        return out

    def batch(self, step: int) -> np.ndarray:
        """This process's rows of the global batch at `step`: (global_batch // process_count, seq_len + 1)
        int32."""
        return np.stack([self.streams[name].window(w, self.seq_len) for name, w in self.windows(step)])

    def windows(self, step: int) -> list[tuple[str, int]]:
        """This process's rows at `step` as (source, window of that source), in batch order."""
        mine = self.rows(step)[self.row_start:self.row_start + self.local_batch]
        names = np.array([name for name, _ in mine])                                   # (B,)
        ks = np.array([k for _, k in mine], dtype=np.int64)                            # (B,)
        windows = np.empty(len(mine), dtype=np.int64)
        for name in self.sources:                  # each source's rows in one vectorised call
            at = names == name
            if at.any():
                windows[at] = self.orders[name].windows(ks[at])
        return [(name, int(w)) for (name, _), w in zip(mine, windows)]

    def window(self, name: str, k: int) -> np.ndarray:
        """The k-th window source `name` gives: (seq_len + 1,) int32."""
        return self.streams[name].window(int(self.orders[name].windows(k)), self.seq_len)


def _name_seed(name: str) -> int:
    """A source's name as a seed word (the first 4 bytes of its sha256): stable across runs and machines."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def eval_batches(shard_paths: Sequence[str], manifest: Mapping, *, seq_len: int, batch_size: int,
                 process_index: int = 0, process_count: int = 1,
                 drop_remainder: bool = False) -> Iterator[np.ndarray]:
    """Every window of the shards once, in order (no shuffling), for evaluation.

    Yields this process's rows of each global batch of `batch_size` windows: arrays of shape
    (batch_size // process_count, seq_len + 1) int32. The last batch is smaller when the windows do
    not fill it; with several processes it is cut to a multiple of process_count so every process
    yields the same shapes (at most process_count - 1 windows are left out). `drop_remainder=True`
    leaves out the partial batch, for callers that need one static shape.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be >= 1")
    _check_processes(batch_size, process_index, process_count, "batch_size")
    stream = TokenStream(shard_paths, manifest)
    num_windows = stream.num_windows(seq_len)
    for start in range(0, num_windows, batch_size):
        rows = min(batch_size, num_windows - start)
        if rows < batch_size and drop_remainder:
            return
        local = rows // process_count
        if local == 0:
            return
        first = start + process_index * local
        yield np.stack([stream.window(w, seq_len) for w in range(first, first + local)])


def segment_ids(tokens, eos_id: int):
    """(B, T) -> (B, T) int32: the packed document each token belongs to, counted from 0 in each row.

    A document ends with its EOS, so the EOS takes its document's id: id = number of EOS strictly before
    the position. Works on numpy arrays and inside jit on jax arrays.
    """
    if isinstance(tokens, np.ndarray):
        xp = np
    else:
        import jax.numpy as xp
    is_eos = (tokens == eos_id).astype(np.int32)                                 # (B, T)
    return (xp.cumsum(is_eos, axis=-1, dtype=np.int32) - is_eos).astype(np.int32)


class TokenStream:
    """Shards memory-mapped and read as one stream of tokens (the manifest gives the dtype)."""

    def __init__(self, shard_paths: Sequence[str], manifest: Mapping):
        if not shard_paths:
            raise ValueError("no shard files given: the shard stage's manifest lists none for this split")
        self.shards = [llmc.read(p, mmap=True, dtype=manifest["dtype"]) for p in shard_paths]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])                 # (num_shards + 1,)
        self.total_tokens = int(self.starts[-1])

    def num_windows(self, seq_len: int) -> int:
        return max(0, (self.total_tokens - 1) // seq_len)

    def window(self, w: int, seq_len: int) -> np.ndarray:
        """Window w: tokens [w * seq_len, w * seq_len + seq_len + 1) as int32, across shard ends."""
        return self.read(w * seq_len, seq_len + 1)

    def read(self, begin: int, count: int) -> np.ndarray:
        if begin < 0 or begin + count > self.total_tokens:
            raise IndexError(f"tokens [{begin}, {begin + count}) are outside the stream of "
                             f"{self.total_tokens}")
        pieces, end = [], begin + count
        i = int(np.searchsorted(self.starts, begin, side="right")) - 1
        while begin < end:
            lo, hi = begin - self.starts[i], min(end, self.starts[i + 1]) - self.starts[i]
            pieces.append(self.shards[i][lo:hi])
            begin = int(self.starts[i + 1])
            i += 1
        return np.concatenate(pieces).astype(np.int32)


def _check_processes(batch: int, process_index: int, process_count: int, name: str) -> None:
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must be in [0, process_count={process_count})")
    if batch % process_count:
        raise ValueError(f"{name}={batch} does not divide by process_count={process_count}: "
                         f"use a multiple of {process_count}")

