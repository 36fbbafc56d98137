"""The model card names every stage's key, each once and after the stages it read: the export's inputs and
everything before them, found by following the manifests' upstream keys through the cache (download is three
reads from the export since cleaning became two nodes, a source's stages are named for it, the reference
model's run as the plan names it); and it is a function of the export's key: two exports of one key, from
inputs in other directories (another machine, another cache root) whose runs had other throughputs and wall
times, are the same bytes, every file.

    JAX_PLATFORMS=cpu .venv/bin/python -m pytest -q -p no:cacheprovider tests/export/test_card.py
"""

import dataclasses
import json
import shutil

import pytest

from pipeline import cache, config, dag
from stages import export
from stages.export import card
from stages.io import storage
from stages.io.committed import Committed
from stages.train.model_config import ModelConfig
from tests.conftest import REPO
from tests.export import helpers
from tests.pipeline.test_reference_model import BY_BPB

TINY = ModelConfig(vocab_size=320, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64,
                   dtype="float32", init_std=0.1)
MOE = dataclasses.replace(TINY, n_experts=4, n_experts_per_token=2)
MIXTURE = f"{REPO}/gin/mixtures/prose_code.gin"
# the mixture's code source selected by a reference model's bits per byte (a one-source reference run)
MIXTURE_BY_BPB = ["code/clean.Config.keep_top = @clean.KeepTop()", "code/clean.KeepTop.score = 'bpb'",
                  "code/clean.KeepTop.keep_fraction = 0.5", "reference/train.Config.mixture = None"]


def _c(stage, upstream):
    manifest = {"upstream": {u: f"{u}-key" for u in upstream}}
    return Committed(dag.stage_of(stage), f"{stage}-key", f"/c/{stage}", {}, manifest)


def test_inputs_outside_a_cache_name_what_their_manifests_name():
    """Outputs made by hand (no cache around them): the inputs and what their manifests name, each once, each
    after the stages it read."""
    inputs = {"train": _c("train", ["shard", "yardsticks", "tokenizer"]),
              "tokenizer": _c("tokenizer", ["clean"]),
              "shard": _c("shard", ["clean", "tokenizer"]), "clean": _c("clean", ["score"]),
              "evaluate": _c("evaluate", ["train", "shard", "tokenizer", "yardsticks", "clean"])}
    keys = card.stage_keys(inputs)
    assert keys == {s: f"{s}-key" for s in ("score", "clean", "tokenizer", "shard", "yardsticks", "train",
                                            "evaluate")}
    order = list(keys)
    for stage, committed in inputs.items():
        assert all(order.index(u) < order.index(stage) for u in committed.manifest["upstream"])


def test_two_commits_of_one_stage_under_one_name_are_both_listed():
    """No run of today's DAG reads one stage under one name with two keys; were one to, neither key is
    lost: the second is named with its key."""
    inputs = {"a": Committed("a", "a-key", "/c/a", {}, {"upstream": {"b": "b-one"}}),
              "c": Committed("c", "c-key", "/c/c", {}, {"upstream": {"b": "b-two"}})}
    keys = card.stage_keys(inputs)
    assert sorted(keys.values()) == ["a-key", "b-one", "b-two", "c-key"]
    other = {"b-one": "b-two", "b-two": "b-one"}[keys["b"]]
    assert keys[f"b ({other})"] == other


def _stand_in(cfg, upstream, out_dir, work_dir=None):
    with open(f"{out_dir}/out.txt", "w") as f:
        f.write("a stand-in for the stage")


def _committed_plan(root, gin, params):
    """The plan of `gin` + `params` with every node committed under its real key in a cache under `root` by a
    stand-in for its stage (the real ones take minutes): the manifests name what each read, as a run's do.
    Returns (plan, {node: Committed})."""
    plan = config.load([gin], [*params, f'pipeline.Settings.cache_root = "{root}"'])
    done = {}
    for node, sp in plan.stages.items():
        done[node] = cache.run_stage(cache_root=plan.cache_root, stage=sp.stage, key=sp.key, config=sp.config,
                                     upstream={sp.input_names.get(u, u): done[u] for u in sp.upstream},
                                     fn=_stand_in)
    return plan, done


def _export_inputs(plan, done):
    sp = plan.stages["export"]
    return {sp.input_names.get(u, u): done[u] for u in sp.upstream}


@pytest.mark.parametrize("gin, params", [
    (f"{REPO}/gin/tiny.gin", []), (MIXTURE, []), (f"{REPO}/gin/tiny.gin", BY_BPB), (MIXTURE, MIXTURE_BY_BPB)],
    ids=["one_source", "mixture", "reference_run", "mixture_and_reference_run"])
def test_the_card_names_every_stage_the_export_was_made_from_as_the_plan_does(tmp_path, gin, params):
    """Every node the export needs, download's, each source's and the reference model's run's included, by
    the plan's name and key; a commit two nodes share (the reference run's classifier is the run's own) once,
    by one of their names or its stage's; each after the stages it read."""
    plan, done = _committed_plan(tmp_path / "cache", gin, params)
    keys = card.stage_keys(_export_inputs(plan, done))
    want = {node: plan.stages[node].key for node in plan.tree.closure("export") if node != "export"}
    assert sorted(keys.values()) == sorted(set(want.values()))            # every commit, each once
    nodes_of = {key: [n for n, k in want.items() if k == key] for key in want.values()}
    for name, key in keys.items():
        if len(nodes_of[key]) == 1:
            assert name == nodes_of[key][0], (name, nodes_of[key])
        else:
            assert name in nodes_of[key] + [dag.stage_of(nodes_of[key][0])], (name, nodes_of[key])
    if params:
        assert keys["train[reference]"] == want["train[reference]"] != keys["train"]
    if gin == MIXTURE:
        assert "download[code]" in keys and "classifier" in keys
    else:
        assert "download" in keys
    name_of = {key: name for name, key in keys.items()}
    order = list(keys.values())
    for node, key in want.items():
        for read in plan.tree.upstream(node):
            assert order.index(want[read]) < order.index(key), (name_of[want[read]], name_of[key])


def test_a_commit_no_longer_in_the_cache_is_named_but_not_what_it_read(tmp_path):
    plan, done = _committed_plan(tmp_path / "cache", f"{REPO}/gin/tiny.gin", [])
    shutil.rmtree(storage.parent(done["score"].path))          # score's key directory, manifest and all
    keys = card.stage_keys(_export_inputs(plan, done))
    assert keys["score"] == plan.stages["score"].key and keys["clean"] == plan.stages["clean"].key
    assert "download" not in keys and "classifier" not in keys


def test_the_card_lists_download_in_its_table(tmp_path):
    """model_card's "The run" table: a row per stage, download's among them (three reads from the export)."""
    plan, done = _committed_plan(tmp_path / "cache", f"{REPO}/gin/tiny.gin", [])
    text = card.model_card("refinery-test", _export_inputs(plan, done), TINY)
    for node in ("download", "classifier", "score", "clean", "tokenizer", "shard", "yardsticks", "train",
                 "evaluate"):
        assert f"| {node} | `{plan.stages[node].key}` |" in text, node


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
