"""The lm-evaluation-harness adapter against the native scorer and sampler, on local tasks this test writes
(a multiple-choice, a perplexity and a generation task over jsonl files; no network) and a tiny random model.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q -p no:cacheprovider tests/stages/test_harness.py

lm-eval is the `harness` extra, which `make test` installs.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import subprocess
import sys

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")       # read before `datasets` is first imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import sentencepiece as spm  # noqa: E402
from flax import nnx  # noqa: E402

from stages.evaluate import harness, measure  # noqa: E402
from stages.io import storage  # noqa: E402
from stages.train import checkpoint, model  # noqa: E402
from stages.train.model_config import ModelConfig  # noqa: E402
from stages.yardsticks.tokenized import request_ids  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.stages.test_tokenizer import english_docs  # noqa: E402

MAX_LEN = 32
MC = [  # question, choices, gold
    ("Which word comes after the river", ["music", "stone", "old", "water"], 0),
    ("The small house stood by", ["the road", "a river of light", "music"], 2),
    ("What did the old man carry", ["a stone", "water", "nothing at all"], 1),
    ("Where does the light go at night", ["away", "into the river", "home", "nowhere"], 3),
    ("Pick one", ["yes", "no"], 0),
]
PROMPTS = ["The old river", "Music and light", "Where the stone is"]
MAX_GEN_TOKS = 10
MC_TEXT = "Question: {{question}}\nAnswer:"


@pytest.fixture(scope="module")
def sp():
    proto = io.BytesIO()
    sentences = [d["text"].replace("\n", " ") for d in english_docs(200)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=proto, vocab_size=300,
                                   model_type="bpe", minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=proto.getvalue())


@pytest.fixture(scope="module")
def net():
    cfg = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64,
                      max_seq_len=MAX_LEN, dtype="float32", init_std=0.3)
    return model.Transformer(cfg, rngs=nnx.Rngs(5))


@pytest.fixture(scope="module")
def documents():
    """Perplexity documents: one fits a window, the others span several (windows of MAX_LEN tokens)."""
    return [" ".join(d["text"].split()[:n]) for d, n in zip(english_docs(3, seed=7), (6, 40, 90))]


def _greedy(net, sp, eos_id, prompt):
    """The KV-cache sampler's greedy continuation of `prompt` (after an EOS), cut at its first EOS: text."""
    ids = [eos_id] + sp.encode(prompt)
    out = measure._generate(net, ids, MAX_GEN_TOKS, temperature=0.0, top_k=0, seed=0)
    out = out[:out.index(eos_id)] if eos_id in out else out
    return sp.decode(ids[1:] + out)[len(sp.decode(ids[1:])):]


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory, net, sp, documents):
    """Three task YAMLs and their jsonl data. The generation task stops at two characters from inside the
    model's longest greedy continuation, so the cut is exercised: (root, stop string, [continuation])."""
    root = tmp_path_factory.mktemp("harness_tasks")
    full = [_greedy(net, sp, sp.eos_id(), p) for p in PROMPTS]
    longest = max(full, key=len)
    stop = next(longest[i:i + 2] for i in range(1, len(longest) - 1) if longest.find(longest[i:i + 2]) == i)
    data = {
        "mc": [{"question": q, "choices": c, "gold": g} for q, c, g in MC],
        "ppl": [{"text": t} for t in documents],
        "gen": [{"prompt": p, "answer": f.split(stop)[0]} for p, f in zip(PROMPTS, full)],
    }
    for name, rows in data.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def dataset(name):
        return {"dataset_path": "json", "test_split": "test",
                "dataset_kwargs": {"data_files": {"test": str(root / f"{name}.jsonl")},
                                   "cache_dir": str(root / "hf_cache")}}

    yamls = {
        "refinery_test_mc": {**dataset("mc"), "output_type": "multiple_choice", "doc_to_text": MC_TEXT,
                             "doc_to_choice": "choices", "doc_to_target": "gold",
                             "metric_list": [{"metric": "acc", "aggregation": "mean",
                                              "higher_is_better": True}]},
        "refinery_test_ppl": {**dataset("ppl"), "output_type": "loglikelihood_rolling", "doc_to_text": "",
                              "doc_to_target": "{{text}}",
                              "metric_list": [{"metric": "word_perplexity", "higher_is_better": False,
                                               "aggregation": "weighted_perplexity"}]},
        "refinery_test_gen": {**dataset("gen"), "output_type": "generate_until", "doc_to_text": "{{prompt}}",
                              "doc_to_target": "{{answer}}",
                              "generation_kwargs": {"until": [stop], "max_gen_toks": MAX_GEN_TOKS,
                                                    "do_sample": False},
                              "metric_list": [{"metric": "exact_match", "aggregation": "mean",
                                               "higher_is_better": True}]},
    }
    for name, body in yamls.items():               # JSON is YAML: no YAML writer needed
        (root / f"{name}.yaml").write_text(json.dumps({"task": name, **body}, indent=1))
    return root, stop, full


@pytest.fixture(scope="module")
def lm(net, sp):
    return harness.RefineryLM(net, sp, sp.eos_id(), rows=4)


@pytest.fixture(scope="module")
def results(lm, tasks_dir):
    return harness.run_tasks(lm, ["refinery_test_mc", "refinery_test_ppl", "refinery_test_gen"],
                             include_path=str(tasks_dir[0]), log_samples=True, bootstrap_iters=0)


def _requests(sample):
    """The (args, response) of each request lm-eval logged for one document."""
    args = [tuple(a) for a in sample["arguments"]]
    return list(zip(args, sample["resps"]))


def test_loglikelihoods_equal_the_native_scorers(lm, sp, results):
    samples = sorted(results["samples"]["refinery_test_mc"], key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == list(range(len(MC)))
    eos = sp.eos_id()
    pairs = [(f"Question: {q}\nAnswer:", f" {c}") for q, choices, _ in MC for c in choices]
    # the adapter's own Scorer (one compiled program for both); the packing differs: all requests at once
    native = lm.scorer.loglikelihood([request_ids(sp, ctx, cont, eos) for ctx, cont in pairs])
    got = [(args, resp[0]) for s in samples for args, resp in _requests(s)]
    assert [args for args, _ in got] == pairs                  # the harness asked what the native path scores
    deltas = [abs(float(ll) - want) for (_, (ll, _)), (want, _) in zip(got, native)]
    assert max(deltas) <= 1e-4, deltas
    assert [bool(g) for _, (_, g) in got] == [g for _, g in native]
    # lm-eval's accuracy is the native argmax over each item's choices
    per_item, start = [], 0
    for _, choices, gold in MC:
        scores = [ll for ll, _ in native[start:start + len(choices)]]
        per_item.append(scores.index(max(scores)) == gold)
        start += len(choices)
    assert results["results"]["refinery_test_mc"]["acc,none"] == pytest.approx(sum(per_item) / len(MC))


def test_rolling_loglikelihoods_equal_loglikelihood_rolling_many(lm, sp, results, documents):
    samples = sorted(results["samples"]["refinery_test_ppl"], key=lambda s: s["doc_id"])
    want = lm.scorer.loglikelihood_rolling_many([sp.encode(d) for d in documents])
    assert lm.scorer.prefix_id == sp.eos_id()
    assert len(sp.encode(documents[-1])) > 2 * MAX_LEN           # several windows
    got = []
    for s, doc in zip(samples, documents):
        (args, resp), = _requests(s)
        assert args == (doc,)
        got.append(float(resp[0]))
    assert got == pytest.approx(want, abs=1e-4)
    words = sum(len(d.split()) for d in documents)
    assert results["results"]["refinery_test_ppl"]["word_perplexity,none"] == pytest.approx(
        math.exp(-sum(want) / words), rel=1e-4)


def test_generate_until_is_the_greedy_kv_cache_sample_cut_at_the_stop_string(results, tasks_dir):
    _, stop, full = tasks_dir
    samples = sorted(results["samples"]["refinery_test_gen"], key=lambda s: s["doc_id"])
    got = [s["resps"][0][0] for s in samples]
    assert got == [f.split(stop)[0] for f in full]
    assert any(g and g != f for g, f in zip(got, full))         # the stop string cut one, after some text
    assert results["results"]["refinery_test_gen"]["exact_match,none"] == 1.0


def test_the_prefix_setting_decides_what_a_context_starts_with(net, sp, lm):
    """Default: the context after the EOS (what training saw), as the evaluate stage tokenizes its tasks;
    prefix_contexts=False: the context as lm-eval's HF backend encodes it with add_bos_token=False; an empty
    context is the prefix alone either way. A rolling document follows prefix_id."""
    bare = harness.RefineryLM(net, sp, sp.eos_id(), rows=4, prefix_contexts=False)
    context, choice = "Question: Which word comes after the river\nAnswer:", " music"
    ctx, cont = request_ids(sp, context, choice, sp.eos_id())
    assert lm.request_ids(context, choice) == (ctx, cont) and ctx[0] == sp.eos_id()
    assert bare.request_ids(context, choice) == (ctx[1:], cont)
    assert bare.request_ids("", choice) == lm.request_ids("", choice) == ([sp.eos_id()], sp.encode(choice))
    other = harness.RefineryLM(net, sp, sp.eos_id(), rows=4, prefix_id=sp.bos_id())
    assert other.request_ids(context, choice)[0][0] == sp.bos_id() and other.scorer.prefix_id == sp.bos_id()
    (with_eos, _), (without, _) = lm.scorer.loglikelihood([(ctx, cont), (ctx[1:], cont)])
    assert abs(with_eos - without) > 1e-3                 # the setting changes the number


def test_generation_options_are_read_as_lm_eval_reads_them():
    greedy = harness._generation_options({"until": "\n\n", "do_sample": False, "temperature": 0.7}, "t")
    assert greedy == {"until": ["\n\n"], "max_gen_toks": harness.DEFAULT_MAX_GEN_TOKS, "temperature": 0.0,
                      "top_k": 0}
    sampled = harness._generation_options({"temperature": 0.5, "top_k": 4, "max_gen_toks": 3}, "t")
    assert sampled == {"until": [], "max_gen_toks": 3, "temperature": 0.5, "top_k": 4}
    assert harness._generation_options({"do_sample": True}, "t")["temperature"] == 1.0


def test_the_cli_runs_a_task_yaml_path_on_committed_outputs(tmp_path, net, sp, lm, tasks_dir):
    """Committed train, tokenizer and shard outputs as the stages lay them out, a task given by its YAML
    path, and the JSON the CLI writes: the same numbers as the in-process run."""
    train = tmp_path / "train" / "k1"
    attempt = train / "attempt-1"
    ckpt = checkpoint.Checkpointer(str(attempt / "checkpoint"), keep=1, every=1, async_save=False)
    ckpt.save(1, {"params": nnx.state(net, nnx.Param)})
    ckpt.close()
    storage.write_json(str(attempt / "summary.json"),
                       {"model": dataclasses.asdict(net.config), "seq_len": MAX_LEN})
    storage.write_json(str(train / "_SUCCESS.json"),
                       {"attempt": "attempt-1", "files": storage.sizes(str(attempt))})
    tokenizer, shard = tmp_path / "tokenizer", tmp_path / "shard"
    storage.write_bytes(str(tokenizer / "tokenizer.model"), sp.serialized_model_proto())
    storage.write_json(str(shard / "manifest.json"), {"eos_id": sp.eos_id()})
    out = tmp_path / "results.json"
    assert harness.main(["--train", str(train), "--tokenizer", str(tokenizer), "--shard", str(shard),
                         "--tasks", str(tasks_dir[0] / "refinery_test_ppl.yaml"), "--limit", "2",
                         "--output", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["n-samples"]["refinery_test_ppl"] == {"original": 3, "effective": 2}
    got = written["results"]["refinery_test_ppl"]
    in_process = harness.run_tasks(lm, ["refinery_test_ppl"],
                                   include_path=str(tasks_dir[0]), limit=2, bootstrap_iters=0)
    assert got["word_perplexity,none"] == pytest.approx(
        in_process["results"]["refinery_test_ppl"]["word_perplexity,none"], rel=1e-5)


def test_without_lm_eval_the_cli_says_how_to_install_it():
    block = "import runpy, sys; sys.modules['lm_eval'] = None; "
    main = subprocess.run([sys.executable, "-c", block + "runpy.run_module('stages.evaluate.harness', "
                           "run_name='__main__')"], cwd=REPO, capture_output=True, text=True)
    assert main.returncode == 1 and main.stderr.strip() == harness.INSTALL_HINT, main.stderr
    imported = subprocess.run([sys.executable, "-c", block + "import stages.evaluate.harness"], cwd=REPO,
                              capture_output=True, text=True)
    assert imported.returncode == 1 and imported.stderr.strip().endswith(harness.INSTALL_HINT)
