"""Multi-head latent attention exported as transformers' DeepseekV3ForCausalLM, judged by transformers' own
modeling code as the other exports are: next-token logits on a 600-token prompt in float32 within 1e-4 of the
JAX model's (dense, without a query rank, and with DeepSeek-V3's MoE block), greedy generation token for token
(ours decodes from the latent cache), and a round trip through init_from that gives back every tensor;
settings DeepSeek-V3 cannot express fail in one line.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/export/test_mla_export.py
"""

import dataclasses
import json
import re

import jax
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402

from stages.io import safetensors  # noqa: E402
from stages.train import hf, model  # noqa: E402
from stages.train.model_config import ModelConfig  # noqa: E402
from tests.export import helpers  # noqa: E402

PROMPT = 600
DENSE = ModelConfig(vocab_size=320, d_model=64, n_layers=3, n_heads=4, n_kv_heads=4, mlp_dim=128,
                    max_seq_len=1024, dtype="float32", init_std=0.1, attention_kind="mla", q_lora_rank=48,
                    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
# DeepSeek-V3's block, tiny: sigmoid routing with its bias, top-2 of the best 2 of 4 groups, scaled 2.5, one
# shared expert, a dense first layer; tied embeddings
MOE = dataclasses.replace(DENSE, n_experts=8, n_experts_per_token=2, moe_mlp_dim=48, router_score="sigmoid",
                          router_norm_topk=True, router_scale=2.5, router_groups=4, router_topk_groups=2,
                          n_shared_experts=1, n_dense_layers=1, moe_bias_update_rate=1e-3,
                          tie_embeddings=True)
VARIANTS = {"dense": DENSE, "no_query_rank": dataclasses.replace(DENSE, q_lora_rank=0, rope_theta=500.0),
            "moe": MOE}


@pytest.fixture(scope="module")
def sp_model():
    return helpers.tokenizer_model()


def _jax_model(cfg, seed=0):
    """A random model; the latent norms' scales and a router's selection bias set away from their initial
    ones and zero, so that a transposed or dropped tensor shows."""
    net = model.Transformer(cfg, rngs=nnx.Rngs(seed))
    params = nnx.split(net, nnx.Param)[1]
    key = jax.random.key(seed + 7)
    for stack in ("layers", "moe_layers"):
        if stack not in params:
            continue
        for name in ("q_norm", "kv_norm", "attn_norm"):
            if name in params[stack]:
                key, sub = jax.random.split(key)
                p = params[stack][name]
                p[...] = 1.0 + 0.3 * jax.random.normal(sub, p[...].shape)
        if stack == "moe_layers":
            bias = params[stack]["router_bias"]
            bias[...] = 0.3 * jax.random.normal(key, bias[...].shape)
    return nnx.merge(nnx.graphdef(net), params), params


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_on_a_long_prompt(tmp_path, sp_model, name):
    cfg = VARIANTS[name]
    net, params = _jax_model(cfg)
    out = helpers.export_model(tmp_path, cfg, params, sp_model)
    theirs_model = helpers.transformers_logits_match(net, out, cfg.vocab_size, PROMPT, name)
    assert type(theirs_model).__name__ == hf.DEEPSEEK_V3 == "DeepseekV3ForCausalLM"
    layers = theirs_model.model.layers
    assert [type(layer.mlp).__name__ for layer in layers] == (
        ["DeepseekV3MLP"] * 3 if name != "moe" else ["DeepseekV3MLP", "DeepseekV3MoE", "DeepseekV3MoE"])


def test_greedy_generation_from_the_latent_cache_matches_token_for_token(tmp_path, sp_model):
    cfg = dataclasses.replace(MOE, tie_embeddings=False)    # a random tied model repeats its input
    net, params = _jax_model(cfg, seed=3)
    ours, theirs = helpers.greedy_both(net, helpers.export_model(tmp_path, cfg, params, sp_model))
    assert len(set(ours)) > 1
    assert ours == theirs


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_files_round_trip_through_init_from_to_identical_tensors(tmp_path, sp_model, name):
    cfg = VARIANTS[name]
    _, params = _jax_model(cfg)
    first = helpers.export_model(tmp_path / "a", cfg, params, sp_model)
    config = json.loads((first / "config.json").read_text())
    assert config["rope_interleave"] is False and config["q_lora_rank"] == 48
    assert config["first_k_dense_replace"] == (3 if name == "dense" else 1)
    with safetensors.Reader(str(first / "model.safetensors")) as f:
        assert f.array("model.layers.0.self_attn.kv_b_proj.weight").shape == (4 * (16 + 12), 32)
        assert f.array("model.layers.0.self_attn.kv_a_proj_with_mqa.weight").shape == (32 + 8, 64)
    helpers.reexports_identically(first, cfg, params, sp_model, hf.MLA_EXPRESSED + hf.MOE_EXPRESSED)


def test_the_card_names_the_attention(tmp_path, sp_model):
    _, params = _jax_model(DENSE)
    card = (helpers.export_model(tmp_path, DENSE, params, sp_model) / "README.md").read_text()
    assert "DeepseekV3ForCausalLM" in card and "multi-head latent attention (query rank 48" in card


@pytest.mark.parametrize("change, message", [
    ({"router_score": "softmax", "router_groups": 1, "router_topk_groups": 1},
     r"router_score='softmax': transformers' DeepseekV3ForCausalLM \(multi-head latent attention\) routes "
     r"by sigmoid scores"),
    ({"n_shared_experts": 0}, r"n_shared_experts=0: transformers' DeepseekV3ForCausalLM \(sigmoid routing\)"),
])
def test_what_deepseek_v3_cannot_express_is_refused_naming_it(change, message):
    cfg = dataclasses.replace(MOE, **change)
    assert re.search(message, hf.problem(cfg)), hf.problem(cfg)
    assert hf.problem(MOE) == hf.problem(DENSE) == ""


@pytest.mark.parametrize("change, message", [
    ({"rope_interleave": True}, "rope_interleave=True; Refinery's decoder has rope_interleave=False"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                       "mscale": 1.0, "mscale_all_dim": 1.0}},
     "mscale_all_dim=1.0 scales DeepSeek-V3's softmax"),
])
def test_a_deepseek_config_our_decoder_computes_differently_is_not_loaded(change, message):
    config = hf.config_json(DENSE, bos_id=1, eos_id=2, dtype="float32") | change
    with pytest.raises(ValueError, match=re.escape(message)):
        hf.model_fields(config)
