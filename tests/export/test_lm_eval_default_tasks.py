"""The README's lm-eval command (`lm_eval --model hf --model_args pretrained=<export>,max_length=2048`, here
`lm_eval.simple_evaluate` with the same model and model_args) on the four default tasks against an export:
every request's log-likelihood equals the evaluate stage's (its scorer, `measure.task_scorer`, on the same
model restored from the checkpoint, `score.logliks`), answers longer than the model's trained length
included, PIQA's piqa-1376 (the item whose 311-token answers crashed lm-eval on the default run's export)
among them. Without max_length lm-eval takes the export's max_position_embeddings and refuses that item.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q tests/export/test_lm_eval_default_tasks.py

The tasks are local task files holding real items of HellaSwag, ARC-Easy, ARC-Challenge and PIQA as Refinery
renders them (`yardstick_data/tasks.py`: context, choices with their leading space, gold), offline. The model
is random and tiny, with a 320-piece tokenizer, so real answers run to hundreds of tokens.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")       # read before `datasets` is first imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
import sentencepiece as spm  # noqa: E402
from flax import nnx  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from stages import evaluate  # noqa: E402
from stages.evaluate import measure  # noqa: E402
from stages.train import model  # noqa: E402
from stages.train.model_config import ModelConfig  # noqa: E402
from stages.yardstick_data import tasks  # noqa: E402
from stages.yardsticks import score, tokenized  # noqa: E402
from tests.export import helpers  # noqa: E402

LENGTH = 64                       # the trained sequence length: the export's max_position_embeddings
CFG = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_dim=64,
                  max_seq_len=LENGTH, dtype="float32", init_std=0.3)
ITEMS = 2                         # per task, besides the long one
LONG = "piqa-1376"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(export directory, train directory, sentencepiece processor) of a random tiny model."""
    tmp = tmp_path_factory.mktemp("lm_eval_default_tasks")
    sp_model = helpers.tokenizer_model()
    params = nnx.split(model.Transformer(CFG, rngs=nnx.Rngs(8)), nnx.Param)[1]
    out = helpers.export_model(tmp, CFG, params, sp_model)
    return out, tmp / "train", spm.SentencePieceProcessor(model_proto=sp_model)


@pytest.fixture(scope="module")
def items():
    """{task: text items}: a few of each default task and PIQA's longest-answer item."""
    found = tasks.load(evaluate_tasks(), max_items=ITEMS)
    found["piqa"] = [*found["piqa"], *(i for i in tasks.load(["piqa"])["piqa"] if i.id == LONG)]
    return found


def evaluate_tasks() -> list[str]:
    from stages import yardsticks

    return list(yardsticks.Config().tasks)


@pytest.fixture(scope="module")
def include_path(tmp_path_factory, items):
    """One local task per default task, `refinery_<task>`, whose documents are Refinery's items: the context
    as it is, the choices with their own leading space (so no target delimiter), the gold index."""
    root = tmp_path_factory.mktemp("default_task_files")
    for name, group in items.items():
        rows = [{"context": i.context, "choices": list(i.choices), "gold": i.gold} for i in group]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        body = {"task": f"refinery_{name}", "dataset_path": "json", "test_split": "test",
                "dataset_kwargs": {"data_files": {"test": str(root / f"{name}.jsonl")},
                                   "cache_dir": str(root / "hf_cache")},
                "output_type": "multiple_choice", "doc_to_text": "context", "doc_to_choice": "choices",
                "doc_to_target": "gold", "target_delimiter": "",
                "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
        (root / f"refinery_{name}.yaml").write_text(json.dumps(body, indent=1))      # JSON is YAML
    return str(root)


def readme_model_args(export_dir) -> str:
    """The README's command's model_args, max_length being evaluate.Config's default."""
    return f"pretrained={export_dir},max_length={evaluate.Config().max_length}"


def lm_eval_hf(model_args: str, names, include_path) -> dict:
    """{task: [per document: [((context, continuation), log-likelihood)]]} of lm-eval's HF backend."""
    names = [f"refinery_{n}" for n in names]
    results = lm_eval.simple_evaluate(model="hf", model_args=model_args, tasks=names,
                                      task_manager=TaskManager(include_path=include_path), device="cpu",
                                      log_samples=True, bootstrap_iters=0)
    out = {}
    for task, samples in results["samples"].items():
        out[task.removeprefix("refinery_")] = [
            [(tuple(a), float(r[0][0])) for a, r in zip(s["arguments"], s["resps"])]
            for s in sorted(samples, key=lambda s: s["doc_id"])]
    return out


def refinery(train_dir, sp, items) -> dict:
    """{task: [per item: each choice's log-likelihood]} as the evaluate stage scores them."""
    train = helpers.committed("train", train_dir)
    net, _, _ = measure.restore(train, json.loads((train_dir / "summary.json").read_text()))
    eos = sp.eos_id()
    scorer = measure.task_scorer(evaluate.Config(), net, eos, LENGTH)
    by_task = {name: tokenized.tokenize(group, sp, eos) for name, group in items.items()}
    assert not measure.too_long(by_task, evaluate.Config().max_length)
    found, cut = score.logliks(scorer, by_task)
    assert cut == 0
    return {name: [list(map(float, choices)) for choices in per_item] for name, per_item in found.items()}


def test_the_readme_command_gives_refinerys_numbers_on_every_item_of_the_default_tasks(exported, items,
                                                                                      include_path):
    out, train_dir, sp = exported
    theirs = lm_eval_hf(readme_model_args(out), items, include_path)
    ours = refinery(train_dir, sp, items)
    longest, deltas = 0, []
    for name, group in items.items():
        assert len(theirs[name]) == len(group)
        for item, their_doc, our_choices in zip(group, theirs[name], ours[name]):
            assert [args for args, _ in their_doc] == list(item.requests())       # the same text requests
            deltas += [(abs(t - o), abs(o)) for (_, t), o in zip(their_doc, our_choices)]
            longest = max([longest] + [len(tokenized.request_ids(sp, c, x, sp.eos_id())[1])
                                       for c, x in item.requests()])
    worst = max(d / max(1.0, size) for d, size in deltas)
    print(f"{len(deltas)} requests over {len(items)} tasks, answers up to {longest} tokens (trained length "
          f"{LENGTH}): max |delta| {max(d for d, _ in deltas):.2e}, relative {worst:.1e}")
    assert sorted(theirs) == sorted(evaluate_tasks())
    assert longest > 4 * LENGTH                  # piqa-1376: past every position the model trained on
    # 1e-4, or 1e-6 of a long answer's sum (hundreds of float32 log-probs, summed in float32 by lm-eval)
    assert all(d <= max(1e-4, 1e-6 * size) for d, size in deltas)


def test_without_max_length_lm_eval_refuses_the_long_answer(exported, items, include_path):
    """What the README's command was: lm-eval's max_length is then the export's max_position_embeddings,
    and its HF backend asserts that piqa-1376's answer fits in it."""
    out, _, _ = exported
    with pytest.raises(AssertionError) as refused:
        lm_eval_hf(f"pretrained={out}", ["piqa"], include_path)
    assert "len(continuation_enc) <= self.max_length" in str(refused.traceback[-1].statement)
