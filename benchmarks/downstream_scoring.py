"""Downstream scoring throughput: the packed Scorer vs one request per forward pass, on the same real items.

    .venv/bin/python -m benchmarks downstream_scoring    # writes benchmarks/out/downstream_scoring.json

The items are the first `per_task` of HellaSwag, ARC-Easy and PIQA (`tasks.load`, seeded), every choice a
(context, continuation) request, tokenized as evaluation tokenizes them (`tokenized.request_ids`) by a BPE
trained on those items' text; the model is a small random float32 Transformer (`MODEL`) on the default
backend. Three ways of scoring the same requests, each after its compiles (timed apart, `*_compile_s`):

- packed: `scoring.Scorer`, requests packed first-fit into (rows, length) rows, one compiled shape;
- own_length (the baseline): a batch of one request per forward at its own length, as lm-eval's default
  Hugging Face path runs (batch_size=1: nothing to pad to but the request itself). In JAX a shape is a
  compile, so each request is right-padded to the next multiple of `bucket` tokens (bucket=1: exactly its
  own length, ~165 compiles, minutes on a 2-core CPU; the default 16 adds < 16 tokens to a mean of ~80 and
  makes 16 compiles), and every shape is compiled before timing, as PyTorch eager never compiles;
- padded: a batch of one request per forward, right-padded to the scorer's length (one compiled shape),
  the cheap way to get one compile per request in JAX, slower than own_length by the padding.

Every way returns the same (log-likelihood, is_greedy) per request (`max_abs_diff_*` checks it). Ratios are
packed requests/s over each baseline's; the goal is >= 5 against own_length.
"""

from __future__ import annotations

import io
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stages.train import scoring
from stages.train.model import Transformer
from stages.train.model_config import ModelConfig
from stages.yardstick_data import tasks
from stages.yardsticks import tokenized

TASKS = ("hellaswag", "arc_easy", "piqa")
VOCAB = 1024
MODEL = {"d_model": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "mlp_dim": 512, "dtype": "float32"}


def measure(work_dir: str, per_task: int = 67, rows: int = 8, length: int = 256, bucket: int = 16) -> dict:
    del work_dir                                              # nothing is written to disk
    n_items, requests = task_requests(per_task, length)
    net = Transformer(ModelConfig(vocab_size=VOCAB, max_seq_len=length, **MODEL), rngs=nnx.Rngs(0))
    seqs = [scoring.truncate(ctx, cont, length) for ctx, cont in requests]
    lengths = [len(inputs) for inputs, _, _ in seqs]
    n_rows = max(r for r, _ in scoring.pack(lengths, length)) + 1

    scorer = scoring.Scorer(net, prefix_id=0, rows=rows, length=length)
    start = time.perf_counter()
    scorer.loglikelihood(requests[:1])                        # the one compile
    packed_compile = time.perf_counter() - start
    packed, packed_s = _timed(lambda: scorer.loglikelihood(requests))

    one = OneRequest(net)
    start = time.perf_counter()
    one.step(one.state, *one.arrays([0] * length, [0] * length))
    padded_compile = time.perf_counter() - start
    padded, padded_s = _timed(lambda: [one.score(inputs, targets, n_cont, pad_to=length)
                                       for inputs, targets, n_cont in seqs])

    shapes = sorted({_bucketed(n, bucket, length) for n in lengths})
    start = time.perf_counter()
    for n in shapes:                                          # every shape's compile, before timing
        one.step(one.state, *one.arrays([0] * n, [0] * n))
    own_compile = time.perf_counter() - start
    own, own_s = _timed(lambda: [one.score(inputs, targets, n_cont, _bucketed(len(inputs), bucket, length))
                                 for inputs, targets, n_cont in seqs])

    n = len(requests)
    return {
        "benchmark": "downstream_scoring",
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "tasks": list(TASKS),
        "items": n_items,
        "requests": n,
        "model": dict(MODEL, vocab_size=VOCAB, max_seq_len=length),
        "rows_x_length": f"{rows}x{length}",
        "mean_request_tokens": round(sum(lengths) / n, 1),
        "distinct_lengths": len(set(lengths)),
        "own_length_bucket": bucket,
        "own_length_shapes": len(shapes),
        "packed_rows": n_rows,
        "packed_fill": round(sum(lengths) / (n_rows * length), 3),
        "packed_s": round(packed_s, 3),
        "own_length_s": round(own_s, 3),
        "padded_s": round(padded_s, 3),
        "packed_requests_per_s": round(n / packed_s, 1),
        "own_length_requests_per_s": round(n / own_s, 1),
        "padded_requests_per_s": round(n / padded_s, 1),
        "ratio_packed_vs_own_length": round(own_s / packed_s, 2),
        "ratio_packed_vs_padded": round(padded_s / packed_s, 2),
        "packed_compile_s": round(packed_compile, 2),
        "own_length_compile_s": round(own_compile, 2),
        "padded_compile_s": round(padded_compile, 2),
        "max_abs_diff_own_length": _max_diff(packed, own),
        "max_abs_diff_padded": _max_diff(packed, padded),
        "greedy_equal": [g for _, g in packed] == [g for _, g in own] == [g for _, g in padded],
        "target_ratio": 5.0,
    }


def task_requests(per_task: int, length: int) -> tuple[int, list[tuple[list[int], list[int]]]]:
    """(items, every choice's (context ids, continuation ids)), a continuation longer than `length` cut to
    its head as `score.tasks` does."""
    import sentencepiece as spm

    items = [item for group in tasks.load(list(TASKS), max_items=per_task).values() for item in group]
    texts = sorted({text for item in items for pair in item.requests() for text in pair})
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=proto, vocab_size=VOCAB,
                                   model_type="bpe", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    requests = [tokenized.request_ids(sp, ctx, cont, eos_id=0)
                for item in items for ctx, cont in item.requests()]
    return len(items), [(ctx, cont[:length]) for ctx, cont in requests]


class OneRequest:
    """One request per forward pass: (1, n) tokens, no segment ids, default positions; the same float32
    log_softmax-and-gather outputs as the scorer's step, read back to the host one request at a time."""

    def __init__(self, net):
        graphdef, self.state = nnx.split(net)

        def step(state, tokens, targets):                     # (1, n) int32 each
            m = nnx.merge(graphdef, state)
            hidden, _ = m(tokens)
            logits = m.logits(hidden).astype(jnp.float32)                             # (1, n, V)
            picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # (1, n)
            return picked - jax.nn.logsumexp(logits, axis=-1), jnp.argmax(logits, axis=-1) == targets

        self.step = jax.jit(step)

    @staticmethod
    def arrays(inputs, targets, pad_to: int = 0):
        n = max(pad_to, len(inputs))
        tokens, target = np.zeros((1, n), np.int32), np.zeros((1, n), np.int32)
        tokens[0, :len(inputs)], target[0, :len(targets)] = inputs, targets
        return jnp.asarray(tokens), jnp.asarray(target)

    def score(self, inputs, targets, n_cont: int, pad_to: int = 0) -> tuple[float, bool]:
        out = self.step(self.state, *self.arrays(inputs, targets, pad_to))
        logprob, greedy = (np.asarray(a)[0] for a in out)                                  # (n,) each
        span = slice(len(inputs) - n_cont, len(inputs))
        return float(logprob[span].astype(np.float64).sum()), bool(greedy[span].all())


def _bucketed(n: int, bucket: int, length: int) -> int:
    """n tokens rounded up to a multiple of `bucket`, at most `length`."""
    return min(-(-n // bucket) * bucket, length)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _max_diff(a, b) -> float:
    return float(max(abs(x[0] - y[0]) for x, y in zip(a, b)))
