"""The packed scorer against an independent unpacked computation (one request per forward, log_softmax,
gather), on a tiny random float32 model: random ids, real HellaSwag / ARC-Easy / PIQA items, and sharded over
two processes of 4 simulated CPU devices against one device.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q -p no:cacheprovider tests/stages/test_scoring.py
"""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from stages.train import scoring, sharding
from stages.train.mesh import MeshConfig
from stages.train.model import Transformer
from stages.train.model_config import ModelConfig
from tests import jax_env

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
    with pytest.raises(ValueError, match="continuation of 9 tokens is longer than the scorer's max_length 8 "
                                         r"\(lm-eval's HF backend refuses it too\): raise max_length"):
        scoring.truncate([1], list(range(9)), 8)


def test_requests_longer_than_the_rows_are_cut_by_lm_evals_rule_at_max_length(net):
    """max_length above the row length (a task answer longer than training's sequences): each request is its
    last max_length + 1 tokens, scored whole in rows of its own width (positions past max_seq_len, as
    transformers runs the export), equal to one unpacked forward of those tokens; short requests in the
    same call keep their own rows and the answers keep the requests' order."""
    max_length = 3 * MAX_LEN
    graphdef, state = nnx.split(net)

    @jax.jit
    def logsoftmax(tokens):                                                   # (1, 4 * MAX_LEN)
        m = nnx.merge(graphdef, state)
        hidden, _ = m(tokens)
        return jax.nn.log_softmax(m.logits(hidden)[0], axis=-1)

    def want(ctx, cont):
        whole = (ctx + cont)[-(max_length + 1):]
        inputs = whole[:-1] + [0] * (4 * MAX_LEN - len(whole) + 1)
        logp = np.asarray(logsoftmax(jnp.asarray([inputs], jnp.int32)))[:len(whole) - 1]
        return float(logp[np.arange(len(whole) - 1), whole[1:]][-len(cont):].astype(np.float64).sum())

    rng = np.random.default_rng(4)
    shapes = [(5, 3), (20, 70), (40, 90), (3, 96), (50, 40), (2, 6), (10, 33), (60, 8)]   # (context, answer)
    requests = [(rng.integers(0, VOCAB, c).tolist(), rng.integers(0, VOCAB, n).tolist()) for c, n in shapes]
    scorer = scoring.Scorer(net, prefix_id=0, rows=2, max_length=max_length)
    assert (scorer.length, scorer.max_length) == (MAX_LEN, max_length)
    assert [scorer.width(n) for n in (1, MAX_LEN, MAX_LEN + 1, 2 * MAX_LEN + 1)] == [MAX_LEN, MAX_LEN,
                                                                                    2 * MAX_LEN, 4 * MAX_LEN]
    got = [logprob for logprob, _ in scorer.loglikelihood(requests)]
    deltas = [abs(g - want(ctx, cont)) for g, (ctx, cont) in zip(got, requests)]
    print(f"{len(requests)} requests, answers up to {max(n for _, n in shapes)} tokens: max |delta| "
          f"{max(deltas):.2e}")
    assert max(deltas) <= 1e-4
    # the rows' length is not the rule: the same requests at max_length = MAX_LEN refuse the long answers
    with pytest.raises(ValueError, match="request 1: continuation of 70 tokens"):
        scoring.Scorer(net, prefix_id=0, rows=2).loglikelihood(requests)
    with pytest.raises(ValueError, match="max_length=64 > length=32 with a mesh"):
        scoring.Scorer(net, prefix_id=0, rows=2, max_length=64, mesh=sharding.make_mesh(MeshConfig()))


# -- real task items: the packed scorer against a full forward of each request alone --------------------

TASK_VOCAB, TASK_LEN = 1000, 256


@pytest.fixture(scope="module")
def task_requests():
    """(context ids, continuation ids) of every choice of 40 HellaSwag, 40 ARC-Easy and 40 PIQA items,
    tokenized as evaluation tokenizes them (`tokenized.request_ids`) by a small BPE trained on those items'
    own text; a continuation longer than TASK_LEN keeps its head, as `score.tasks` does."""
    import sentencepiece as spm

    from stages.yardstick_data import tasks
    from stages.yardsticks import tokenized

    items = [item for group in tasks.load(["hellaswag", "arc_easy", "piqa"], max_items=40).values()
             for item in group]
    texts = [text for item in items for pair in item.requests() for text in pair]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=proto, vocab_size=TASK_VOCAB,
                                   model_type="bpe", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    requests = [tokenized.request_ids(sp, ctx, cont, eos_id=0)
                for item in items for ctx, cont in item.requests()]
    return len(items), [(ctx, cont[:TASK_LEN]) for ctx, cont in requests]


@pytest.fixture(scope="module")
def task_net():
    cfg = ModelConfig(vocab_size=TASK_VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64,
                      max_seq_len=TASK_LEN, dtype="float32", init_std=0.3)
    return Transformer(cfg, rngs=nnx.Rngs(5))


def test_packed_scores_of_real_task_items_equal_a_full_forward_of_each_request_alone(task_net, task_requests):
    n_items, requests = task_requests
    n_choices = len(requests)
    graphdef, state = nnx.split(task_net)

    @jax.jit
    def alone(tokens):          # (32, TASK_LEN), a request alone in each row: no segments, default positions
        m = nnx.merge(graphdef, state)
        hidden, _ = m(tokens)
        return jax.nn.log_softmax(m.logits(hidden).astype(jnp.float32), axis=-1)        # (32, TASK_LEN, V)

    def forward(many):              # [<= TASK_LEN ids] -> [(len, V)]; right padding changes nothing (causal)
        out = []
        for k in range(0, len(many), 32):
            chunk = many[k:k + 32]
            padded = np.zeros((32, TASK_LEN), np.int32)
            for row, inputs in enumerate(chunk):
                padded[row, :len(inputs)] = inputs
            logp = np.asarray(alone(jnp.asarray(padded)))
            out += [logp[row, :len(inputs)] for row, inputs in enumerate(chunk)]
        return out

    # A random model's argmax is rarely a real choice: every 20th context also gets its greedy 2-token
    # continuation, so is_greedy is tested both ways.
    greedy = [(ctx, []) for ctx, _ in requests[::20]]
    for _ in range(2):
        for (_, cont), logp in zip(greedy, forward([(ctx + cont)[-TASK_LEN:] for ctx, cont in greedy])):
            cont.append(int(logp[-1].argmax()))
    requests = requests + greedy

    got = scoring.Scorer(task_net, prefix_id=0, rows=4).loglikelihood(requests)
    wholes = [(ctx + cont)[-(TASK_LEN + 1):] for ctx, cont in requests]  # lm-eval: the context loses its head
    alone_logps = forward([whole[:-1] for whole in wholes])
    deltas, greedy_seen = [], 0
    for (_, cont), whole, logp, (logprob, is_greedy) in zip(requests, wholes, alone_logps, got):
        targets = np.asarray(whole[1:])
        picked = logp[np.arange(len(targets)), targets][-len(cont):]          # the continuation's targets
        deltas.append(abs(logprob - float(picked.astype(np.float64).sum())))
        assert is_greedy == bool((logp.argmax(-1) == targets)[-len(cont):].all())
        greedy_seen += is_greedy
    cut = sum(len(ctx) + len(cont) > TASK_LEN + 1 for ctx, cont in requests)
    print(f"{n_items} items, {n_choices} choices + {len(greedy)} greedy requests ({cut} cut "
          f"from the left): max |delta| {max(deltas):.2e} nats; {greedy_seen} greedy")
    assert n_items >= 100 and n_choices >= 300
    assert max(deltas) <= 1e-4
    assert len(greedy) <= greedy_seen < len(requests) / 2
    lengths = [len(scoring.truncate(c, x, TASK_LEN)[0]) for c, x in requests]
    rows = max(r for r, _ in scoring.pack(lengths, TASK_LEN)) + 1
    print(f"packed into {rows} rows of {TASK_LEN}: {sum(lengths) / (rows * TASK_LEN):.0%} full")
    assert rows < len(requests) / 2                                   # several requests a row


# -- sharded: two processes of 4 simulated CPU devices each, one (data 2, fsdp 2, tensor 2) mesh ---------

SHARDED_SCRIPT = r"""
import json

import jax
import numpy as np
from flax import nnx

from stages.train import scoring
from stages.train import sharding, worker
from stages.train.mesh import MeshConfig
from stages.train.model_config import ModelConfig
from stages.train.model import Transformer

process, processes = worker.init_distributed()               # gloo, from the REFINERY_* variables
assert (processes, jax.device_count(), jax.local_device_count()) == (2, 8, 4), jax.devices()
cfg = ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64, max_seq_len=32,
                  dtype="float32", init_std=0.3)
mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
graphdef, whole = nnx.split(Transformer(cfg, rngs=nnx.Rngs(3)))     # the same seed: the same model in both
params = jax.device_put(whole, sharding.param_shardings(whole, mesh))   # split over the mesh as training's
rng = np.random.default_rng(0)                               # the same requests in both processes
requests = [(rng.integers(0, 61, int(rng.integers(1, 45))).tolist(),
             rng.integers(0, 61, int(rng.integers(1, 9))).tolist()) for _ in range(120)]
documents = [rng.integers(0, 61, n).tolist() for n in (3, 40, 70)]

scorer = scoring.Scorer(nnx.merge(graphdef, params), prefix_id=7, mesh=mesh)
kept = all(a.sharding == b.sharding for a, b in zip(jax.tree.leaves(scorer.state), jax.tree.leaves(params)))
split = sum(not a.sharding.is_fully_replicated for a in jax.tree.leaves(scorer.state))
sharded = scorer.loglikelihood(requests), scorer.loglikelihood_rolling_many(documents)

alone = None
if process == 0:                                             # the reference, on one device of process 0
    single = scoring.Scorer(nnx.merge(graphdef, whole), prefix_id=7, rows=4)
    alone = single.loglikelihood(requests), single.loglikelihood_rolling_many(documents)
try:
    scoring.Scorer(nnx.merge(graphdef, params), prefix_id=7, rows=6, mesh=mesh)
    rows_error = None
except ValueError as e:
    rows_error = str(e)
print("RESULT " + json.dumps({"process": process, "rows": scorer.rows, "kept": kept, "split": split,
                              "sharded": sharded, "single": alone, "rows_error": rows_error}))
"""


def test_sharded_scorer_across_two_processes_gives_the_single_device_numbers(tmp_path):
    import json
    import os
    import socket
    import subprocess
    import sys

    from tests.conftest import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=jax_env.xla_flags("--xla_force_host_platform_device_count=4"),
               REFINERY_COORDINATOR=f"127.0.0.1:{port}", REFINERY_NUM_PROCESSES="2",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    procs = [subprocess.Popen([sys.executable, "-c", SHARDED_SCRIPT], cwd=REPO, text=True,
                              env=dict(env, REFINERY_PROCESS_ID=str(i)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for i in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, out[-3000:] + err[-5000:]
        results.append(json.loads(lines[-1][len("RESULT "):]))

    first, second = results
    assert second["sharded"] == first["sharded"]                 # every process gets every answer
    for r in results:
        assert r["kept"] and r["split"] >= 6                     # params stayed split as training placed them
        assert r["rows"] == 8                                    # the default 8 rows: a multiple of 2 x 2
        assert "rows=6" in r["rows_error"] and "data x fsdp = 4" in r["rows_error"]
    (pairs, rolling), (want_pairs, want_rolling) = first["sharded"], first["single"]
    assert [g for _, g in pairs] == [g for _, g in want_pairs]
    # Float32 sums of up to 70 tokens' log-probs (tens to hundreds of nats), reduced in another order where
    # the weights are split: equal to 1e-5 relative (~100 float32 ulps).
    got, want = [lp for lp, _ in pairs] + rolling, [lp for lp, _ in want_pairs] + want_rolling
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    print(f"{len(pairs)} requests + {len(rolling)} documents: max |sharded - single| "
          f"{max(abs(a - b) for a, b in zip(got, want)):.2e} nats, relative {worst:.1e}")
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
