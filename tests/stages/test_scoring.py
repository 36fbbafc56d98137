"""The packed scorer against an independent unpacked computation (one request per forward, log_softmax,
gather), on a tiny random float32 model.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q -p no:cacheprovider tests/stages/test_scoring.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stages.evaluate import scoring
from stages.train.configs import ModelConfig
from stages.train.model import Transformer

VOCAB, MAX_LEN = 61, 32


@pytest.fixture(scope="module")
def net():
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64,
                      max_seq_len=MAX_LEN, dtype="float32", init_std=0.3)
    return Transformer(cfg, rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def forward(net):
    """inputs (n <= MAX_LEN ids) -> (n, V) log_softmax of ONE sequence's forward: no segments, default
    positions. Right-padded to MAX_LEN (causal: padding after a token cannot change it), so one compile
    serves every request."""
    graphdef, state = nnx.split(net)

    @jax.jit
    def logsoftmax(tokens):                                                   # (1, MAX_LEN)
        m = nnx.merge(graphdef, state)
        hidden, _ = m(tokens)
        return jax.nn.log_softmax(m.logits(hidden)[0], axis=-1)               # (MAX_LEN, V)

    def run(inputs):
        padded = list(inputs) + [0] * (MAX_LEN - len(inputs))
        return np.asarray(logsoftmax(jnp.asarray([padded], jnp.int32)))[:len(inputs)]

    return run


@pytest.fixture(scope="module")
def reference(forward):
    """ids -> (log-prob of each next token (len - 1,), whether each is the argmax)."""
    def score(ids):
        ids = list(ids)
        assert len(ids) <= MAX_LEN + 1
        logp = forward(ids[:-1])
        targets = np.asarray(ids[1:])
        return logp[np.arange(len(targets)), targets], logp.argmax(-1) == targets

    return score


def _requests(rng, n):
    out = []
    for _ in range(n):
        ctx_len = int(rng.choice([1, 2, 5, 12, 20, 31, 45]))         # 45 + continuation > MAX_LEN: truncated
        cont_len = int(rng.integers(1, 9))
        out.append((rng.integers(0, VOCAB, ctx_len).tolist(), rng.integers(0, VOCAB, cont_len).tolist()))
    return out


def test_packed_loglikelihood_matches_one_request_per_forward(net, forward, reference):
    rng = np.random.default_rng(0)
    requests = _requests(rng, 150)
    # Greedy continuations for some requests, so is_greedy is tested both ways.
    for k in range(0, 150, 10):
        ctx, cont = requests[k][0], []
        for _ in range(3):
            cont.append(int(forward((ctx + cont)[-MAX_LEN:])[-1].argmax()))
        requests[k] = (ctx, cont)

    scorer = scoring.Scorer(net, prefix_id=0, rows=4)
    got = scorer.loglikelihood(requests)
    deltas, greedy_seen = [], 0
    for (ctx, cont), (logprob, greedy) in zip(requests, got):
        whole = (ctx + cont)[-(MAX_LEN + 1):]
        lp, match = reference(whole)
        want = float(lp[-len(cont):].astype(np.float64).sum())
        deltas.append(abs(logprob - want))
        assert greedy == bool(match[-len(cont):].all())
        greedy_seen += greedy
    print(f"150 requests: max |delta| {max(deltas):.2e} nats; {greedy_seen} greedy")
    assert max(deltas) <= 1e-4
    assert greedy_seen >= 10
    # Packed: several requests per row, the rows nearly full.
    lengths = [len(scoring.truncate(c, x, MAX_LEN)[0]) for c, x in requests]
    rows = max(r for r, _ in scoring.pack(lengths, MAX_LEN)) + 1
    print(f"packed into {rows} rows of {MAX_LEN}: {sum(lengths) / (rows * MAX_LEN):.0%} full")
    assert rows < 0.7 * len(requests) and sum(lengths) > 0.85 * rows * MAX_LEN


def test_rolling_predicts_every_token_once_with_lm_eval_windows(net, reference):
    rng = np.random.default_rng(1)
    scorer = scoring.Scorer(net, prefix_id=7, rows=2)
    for n in (1, 5, MAX_LEN, MAX_LEN + 1, 3 * MAX_LEN + 7):
        ids = rng.integers(0, VOCAB, n).tolist()
        windows = scoring.rolling_windows(ids, 7, MAX_LEN)
        assert [t for _, cont in windows for t in cont] == ids              # every token once, in order
        want = 0.0
        for k, (ctx, cont) in enumerate(windows):
            assert len(ctx) + len(cont) <= MAX_LEN + 1
            if k:                                                           # later windows: full context
                assert len(ctx) + len(cont) == MAX_LEN + 1
            lp, _ = reference(ctx + cont)
            want += float(lp[-len(cont):].astype(np.float64).sum())
        if n <= MAX_LEN:                            # one window: the whole document after the prefix
            lp, _ = reference([7] + ids)
            assert abs(want - float(lp.astype(np.float64).sum())) <= 1e-4
        assert abs(scorer.loglikelihood_rolling(ids) - want) <= 1e-4
    docs = [rng.integers(0, VOCAB, n).tolist() for n in (3, 40, 70)]
    many = scorer.loglikelihood_rolling_many(docs)
    assert many == pytest.approx([scorer.loglikelihood_rolling(d) for d in docs], abs=1e-4)


def test_bad_requests_name_the_request():
    with pytest.raises(ValueError, match="request 3: context has 0 tokens"):
        scoring.truncate([], [1], 8, 3)
    with pytest.raises(ValueError, match="longer than the scoring length 8"):
        scoring.truncate([1], list(range(9)), 8)
