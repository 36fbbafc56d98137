"""Log-likelihoods of token sequences under the trained model, batched and packed (lm-eval's semantics).

    from stages.train import scoring, trained
    net, _, _ = trained.restore(train, summary)
    scorer = scoring.Scorer(net, prefix_id=eos_id)        # rows=8, length=net.config.max_seq_len
    scorer = scoring.Scorer(net, prefix_id=eos_id, length=256, max_length=2048)   # lm-eval's max_length
    scorer.loglikelihood([(context_ids, continuation_ids), ...])   # -> [(sum_logprob, is_greedy), ...]
    scorer.loglikelihood_rolling(document_ids)                     # -> sum_logprob of every token
    scorer.loglikelihood_rolling_many([ids, ids, ...])             # the same, all windows packed together

    # Sharded over a training mesh (in-loop evaluation, many devices or hosts): the same calls and numbers.
    mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=4))
    scorer = scoring.Scorer(net, prefix_id=eos_id, rows=16, length=1024, mesh=mesh)

Truncation (`truncate`), lm-eval's HF backend's rule (`HFLM._loglikelihood_tokens`) with its `max_length`
(`max_length=`, default `length`): a request is scored on the last max_length + 1 tokens of context +
continuation, the context cut from the left; a continuation longer than max_length is refused (lm-eval
asserts). The evaluate stage scores tasks with `evaluate.Config.max_length`, and `lm_eval --model hf
--model_args pretrained=<export>,max_length=<the same>` gives its numbers (README "Use the model elsewhere").

Packing: every request becomes one sequence of inputs (context + continuation minus its last token).
Sequences are placed first-fit, longest first, into rows of one fixed (rows, length) shape, so the whole
evaluation is one compiled program. Each sequence in a row gets its own segment id and positions from 0
(the layout training's packed documents use), so requests in a row never attend to each other; padding is
segment 0 and is never read. The rare sequence longer than `length` (max_length above it: a task answer
longer than training's sequences) goes into rows of its own, `length` x a power of two wide: one more
program per width, compiled only when such a request comes.

Sharded (`mesh=`): each (rows, length) batch is one global array split over the mesh's batch axes ("data",
"fsdp", as training splits its batches) and the params are placed as training places them (by their logical
names, `sharding.param_shardings`; params already placed so, e.g. training's own, stay where they are and
are never gathered to one device). The program is traced under the mesh, so the model's activation constraints
(heads over "tensor", ...) apply as in training. Across processes every process must call with the same
requests: the packing is deterministic, so every process builds the same batch, each feeds the rows its own
devices hold, and the outputs are replicated, so every process gets every answer.

Log-probabilities are computed in float32 from the model's float32 logits (log_softmax, then a gather of
each target), and only the (rows, length) per-token log-prob and argmax-match arrays leave the device.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stages.train import sharding
from stages.train.mesh import Mesh

PAD_SEGMENT = 0          # the segment id of padding; requests in a row are 1, 2, ...
DEFAULT_ROWS = 8         # rows per batch when none are given (rounded up to the mesh's batch split)
IN_FLIGHT = 2            # batches dispatched before the oldest one's results are read


class Scorer:
    """Scores (context, continuation) requests and rolling documents with one model.

    net: the restored `model.Transformer` (`trained.restore`), or training's own (`nnx.merge(graphdef,
    params)`, its params sharded on `mesh`). prefix_id: the token a rolling document's first window is
    conditioned on (lm-eval's prefix token; use the shard manifest's eos_id, which is what precedes a
    document in training). rows, length: the one (rows, length) shape every batch has; rows defaults to 8
    (with a mesh, rounded up to a multiple of data x fsdp), length to the model's max_seq_len; rolling
    windows are `length` long. max_length: lm-eval's `max_length` for `loglikelihood` requests (see the
    module docstring); None = length. A request longer than `length` is scored in rows of its own, at
    positions past max_seq_len where it reaches them (as transformers runs the export). mesh: None scores on
    the default device; a `sharding.make_mesh` mesh shards each batch over ("data", "fsdp") and places the
    params as training does (rows given explicitly must then be a multiple of data x fsdp; max_length no
    more than length, so training compiles one program). `scorer.state` may be replaced by params of the
    same structure and shardings (the training loop's after a step) to score them with the same compiled
    program.
    """

    def __init__(self, net, *, prefix_id: int, rows: int | None = None, length: int | None = None,
                 max_length: int | None = None, mesh: jax.sharding.Mesh | None = None):
        length = length or net.config.max_seq_len
        max_length = length if max_length is None else max_length
        split = 1 if mesh is None else Mesh.of(mesh).batch_shards       # batch rows' split
        if rows is None:
            rows = -(-DEFAULT_ROWS // split) * split
        if rows < 1 or not 1 <= length <= net.config.max_seq_len or max_length < 1:
            raise ValueError(f"Scorer rows={rows} and max_length={max_length} must be >= 1 and "
                             f"length={length} in [1, max_seq_len={net.config.max_seq_len}]")
        if rows % split:
            raise ValueError(f"Scorer rows={rows} does not divide over the mesh's batch axes data x fsdp = "
                             f"{split} (mesh {dict(mesh.shape)}); give rows={-(-rows // split) * split} (or "
                             f"any multiple of {split}), or leave rows unset")
        if mesh is not None and max_length > length:
            raise ValueError(f"Scorer max_length={max_length} > length={length} with a mesh: a longer "
                             f"request would compile a program of another shape (on every process); leave "
                             f"max_length unset or at most {length}")
        self.graphdef, self.state = nnx.split(net)
        self.prefix_id, self.rows, self.length, self.mesh = int(prefix_id), rows, length, mesh
        self.max_length = max_length
        if mesh is not None:           # a no-op for params already placed so (training's): never gathered
            self.state = jax.device_put(self.state, sharding.param_shardings(self.state, mesh))
            self._batch_sh = sharding.batch_sharding(mesh)
        self._step = compiled_step(self.graphdef, mesh)

    def loglikelihood(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]
                      ) -> list[tuple[float, bool]]:
        """[(context_ids, continuation_ids)] -> [(sum of the continuation's log-probs (nats), whether
        every continuation token is the model's argmax)], in the requests' order. With a mesh across
        processes, every process passes the same requests and gets every answer."""
        seqs = [truncate(ctx, cont, self.max_length, i) for i, (ctx, cont) in enumerate(requests)]
        out: list[tuple[float, bool]] = [(0.0, True)] * len(seqs)
        by_width: dict[int, list[int]] = {}         # row width -> the requests packed into rows that wide
        for i, (inputs, _, _) in enumerate(seqs):
            by_width.setdefault(self.width(len(inputs)), []).append(i)
        under_mesh = jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()
        with under_mesh:
            for width, members in sorted(by_width.items()):
                self._score_packed([seqs[i] for i in members], width, members, out)
        return out

    def width(self, n: int) -> int:
        """The row width a sequence of n inputs is packed into: `length`, or for a longer one (max_length
        above length) length x the smallest power of two that holds it."""
        return self.length * 2 ** max(0, math.ceil(math.log2(n / self.length)))

    def _score_packed(self, seqs, width: int, index: list[int], out: list) -> None:
        """Packs `seqs` (each (inputs, targets, continuation length), inputs <= width) into (rows, width)
        batches and writes sequence j's (sum of log-probs, greedy) to out[index[j]]."""
        places = pack([len(inputs) for inputs, _, _ in seqs], width)               # [(row, offset)]
        n_rows = max((row for row, _ in places), default=-1) + 1
        by_row: dict[int, list[int]] = {}
        for j, (row, _) in enumerate(places):
            by_row.setdefault(row, []).append(j)

        def read(first, members, result):
            logprob, greedy = (np.asarray(a) for a in result)                      # (rows, width) each
            for j in members:
                row, offset = places[j][0] - first, places[j][1]
                inputs, _, n_cont = seqs[j]
                end = offset + len(inputs)
                span = slice(end - n_cont, end)                   # the continuation's targets
                out[index[j]] = (float(logprob[row, span].astype(np.float64).sum()),
                                 bool(greedy[row, span].all()))

        pending: collections.deque = collections.deque()   # dispatched, not yet read: the device computes
        for first in range(0, n_rows, self.rows):           # the next batch while the host reads this one
            batch_rows = range(first, min(first + self.rows, n_rows))
            members = [j for r in batch_rows for j in by_row.get(r, ())]
            placed = [(places[j][0] - first, places[j][1], seqs[j][0], seqs[j][1]) for j in members]
            arrays = layout(placed, self.rows, width)
            pending.append((first, members, self._step(self.state, *map(self._device_batch, arrays))))
            if len(pending) > IN_FLIGHT:
                read(*pending.popleft())
        while pending:
            read(*pending.popleft())

    def _device_batch(self, array: np.ndarray):
        """One (rows, length) host array -> the step's input: on the default device, or with a mesh a global
        array split over ("data", "fsdp") whose every process supplies its own devices' rows (each process
        holds the same whole batch, so each slices it by the index its devices ask for)."""
        if self.mesh is None:
            return jnp.asarray(array)
        return jax.make_array_from_callback(array.shape, self._batch_sh, lambda index: array[index])

    def loglikelihood_rolling(self, ids: Sequence[int]) -> float:
        """Sum of log-probs (nats) of every token of one document, each predicted once (rolling windows)."""
        return self.loglikelihood_rolling_many([ids])[0]

    def loglikelihood_rolling_many(self, documents: Sequence[Sequence[int]]) -> list[float]:
        """`loglikelihood_rolling` of each document, every document's windows packed together."""
        requests, owner = [], []
        for d, ids in enumerate(documents):
            for window in rolling_windows(list(ids), self.prefix_id, self.length):
                requests.append(window)
                owner.append(d)
        totals = [0.0] * len(documents)
        for d, (logprob, _) in zip(owner, self.loglikelihood(requests)):
            totals[d] += logprob
        return totals


@functools.lru_cache(maxsize=8)
def compiled_step(graphdef, mesh):
    """The jitted `token_logprobs` of one model structure (a hashable `nnx.GraphDef`) on one mesh (or None),
    shared by every Scorer of that pair: in-loop evaluation builds a Scorer per evaluation (the training step
    donates the params a kept Scorer would hold) and compiles once. With a mesh the inputs keep the shardings
    they come with (params as placed, batch over ("data", "fsdp")) and the outputs are replicated, so every
    process can read them whole."""
    step = functools.partial(token_logprobs, graphdef)
    if mesh is None:
        return jax.jit(step)
    return jax.jit(step, out_shardings=sharding.replicated(mesh))


def token_logprobs(graphdef, state, tokens, targets, segment_ids, positions):
    """All (B, T) int32 -> (log p(target | prefix) (B, T) float32, target == argmax (B, T) bool)."""
    net = nnx.merge(graphdef, state)
    hidden, _ = net(tokens, segment_ids=segment_ids, positions=positions)          # (B, T, D)
    logits = net.logits(hidden)                                                     # (B, T, V) float32
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]       # (B, T)
    return picked - jax.nn.logsumexp(logits, axis=-1), jnp.argmax(logits, axis=-1) == targets


def truncate(context: Sequence[int], continuation: Sequence[int], max_length: int, index: int = 0
             ) -> tuple[list[int], list[int], int]:
    """(inputs, targets, continuation length) of one request by lm-eval's HF rule: context + continuation,
    its last `max_length` + 1 tokens (the context cut from the left), shifted by one; a continuation longer
    than max_length is refused, as lm-eval's `assert len(continuation_enc) <= self.max_length` refuses it."""
    context, continuation = list(context), list(continuation)
    if not context or not continuation:
        raise ValueError(f"request {index}: context has {len(context)} tokens and continuation "
                         f"{len(continuation)}; both need >= 1 (give an empty context the prefix token, "
                         f"e.g. the EOS id, as lm-eval does)")
    if len(continuation) > max_length:
        raise ValueError(f"request {index}: continuation of {len(continuation)} tokens is longer than the "
                         f"scorer's max_length {max_length} (lm-eval's HF backend refuses it too): raise "
                         f"max_length (evaluate.Config.max_length, lm-eval's max_length= model arg) to at "
                         f"least {len(continuation)}, or score it with loglikelihood_rolling")
    whole = (context + continuation)[-(max_length + 1):]
    return whole[:-1], whole[1:], len(continuation)


def pack(lengths: Sequence[int], length: int) -> list[tuple[int, int]]:
    """First-fit decreasing: lengths (each <= length) -> each one's (row, offset) in rows of `length`."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    free: list[int] = []                              # free[r]: tokens left in row r
    places = [(0, 0)] * len(lengths)
    for i in order:
        n = lengths[i]
        row = next((r for r, left in enumerate(free) if left >= n), None)
        if row is None:
            row = len(free)
            free.append(length)
        places[i] = (row, length - free[row])
        free[row] -= n
    return places


def layout(placed, rows: int, length: int) -> tuple[np.ndarray, ...]:
    """[(row, offset, inputs, targets)] -> tokens, targets, segment_ids, positions, each (rows, length)
    int32. Each sequence gets a segment id of its own (1, 2, ... within its row) and positions from 0."""
    tokens = np.zeros((rows, length), np.int32)
    targets = np.zeros((rows, length), np.int32)
    segments = np.full((rows, length), PAD_SEGMENT, np.int32)
    positions = np.zeros((rows, length), np.int32)
    next_id = np.ones(rows, np.int32)
    for row, offset, inputs, target in placed:
        span = slice(offset, offset + len(inputs))
        tokens[row, span], targets[row, span] = inputs, target
        segments[row, span] = next_id[row]
        positions[row, span] = np.arange(len(inputs))
        next_id[row] += 1
    return tokens, targets, segments, positions


def rolling_windows(ids: list[int], prefix_id: int, length: int) -> list[tuple[list[int], list[int]]]:
    """lm-eval's rolling windows (`get_rolling_token_windows` with context_len=1, made disjoint) as
    (context, continuation) requests: every token is a continuation token exactly once; the first window
    is conditioned on `prefix_id`, each later one on the `length` tokens before its end."""
    if not ids:
        return []
    first = min(length, len(ids))
    out = [([prefix_id], ids[:first])]
    done = first
    while done < len(ids):
        n = min(len(ids) - done, length)
        end = done + n
        out.append((ids[end - length - 1:end - n], ids[end - n:end]))
        done = end
    return out
