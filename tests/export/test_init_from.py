"""Starting from a Hugging Face checkpoint (train.Config.init_from): a random LlamaForCausalLM saved by
transformers -> init_from -> export gives back identical tensors; training two steps from it runs; the
model config comes from config.json (a conflicting gin binding names both values); the tokenizer must be
the checkpoint's; the cache key follows the checkpoint's files."""

import dataclasses
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402

from pipeline import cache, config  # noqa: E402
from pipeline.gin_errors import ConfigError  # noqa: E402
from stages import train  # noqa: E402
from stages.io import safetensors, storage  # noqa: E402
from stages.train import init_from, model  # noqa: E402
from stages.train.model_config import ModelConfig  # noqa: E402
from stages.train.optimizer_config import OptimizerConfig  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.export import helpers  # noqa: E402
from tests.train import test_loop  # noqa: E402

TINY_GIN = os.path.join(REPO, "gin", "tiny.gin")


def _hf_checkpoint(directory, sp_model: bytes, **overrides):
    """A random LlamaForCausalLM saved as transformers saves it, with the run's tokenizer beside it."""
    settings = {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 64}}
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings | overrides)).eval()
    hf.save_pretrained(directory, safe_serialization=True)
    (directory / "tokenizer.model").write_bytes(sp_model)
    return hf


@pytest.fixture(scope="module")
def sp_model():
    return helpers.tokenizer_model()


def _loaded(source, dtype="float32"):
    mcfg = ModelConfig(**init_from.model_fields(str(source)), dtype=dtype)
    params = nnx.split(model.Transformer(mcfg, rngs=nnx.Rngs(1)), nnx.Param)[1]     # random, replaced
    return mcfg, init_from.load_params(str(source), mcfg, params)


@pytest.mark.parametrize("tied", [False, True])
def test_a_transformers_checkpoint_round_trips_through_init_from_and_export(tmp_path, sp_model, tied):
    hf = _hf_checkpoint(tmp_path / "hf", sp_model, tie_word_embeddings=tied)
    mcfg, params = _loaded(tmp_path / "hf")
    assert (mcfg.rope_scaling, mcfg.rope_factor, mcfg.n_kv_heads) == ("llama3", 8.0, 2)
    assert mcfg.tie_embeddings == tied
    out = helpers.export_model(tmp_path / "run", mcfg, params, sp_model)
    theirs = {k: v.numpy() for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")}
    with safetensors.Reader(str(out / "model.safetensors")) as f:
        assert f.names() == sorted(theirs)
        for name, value in theirs.items():
            assert np.array_equal(f.array(name), value), name
    # and the loaded weights compute transformers' logits
    ids = np.random.default_rng(0).integers(3, 320, size=(1, 300))
    with torch.no_grad():
        expected = hf(torch.tensor(ids)).logits.numpy()
    net = nnx.merge(nnx.graphdef(model.Transformer(mcfg, rngs=nnx.Rngs(0))), params)
    hidden, _ = net(ids)
    assert np.abs(np.asarray(net.logits(hidden)) - expected).max() <= 1e-4


def test_what_transformers_saves_sharded_in_bfloat16_passes_the_header_checks_and_loads(tmp_path, sp_model):
    """The checks before work (init_from.problem) accept what save_pretrained writes: shards under an index,
    bfloat16, its metadata; the key names exactly those files; the weights load from them."""
    hf = _hf_checkpoint(tmp_path / "hf", sp_model).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True, max_shard_size="100KB")
    shards = sorted(p.name for p in (tmp_path / "hf").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "hf" / safetensors.INDEX).exists()
    mcfg = ModelConfig(**init_from.model_fields(str(tmp_path / "hf")))
    assert init_from.problem(str(tmp_path / "hf"), mcfg) == ""
    read = {"config.json", safetensors.INDEX, "tokenizer.model", *shards}
    assert set(init_from.fingerprint(str(tmp_path / "hf"))) == read
    _, params = _loaded(tmp_path / "hf")
    expected = hf.state_dict()["model.norm.weight"].float().numpy()
    assert np.array_equal(np.asarray(params["final_norm"][...]), expected)


def test_training_two_steps_from_a_checkpoint_runs(tmp_path, sp_model, shard):
    # weights 25 times larger than a fresh init: a loss far above ln(320) shows where training started
    _hf_checkpoint(tmp_path / "hf", sp_model, initializer_range=0.5)
    mcfg = ModelConfig(**init_from.model_fields(str(tmp_path / "hf")), dtype="float32", attention_impl="xla")
    cfg = dataclasses.replace(test_loop.CONFIG, model=mcfg, init_from=str(tmp_path / "hf"), steps=2,
                              seq_len=32, optimizer=OptimizerConfig(learning_rate=1e-3, warmup_steps=1),
                              eval_every=0, checkpoint_every=2)
    tokenizer = helpers.committed("tokenizer", tmp_path / "hf")
    out = cache.run_stage(cache_root=str(tmp_path / "cache"), stage="train", key="k", config=cfg,
                          upstream={"shard": shard, "tokenizer": tokenizer}, fn=train.run)
    summary = storage.read_json(out.file("summary.json"))
    rows = [json.loads(line) for line in storage.read_text(out.file("metrics.jsonl")).splitlines()]
    assert summary["steps"] == 2 and summary["model"]["vocab_size"] == 320
    assert np.isfinite(rows[0]["loss"]) and rows[0]["loss"] > np.log(320) + 3


def test_a_different_tokenizer_is_refused_naming_the_fix(tmp_path, sp_model):
    _hf_checkpoint(tmp_path / "hf", sp_model)
    other = helpers.tokenizer_model(vocab_size=330)
    problem = init_from.tokenizer_problem(other, str(tmp_path / "hf"))
    assert "330 pieces" in problem and "320 pieces" in problem and "tokenizer.Config.pretrained" in problem
    assert init_from.tokenizer_problem(sp_model, str(tmp_path / "hf")) == ""


def test_the_model_config_comes_from_the_checkpoint_and_a_conflicting_binding_names_both(tmp_path, sp_model):
    # tiny.gin's model, but for rope_theta (which base.gin binds) and n_layers
    tiny = {"vocab_size": 4096, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 384, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    _hf_checkpoint(tmp_path / "hf", sp_model, **tiny)
    override = f'train.Config.init_from = "{tmp_path / "hf"}"'
    plan = config.load([TINY_GIN], [override])
    assert plan.stages["train"].config.model.n_layers == 4
    key = plan.stages["train"].key
    _hf_checkpoint(tmp_path / "hf2", sp_model, **tiny | {"num_hidden_layers": 3})
    conflict = r"train.ModelConfig.n_layers = 4 \(gin\) conflicts with 3 in .*config.json"
    with pytest.raises(ConfigError, match=conflict):
        config.load([TINY_GIN], [f'train.Config.init_from = "{tmp_path / "hf2"}"'])
    plan = config.load([TINY_GIN], [f'train.Config.init_from = "{tmp_path / "hf2"}"',
                                    "train.ModelConfig.n_layers = 3"])
    assert plan.stages["train"].config.model.n_layers == 3
    # the key follows the checkpoint's files
    weights = tmp_path / "hf" / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert config.load([TINY_GIN], [override]).stages["train"].key != key


shard = test_loop.shard
