"""lm-evaluation-harness's own HF backend (`lm_eval.models.huggingface.HFLM`, PyTorch on CPU) on the exported
model against Refinery's `harness.RefineryLM` on the same JAX parameters and the same local tasks (one
multiple-choice, one rolling log-likelihood): equal per-request log-likelihoods (1e-4) under the documented
prefix setting, and lm-eval's acc_norm equal to `task_metrics`' acc_norm_lm_eval on the same numbers.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q -p no:cacheprovider tests/export/test_lm_eval_hf.py

The setting (README "Use the model elsewhere", the export's model card): the export's tokenizer adds its
bos_token, the EOS that training put before every document, to every encoding. Then
- RefineryLM's default (every context and rolling document after the EOS) = HFLM as it is on loglikelihood
  tasks, and = HFLM(add_bos_token=False) on rolling ones (HFLM conditions a document on bos itself);
- RefineryLM(prefix_contexts=False) = HFLM(add_bos_token=False) on both.
Needs the `harness` and `hf` extras (`make test` installs both).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")       # read before `datasets` is first imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

import sentencepiece as spm  # noqa: E402
from flax import nnx  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from stages.evaluate import harness  # noqa: E402
from stages.train import model  # noqa: E402
from stages.train.model_config import ModelConfig  # noqa: E402
from stages.yardstick_data import tasks  # noqa: E402
from stages.yardsticks import task_metrics  # noqa: E402
from tests.export import helpers  # noqa: E402

LENGTH = 48                   # the scoring length both sides use: the long document spans several windows
CFG = ModelConfig(vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=LENGTH,
                  dtype="float32", init_std=0.3)
MC = [  # question, choices (lm-eval's doc_to_choice: no leading space), gold
    ("The quick brown fox", ["jumps over the lazy dog", "saves nine", "time"], 0),
    ("A stitch in time", ["saves nine", "jumps", "the lazy dog", "brown"], 1),
    ("Numbers and punctuation", ["(a), [b], {c}!", "0123456789", "quick"], 2),
    ("The lazy dog", ["jumps", "over", "fox"], 0),
    ("Which one saves nine", ["A stitch", "A stitch in time", "The fox"], 1),
    ("What jumps", ["fox", "The quick brown fox", "dog"], 2),
]
DOCS = ["The quick brown fox jumps.",
        "A stitch in time saves nine. " * 6,
        ("The quick brown fox jumps over the lazy dog. Numbers 0123456789 and punctuation: (a), [b], {c}! "
         * 4)]
MC_TASK, PPL_TASK = "refinery_hf_mc", "refinery_hf_ppl"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(export directory, the JAX model, its sentencepiece processor)."""
    sp_model = helpers.tokenizer_model()
    net = model.Transformer(CFG, rngs=nnx.Rngs(4))
    out = helpers.export_model(tmp_path_factory.mktemp("lm_eval_hf"), CFG, nnx.split(net, nnx.Param)[1],
                               sp_model)
    return out, net, spm.SentencePieceProcessor(model_proto=sp_model)


@pytest.fixture(scope="module")
def include_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_eval_hf_tasks")
    rows = {"mc": [{"question": q, "choices": c, "gold": g} for q, c, g in MC],
            "ppl": [{"text": t} for t in DOCS]}
    for name, items in rows.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))

    def dataset(name):
        return {"dataset_path": "json", "test_split": "test",
                "dataset_kwargs": {"data_files": {"test": str(root / f"{name}.jsonl")},
                                   "cache_dir": str(root / "hf_cache")}}

    yamls = {
        MC_TASK: {**dataset("mc"), "output_type": "multiple_choice", "doc_to_text": "Question: {{question}}\n"
                  "Answer:", "doc_to_choice": "choices", "doc_to_target": "gold",
                  "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                                  for m in ("acc", "acc_norm")]},
        PPL_TASK: {**dataset("ppl"), "output_type": "loglikelihood_rolling", "doc_to_text": "",
                   "doc_to_target": "{{text}}",
                   "metric_list": [{"metric": "word_perplexity", "higher_is_better": False,
                                    "aggregation": "weighted_perplexity"}]},
    }
    for name, body in yamls.items():               # JSON is YAML
        (root / f"{name}.yaml").write_text(json.dumps({"task": name, **body}, indent=1))
    return str(root)


def _run(lm, include_path):
    """{task: [per document: [(args, response)]]} of one lm-eval run of both tasks, and per-doc acc_norm."""
    results = harness.run_tasks(lm, [MC_TASK, PPL_TASK], include_path=include_path, log_samples=True,
                                bootstrap_iters=0)
    out = {}
    for task, samples in results["samples"].items():
        samples = sorted(samples, key=lambda s: s["doc_id"])
        out[task] = [[(tuple(a), r) for a, r in zip(s["arguments"], s["resps"])] for s in samples]
        out[task + "/acc_norm"] = [s.get("acc_norm") for s in samples]
    return out


def _hf(directory, **options):
    return HFLM(pretrained=str(directory), backend="causal", device="cpu", dtype="float32", batch_size=4,
                max_length=LENGTH, **options)


@pytest.fixture(scope="module")
def runs(exported, include_path):
    out, net, sp = exported
    eos = sp.eos_id()
    return {
        "refinery": _run(harness.RefineryLM(net, sp, eos, rows=4, length=LENGTH), include_path),
        "refinery_bare": _run(harness.RefineryLM(net, sp, eos, rows=4, length=LENGTH, prefix_contexts=False),
                              include_path),
        "hf": _run(_hf(out), include_path),
        "hf_no_bos": _run(_hf(out, add_bos_token=False), include_path),
    }


def _logliks(run, task):
    """Every request's (args, log-likelihood), in document order."""
    return [(args, float(resp[0][0] if task == MC_TASK else resp[0]))
            for doc in run[task] for args, resp in doc]


def _assert_equal(a, b, task):
    ours, theirs = _logliks(a, task), _logliks(b, task)
    assert [args for args, _ in ours] == [args for args, _ in theirs]      # the same requests
    delta = max(abs(x - y) for (_, x), (_, y) in zip(ours, theirs))
    print(f"{task}: {len(ours)} requests, max |delta| {delta:.2e}")
    assert delta <= 1e-4


def test_the_export_tokenizer_starts_every_encoding_with_trainings_document_prefix(exported):
    out, _, sp = exported
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["bos_token"] == sp.id_to_piece(sp.eos_id()) and config["add_bos_token"] is True
    assert json.loads((out / "config.json").read_text())["bos_token_id"] == sp.eos_id()
    assert json.loads((out / "generation_config.json").read_text())["bos_token_id"] == sp.eos_id()
    hf = _hf(out)
    assert hf.prefix_token_id == sp.eos_id()
    text = "A stitch in time"
    assert hf.tokenizer(text).input_ids == [sp.eos_id()] + sp.encode(text)
    card = (out / "README.md").read_text()
    assert f"a context must start with `{sp.id_to_piece(sp.eos_id())}`" in card
    assert "add_bos_token=False" in card


def test_multiple_choice_loglikelihoods_equal_under_the_default_setting(runs):
    _assert_equal(runs["refinery"], runs["hf"], MC_TASK)


def test_rolling_loglikelihoods_equal_with_add_bos_token_false(runs):
    _assert_equal(runs["refinery"], runs["hf_no_bos"], PPL_TASK)


def test_bare_contexts_equal_lm_eval_without_the_added_token_on_both_tasks(runs):
    _assert_equal(runs["refinery_bare"], runs["hf_no_bos"], MC_TASK)
    _assert_equal(runs["refinery_bare"], runs["hf_no_bos"], PPL_TASK)


def test_the_setting_matters(runs):
    """Not a test that cannot fail: the other pairings differ, so the equalities above check the setting."""
    for a, b, task in (("refinery", "hf_no_bos", MC_TASK), ("refinery", "hf", PPL_TASK)):
        ours, theirs = _logliks(runs[a], task), _logliks(runs[b], task)
        assert max(abs(x - y) for (_, x), (_, y) in zip(ours, theirs)) > 1e-2, (a, b, task)


def test_lm_evals_acc_norm_is_task_metrics_acc_norm_lm_eval(runs):
    """lm-eval's per-document acc_norm from its own run = `task_metrics`' acc_norm_lm_eval on the same
    log-likelihoods and the items as `tasks.py` renders them (each choice after one space)."""
    run = runs["hf"]
    items = [tasks.Item("t", f"t-{i}", f"Question: {q}\nAnswer:", tuple(" " + c for c in choices), gold)
             for i, (q, choices, gold) in enumerate(MC)]
    logliks = [np.array([float(r[0][0]) for _, r in doc]) for doc in run[MC_TASK]]
    assert [a for a, _ in _logliks(run, MC_TASK)] == [r for item in items for r in item.requests()]
    per_item = task_metrics._per_item(items, logliks)
    assert list(per_item["acc_norm_lm_eval"]) == run[MC_TASK + "/acc_norm"]
    # and on these items Refinery's own acc_norm (leading space counted) credits a different choice somewhere
    assert list(per_item["acc_norm"]) != run[MC_TASK + "/acc_norm"]
