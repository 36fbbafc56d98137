"""The model card names every stage's key, each after the stages it read (download found through clean), and
is a function of the export's key: two exports of one key, from inputs in other directories (another machine,
another cache root) whose runs had other throughputs and wall times, are the same bytes, every file.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q -p no:cacheprovider tests/export/test_card.py
"""

import dataclasses
import json

from stages import export
from stages.export import card
from stages.io.committed import Committed
from stages.train.model_config import ModelConfig
from tests.export import helpers

TINY = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64,
                   dtype="float32", init_std=0.1)
MOE = dataclasses.replace(TINY, n_experts=4, n_experts_per_token=2)


def _c(stage, upstream):
    manifest = {"upstream": {u: f"{u}-key" for u in upstream}}
    return Committed(stage, f"{stage}-key", f"/c/{stage}", {}, manifest)


def test_every_stage_key_in_dag_order():
    inputs = {"train": _c("train", ["shard", "yardsticks", "tokenizer"]),
              "tokenizer": _c("tokenizer", ["clean"]),
              "shard": _c("shard", ["clean", "tokenizer"]), "clean": _c("clean", ["download"]),
              "evaluate": _c("evaluate", ["train", "shard", "tokenizer", "yardsticks", "clean"])}
    keys = card.stage_keys(inputs)
    assert set(keys) == {"download", "clean", "tokenizer", "shard", "yardsticks", "train", "evaluate"}
    order = list(keys)
    for stage, committed in inputs.items():
        assert all(order.index(u) < order.index(stage) for u in committed.manifest["upstream"])
    assert keys["download"] == "download-key"


def _run_of_one_key(root, mcfg, params, sp_model, tokens_per_s):
    """The export's inputs under `root` as one run of a key leaves them: train (its summary with this run's
    throughput and wall time), tokenizer, shard, and evaluate (eval.json, report.md); the export into
    root/export. Every manifest names the same upstream keys whatever the root."""
    if params is not None:
        inputs = helpers.write_inputs(root, mcfg, params, sp_model)
    else:                           # an MoE: not converted, so no checkpoint, tokenizer or shard is read
        for stage in ("train", "tokenizer", "shard"):
            (root / stage).mkdir(parents=True)
        inputs = {stage: helpers.committed(stage, root / stage) for stage in ("tokenizer", "shard")}
    summary = {"model": dataclasses.asdict(mcfg), "params": 123_456, "steps": 10, "seq_len": 64,
               "final_loss": 3.2109, "eval_loss": 3.3012, "tokens_per_s": tokens_per_s,
               "wall_s": 1000.0 / tokens_per_s}
    (root / "train" / "summary.json").write_text(json.dumps(summary))
    upstream = {"shard": "shard-key", "tokenizer": "tokenizer-key", "yardsticks": "yardsticks-key"}
    inputs["train"] = helpers.committed("train", root / "train", {"upstream": upstream})
    (root / "evaluate").mkdir()
    (root / "evaluate" / "eval.json").write_text(json.dumps({
        "loss": 3.3, "unigram_entropy": 5.1, "perplexity": 27.1, "bits_per_byte": 1.4567,
        "tokens_per_s": tokens_per_s * 3,
        "reference_bpb": {"aesop": {"bpb": 1.5, "low": 1.4, "high": 1.6, "docs": 3, "bytes": 100}},
        "tasks": {"piqa": {"items": 10, "random_baseline": 0.5,
                           **{m: {"value": 0.6, "low": 0.5, "high": 0.7}
                              for m in ("acc", "acc_norm", "centered", "centered_norm",
                                        "acc_norm_lm_eval")}}},
        "aggregate": {"metric": "centered", "tasks": ["piqa"], "value": 0.2, "low": 0.0, "high": 0.4},
        "scoring": {"max_length": 2048}}))
    (root / "evaluate" / "report.md").write_text(f"# report\n{tokens_per_s} tokens/s\n")
    inputs["evaluate"] = helpers.committed("evaluate", root / "evaluate",
                                           {"upstream": {"train": "train-key"}})
    out = root / "export"
    export.run(export.Config(), inputs, str(out), str(root / "work"))
    return out


def _files(directory):
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _assert_same_bytes_and_no_machine_facts(first, second, roots):
    a, b = _files(first), _files(second)
    assert sorted(a) == sorted(b) and "README.md" in a
    for name in a:
        assert a[name] == b[name], name
        for root in roots:
            assert str(root).encode() not in a[name], (name, root)
    text = a["README.md"].decode()
    assert "tokens/s" not in text and "report.md" not in text
    assert "final loss 3.211" in text and "1.457 bits/byte" in text     # the figures the key determines
    assert "lm-eval's acc_norm 0.600 [0.500, 0.700]" in text          # beside OLMES' per-character one


def test_two_exports_of_one_key_are_the_same_bytes(tmp_path):
    from flax import nnx

    from stages.train import model

    sp_model = helpers.tokenizer_model()
    params = nnx.split(model.Transformer(TINY, rngs=nnx.Rngs(0)), nnx.Param)[1]
    roots = [tmp_path / "machine_a", tmp_path / "other_machine"]
    first = _run_of_one_key(roots[0], TINY, params, sp_model, tokens_per_s=4667.0)
    second = _run_of_one_key(roots[1], TINY, params, sp_model, tokens_per_s=9312.5)
    _assert_same_bytes_and_no_machine_facts(first, second, roots)
    text = (first / "README.md").read_text()
    assert "## What a context starts with" in text and "`</s>` (id 2)" in text
    # the lm-eval command that reproduces the evaluation carries the max_length it cut requests by
    assert "`lm_eval --model hf --model_args pretrained=<this directory>,max_length=2048` for " in text


def test_two_not_exported_moe_cards_of_one_key_are_the_same_bytes(tmp_path):
    roots = [tmp_path / "machine_a", tmp_path / "other_machine"]
    first = _run_of_one_key(roots[0], MOE, None, None, tokens_per_s=100.0)
    second = _run_of_one_key(roots[1], MOE, None, None, tokens_per_s=250.0)
    assert export.NOT_EXPORTED in _files(first)
    _assert_same_bytes_and_no_machine_facts(first, second, roots)
    assert "train/train-key/" in (first / export.NOT_EXPORTED).read_text()
